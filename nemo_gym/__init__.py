"""NeMo Gym: reinforcement-learning environments for LLMs, served over the OpenAI Responses API."""

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    __version__ = version("nemo-gym")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

PARENT_DIR = Path(__file__).resolve().parent.parent
"""The directory that holds `nemo_gym/`, `resources_servers/`, `environments/`, …: the install root."""

__all__ = ["PARENT_DIR", "__version__"]
