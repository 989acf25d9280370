"""The ``apptainer`` sandbox provider (the ``apptainer`` CLI); see ``provider.py``."""

from nemo_gym.sandbox.providers.apptainer.provider import (
    ApptainerCreateConfig,
    ApptainerCreateError,
    ApptainerCreateVerificationError,
    ApptainerExecConfig,
    ApptainerProbeConfig,
    ApptainerProvider,
)

__all__ = [
    "ApptainerCreateConfig",
    "ApptainerCreateError",
    "ApptainerCreateVerificationError",
    "ApptainerExecConfig",
    "ApptainerProbeConfig",
    "ApptainerProvider",
]
