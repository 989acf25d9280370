"""Providers: the types they exchange with the sandbox API, and the registry that finds them by name.

Built in: ``local`` (this machine, Landlock), ``docker`` (the ``docker`` CLI) and ``apptainer`` (the ``apptainer``
CLI). Each is imported only when its name is first used, so importing this package needs no container runtime.
"""

from nemo_gym.sandbox.providers.base import (
    ConnectableProvider,
    ExecResult,
    SandboxCreateError,
    SandboxCreateVerificationError,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxGroupMember,
    SandboxGroupVolume,
    SandboxHandle,
    SandboxProvider,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
    SupportsSandboxEndpoint,
    SupportsSandboxGroups,
)
from nemo_gym.sandbox.providers.registry import create_provider, get_provider_class, list_providers, register_provider

__all__ = [
    "ConnectableProvider",
    "ExecResult",
    "SandboxCreateError",
    "SandboxCreateVerificationError",
    "SandboxEndpoint",
    "SandboxExecResult",
    "SandboxGroupMember",
    "SandboxGroupVolume",
    "SandboxHandle",
    "SandboxProvider",
    "SandboxResources",
    "SandboxSpec",
    "SandboxStatus",
    "SupportsSandboxEndpoint",
    "SupportsSandboxGroups",
    "create_provider",
    "get_provider_class",
    "list_providers",
    "register_provider",
]
