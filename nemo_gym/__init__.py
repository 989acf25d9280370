"""NeMo Gym: reinforcement-learning environments for LLMs, served over the OpenAI Responses API."""

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    __version__ = version("nemo-gym")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

PARENT_DIR = Path(__file__).resolve().parent.parent
"""The directory that holds `nemo_gym/`, `resources_servers/`, `environments/`, …: the install root."""

CACHE_DIR = Path.cwd() / "cache"
RESULTS_DIR = Path.cwd() / "results"
"""Where ``cache_dir`` and ``results_dir`` point when a config names neither: ``cache/`` and ``results/`` under the
directory the command runs in (the config's own values, once composed, are absolute paths)."""

__all__ = ["CACHE_DIR", "PARENT_DIR", "RESULTS_DIR", "__version__"]
