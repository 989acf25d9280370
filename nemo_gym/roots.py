"""Where config files and server directories are looked up.

Relative paths resolve against an ordered list of roots: the command's ``--search-dir`` roots first, then
``NEMO_GYM_EXTRA_ROOTS`` from the user's environment, then the working directory, then the checkout that holds the
working directory, then the install root. The first match wins.

"The checkout that holds the working directory" is the parent of the nearest enclosing ``resources_servers``,
``responses_api_agents``, ``responses_api_models`` or ``environment_servers`` folder. A server process runs in its own folder, and so do its
tests, so a path written relative to a NeMo Gym checkout (``resources_servers/x/prompts/judge.yaml``) is found from
inside any of that checkout's server folders, as NeMo Gym finds it relative to its own checkout root.

``--search-dir`` never touches ``os.environ``: the CLI hands its roots to :func:`searching`, which holds them for the
command in a context variable (so they end with it, and other threads and tests see none of them). A child process
gets them explicitly, through :func:`child_env`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from nemo_gym.checkout import INSTALL_DIR, enclosing_checkout

EXTRA_ROOTS_ENV_VAR = "NEMO_GYM_EXTRA_ROOTS"

_command_roots: ContextVar[tuple[Path, ...]] = ContextVar("nemo_gym_search_dirs", default=())


@contextmanager
def searching(dirs: Sequence[Path]) -> Iterator[None]:
    """Search ``dirs`` first (``--search-dir``) until the block ends."""
    token = _command_roots.set(tuple(Path(d).resolve() for d in dirs))
    try:
        yield
    finally:
        _command_roots.reset(token)


def extra_roots() -> list[Path]:
    """The roots searched before cwd: the command's ``--search-dir`` ones, then ``NEMO_GYM_EXTRA_ROOTS``."""
    from_env = [Path(p) for p in os.environ.get(EXTRA_ROOTS_ENV_VAR, "").split(os.pathsep) if p]
    return [*_command_roots.get(), *from_env]


def child_env(env: dict[str, str]) -> dict[str, str]:
    """A copy of ``env`` for a child process whose ``NEMO_GYM_EXTRA_ROOTS`` names every extra root searched here."""
    extra = extra_roots()
    if not extra:
        return dict(env)
    return {**env, EXTRA_ROOTS_ENV_VAR: os.pathsep.join(str(p) for p in extra)}


def search_roots() -> list[Path]:
    """Extra roots, then cwd and the checkout holding it, then the install root; duplicates dropped, order kept."""
    cwd = Path.cwd().resolve()
    checkout = enclosing_checkout(cwd)
    roots: list[Path] = []
    for root in [*extra_roots(), cwd, *([checkout] if checkout else []), INSTALL_DIR]:
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


def resolve_for_reading(path: str | Path, *, validator: Callable[[Path], bool] | None = None) -> Path:
    """Where a file to be read lives: the first root (in :func:`search_roots` order) under which ``validator`` (by
    default: it exists) accepts ``path``; an absolute path as it is. When no root has it, the path under the first
    root, so that the error a caller then raises names the user's own location, not the install's."""
    path = Path(path)
    if path.is_absolute():
        return path
    accepts = validator or Path.exists
    roots = search_roots()
    return next((root / path for root in roots if accepts(root / path)), roots[0] / path)
