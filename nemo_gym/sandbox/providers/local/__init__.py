"""The ``local`` sandbox provider (this machine, Landlock); see ``provider.py``."""

from nemo_gym.sandbox.providers.local.provider import DEFAULT_READ_PATHS, LocalProvider

__all__ = ["DEFAULT_READ_PATHS", "LocalProvider"]
