"""Which directory is "the checkout": the folder that holds server folders, as NeMo Gym's code means by it.

NeMo Gym runs from its own checkout, so for it the install root and the checkout are one directory. Here they may
differ: our package is installed once, and a user's server folders live in a checkout of their own (a migrated NeMo
Gym one, say). Paths an environment writes relative to "the checkout" are read relative to the one that holds the
working directory (a server process and its tests run in their own folder).
"""

from __future__ import annotations

from pathlib import Path

INSTALL_DIR = Path(__file__).resolve().parent.parent
"""The directory that holds our `nemo_gym/`, `environments/` and our own server folders: the install root."""

SERVER_FOLDERS: tuple[str, ...] = (
    "responses_api_models",
    "resources_servers",
    "responses_api_agents",
    "environment_servers",
)
"""The folders a checkout holds its server implementations in, one per server kind (``environment_servers``: NeMo
Gym 0.7's fourth kind, a server that owns one episode end to end)."""


def enclosing_checkout(directory: Path) -> Path | None:
    """The parent of the nearest folder named after a server kind that holds ``directory`` (or is it), or None."""
    for folder in [directory, *directory.parents]:
        if folder.name in SERVER_FOLDERS:
            return folder.parent
    return None


def working_checkout(directory: Path) -> Path | None:
    """The checkout ``directory`` is in: the one enclosing it, or ``directory`` itself when it holds server folders."""
    if enclosing := enclosing_checkout(directory):
        return enclosing
    return directory if any((directory / name).is_dir() for name in SERVER_FOLDERS) else None
