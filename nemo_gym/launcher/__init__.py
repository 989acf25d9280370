"""Launching servers: per-implementation venvs, one process per server instance, the head server, shutdown.

``running_servers(overrides)`` is the Python entry point; ``gym env start`` / ``gym env status`` are the CLI ones.
"""

from nemo_gym.launcher.runner import Launcher, ServerLaunchError, ServerProcess, running_servers
from nemo_gym.launcher.venvs import SHARED_VENV_ENV_VAR, VenvBuildError

__all__ = ["SHARED_VENV_ENV_VAR", "Launcher", "ServerLaunchError", "ServerProcess", "VenvBuildError", "running_servers"]
