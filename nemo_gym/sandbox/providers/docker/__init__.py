"""The ``docker`` sandbox provider (the ``docker`` CLI and a running daemon); see ``provider.py``."""

from nemo_gym.sandbox.providers.docker.provider import (
    DockerCreateConfig,
    DockerCreateError,
    DockerCreateVerificationError,
    DockerExecConfig,
    DockerProbeConfig,
    DockerProvider,
)

__all__ = [
    "DockerCreateConfig",
    "DockerCreateError",
    "DockerCreateVerificationError",
    "DockerExecConfig",
    "DockerProbeConfig",
    "DockerProvider",
]
