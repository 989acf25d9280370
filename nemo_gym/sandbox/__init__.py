"""Sandboxes: somewhere to run a model's commands and files without trusting them, behind one API for every runtime.

A server describes what it needs (:class:`SandboxSpec`) and names a provider in its config; the same code then runs
on this machine (``local``: a Landlock-restricted directory), in a Docker container (``docker``) or in an Apptainer
instance (``apptainer``); a Compose file's services run as one collection of sandboxes (:class:`AsyncSandboxCompose`,
on a provider that can network them). See ``README.md`` next to this file for the providers and their options.

    async with AsyncSandbox({"local": {}}) as sandbox:
        await sandbox.start(SandboxSpec(files={"main.py": "print(6 * 7)"}))
        result = await sandbox.exec("python3 main.py")   # result.stdout == "42\\n"
"""

from nemo_gym.sandbox.api import AsyncSandbox, Sandbox
from nemo_gym.sandbox.compose import AsyncSandboxCompose
from nemo_gym.sandbox.config import resolve_provider_config, resolve_provider_metadata
from nemo_gym.sandbox.providers import (
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
    create_provider,
    get_provider_class,
    list_providers,
    register_provider,
)
from nemo_gym.sandbox.utils import rewrite_image

__all__ = [
    "AsyncSandbox",
    "AsyncSandboxCompose",
    "ConnectableProvider",
    "ExecResult",
    "Sandbox",
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
    "resolve_provider_config",
    "resolve_provider_metadata",
    "rewrite_image",
]
