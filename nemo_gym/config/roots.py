"""Where config files and server directories are looked up.

Relative paths resolve against an ordered list of roots: extra roots from ``--search-dir`` /
``NEMO_GYM_EXTRA_ROOTS`` first, then the working directory, then the install root. The first match wins.
"""

from __future__ import annotations

import os
from pathlib import Path

from nemo_gym import PARENT_DIR

EXTRA_ROOTS_ENV_VAR = "NEMO_GYM_EXTRA_ROOTS"


def search_roots() -> list[Path]:
    """Extra roots, then cwd, then the install root; duplicates dropped, order kept."""
    extra = [Path(p) for p in os.environ.get(EXTRA_ROOTS_ENV_VAR, "").split(os.pathsep) if p]
    roots: list[Path] = []
    for root in [*extra, Path.cwd(), PARENT_DIR]:
        resolved = root.resolve()
        if resolved not in roots:
            roots.append(resolved)
    return roots


def candidate_paths(path: str | Path, also_relative_to: Path | None = None) -> list[Path]:
    """Every location a (possibly relative) path may refer to, in lookup order."""
    path = Path(path).expanduser()
    if path.is_absolute():
        return [path]
    candidates = [root / path for root in search_roots()]
    if also_relative_to is not None:
        candidates.append(also_relative_to / path)
    return candidates


def find_path(path: str | Path, also_relative_to: Path | None = None) -> Path | None:
    """The first existing location of ``path``, or None."""
    for candidate in candidate_paths(path, also_relative_to):
        if candidate.exists():
            return candidate.resolve()
    return None
