"""NeMo Gym: reinforcement-learning environments for LLMs, served over the OpenAI Responses API."""

from pathlib import Path
from typing import Any

from nemo_gym.checkout import INSTALL_DIR, working_checkout

PARENT_DIR = working_checkout(Path.cwd().resolve()) or INSTALL_DIR
"""NeMo Gym's name for its checkout root, where code written for it finds `resources_servers/…` and the like: the
checkout that holds the working directory (see ``nemo_gym/checkout.py``), else the install root."""

CACHE_DIR = Path.cwd() / "cache"
RESULTS_DIR = Path.cwd() / "results"
"""Where ``cache_dir`` and ``results_dir`` point when a config names neither: ``cache/`` and ``results/`` under the
directory the command runs in (the config's own values, once composed, are absolute paths)."""


def __getattr__(name: str) -> Any:
    """``__version__`` is read from the installed metadata when first asked for: ``importlib.metadata`` takes
    ~25 ms to import, which every server and command would pay at start-up for a value few of them use.
    ``_resolve_under_cwd_or_install`` is :func:`nemo_gym.roots.resolve_for_reading`."""
    if name == "_resolve_under_cwd_or_install":  # NeMo Gym 0.7's name
        from nemo_gym.roots import resolve_for_reading

        return resolve_for_reading
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("nemo-gym")
    except PackageNotFoundError:  # running from a source tree that was never installed
        found = "0.0.0+unknown"
    globals()["__version__"] = found
    return found


__all__ = ["CACHE_DIR", "INSTALL_DIR", "PARENT_DIR", "RESULTS_DIR", "__version__"]
