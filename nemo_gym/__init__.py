"""NeMo Gym: reinforcement-learning environments for LLMs, served over the OpenAI Responses API."""

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from nemo_gym.checkout import working_checkout

try:
    __version__ = version("nemo-gym")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

INSTALL_DIR = Path(__file__).resolve().parent.parent
"""The directory that holds our `nemo_gym/`, `environments/` and our own server folders: the install root."""

PARENT_DIR = working_checkout(Path.cwd().resolve()) or INSTALL_DIR
"""NeMo Gym's name for its checkout root, where code written for it finds `resources_servers/…` and the like: the
checkout that holds the working directory (see ``nemo_gym/checkout.py``), else the install root."""

CACHE_DIR = Path.cwd() / "cache"
RESULTS_DIR = Path.cwd() / "results"
"""Where ``cache_dir`` and ``results_dir`` point when a config names neither: ``cache/`` and ``results/`` under the
directory the command runs in (the config's own values, once composed, are absolute paths)."""

__all__ = ["CACHE_DIR", "INSTALL_DIR", "PARENT_DIR", "RESULTS_DIR", "__version__"]
