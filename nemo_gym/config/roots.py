"""Where config files and server directories are looked up: :mod:`nemo_gym.roots` under the name most of its callers
(the config layer and above) import it by. It lives below them so that ``nemo_gym`` itself can offer NeMo Gym 0.7's
``_resolve_under_cwd_or_install``."""

from nemo_gym.roots import (
    EXTRA_ROOTS_ENV_VAR,
    candidate_paths,
    child_env,
    enclosing_checkout,
    extra_roots,
    find_path,
    resolve_for_reading,
    search_roots,
    searching,
)

__all__ = [
    "EXTRA_ROOTS_ENV_VAR",
    "candidate_paths",
    "child_env",
    "enclosing_checkout",
    "extra_roots",
    "find_path",
    "resolve_for_reading",
    "search_roots",
    "searching",
]
