"""The contract between the sandbox API and a provider: what is asked for, what comes back, and what can fail.

A provider is any object with the methods of :class:`SandboxProvider` (a structural ``Protocol``, so a provider needs
no base class). Optional capabilities are separate ``runtime_checkable`` protocols, tested with ``isinstance``.
Every value here is provider-neutral; what a provider keeps about one sandbox lives in ``SandboxHandle.raw``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from nemo_gym.errors import SandboxCreateError

__all__ = [
    "RUNTIME_RETURN_CODE",
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
]

RUNTIME_RETURN_CODE = 125
"""``return_code`` of a result whose command never ran to an exit status (timeout, runtime failure): see
``SandboxExecResult.error_type``."""


class SandboxStatus(str, Enum):  # noqa: UP042 - str(member) is "SandboxStatus.RUNNING", as in NeMo Gym
    """Where a sandbox is in its life, the same words for every provider."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"
    ERROR = "error"
    UNKNOWN = "unknown"


class SandboxCreateVerificationError(SandboxCreateError):
    """The sandbox was created but failed its readiness check, so it was torn down again."""


@dataclass(frozen=True)
class SandboxEndpoint:
    """How a caller reaches a service inside a sandbox: an absolute URL plus any headers the provider requires."""

    endpoint: str
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        url = self.endpoint.strip() if isinstance(self.endpoint, str) else ""
        parts = urlsplit(url)
        if not parts.scheme or not parts.netloc:
            raise ValueError(f"Sandbox endpoint must be a non-empty absolute URL, got {self.endpoint!r}")
        if not isinstance(self.headers, Mapping):
            raise TypeError("Sandbox endpoint headers must be a mapping")
        object.__setattr__(self, "endpoint", url)
        object.__setattr__(self, "headers", {str(k): str(v) for k, v in self.headers.items()})


def _optional(value: Any, cast: type) -> Any:
    return None if value is None else cast(value)


@dataclass(frozen=True)
class SandboxResources:
    """What a sandbox asks for; each provider applies what its runtime can enforce and ignores the rest."""

    cpu: float | None = None
    memory_mib: int | None = None
    disk_gib: int | None = None
    gpu: int | None = None
    gpu_type: str | None = None

    @classmethod
    def of(cls, resources: SandboxResources | Mapping[str, Any] | None) -> SandboxResources:
        """``SandboxSpec.resources`` as an instance (the spec converts mappings, but its type cannot say so)."""
        return resources if isinstance(resources, SandboxResources) else cls.from_mapping(resources)

    @classmethod
    def from_mapping(cls, resources: Mapping[str, Any] | None) -> SandboxResources:
        """Build from YAML, where numbers may arrive as strings; an unknown key is a typo, so it is refused."""
        if resources is None:
            return cls()
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(resources) - set(known))
        if unknown:
            raise ValueError(
                f"Unknown sandbox resource keys: {', '.join(unknown)}. Expected keys: {', '.join(sorted(known))}"
            )
        casts: dict[str, type] = {"cpu": float, "memory_mib": int, "disk_gib": int, "gpu": int, "gpu_type": str}
        return cls(**{name: _optional(resources.get(name), casts[name]) for name in known})


def _port(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ValueError(f"Invalid sandbox TCP port: {raw!r}")
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"Invalid sandbox TCP port: {raw!r}") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"Sandbox TCP port must be between 1 and 65535, got {port}")
    return port


def _unique_ports(ports: object) -> tuple[int, ...]:
    """``SandboxSpec.ports`` as a tuple of ints, each valid and listed once."""
    if not isinstance(ports, (list, tuple)):
        raise TypeError(f"SandboxSpec.ports is a {type(ports).__name__}; give a list of TCP port numbers")
    seen: dict[int, None] = {}
    for port in map(_port, ports):
        if port in seen:
            raise ValueError(f"Duplicate sandbox TCP port: {port} is listed twice in SandboxSpec.ports")
        seen[port] = None
    return tuple(seen)


@dataclass(frozen=True)
class SandboxSpec:
    """What to create. Fields keep NeMo Gym's order, so positional construction means the same thing here.

    ``files`` maps a path inside the sandbox to text written there before ``start()`` returns. ``ports`` are the
    service ports that ``endpoint()`` may resolve. ``provider_options`` is passed through to the provider untouched.
    """

    image: str | None = None
    ttl_s: int | float | None = None
    ready_timeout_s: int | float | None = None
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    resources: SandboxResources | Mapping[str, Any] = field(default_factory=SandboxResources)
    entrypoint: list[str] | None = None
    provider_options: dict[str, Any] = field(default_factory=dict)
    ports: tuple[int, ...] | list[int] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        # Frozen: normalised values go in through object.__setattr__.
        object.__setattr__(self, "resources", SandboxResources.of(self.resources))
        object.__setattr__(self, "ports", _unique_ports(self.ports))


@dataclass
class SandboxHandle:
    """One created sandbox. ``raw`` belongs to the provider: pass the handle back to it, don't look inside."""

    sandbox_id: str
    provider_name: str
    raw: Any


@dataclass(frozen=True)
class SandboxExecResult:
    """The outcome of one command.

    ``return_code`` is the command's exit status when it ran. When the provider could not get one (a timeout, the
    runtime itself failing), ``error_type`` names why (``"timeout"``, ``"sandbox"``) and ``return_code`` is
    ``RUNTIME_RETURN_CODE``. A command that fails is a result, never an exception.
    """

    stdout: str | None
    stderr: str | None
    return_code: int
    error_type: str | None = None


ExecResult = SandboxExecResult
"""NeMo Gym's shorter name for the same class."""


class SandboxProvider(Protocol):
    """What every provider offers. ``create`` returns only once commands and file transfers work."""

    name: str

    async def create(self, spec: SandboxSpec) -> SandboxHandle: ...

    async def exec(
        self,
        handle: SandboxHandle,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = None,
        user: str | int | None = None,
    ) -> SandboxExecResult: ...

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None: ...

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None: ...

    async def status(self, handle: SandboxHandle) -> SandboxStatus: ...

    async def close(self, handle: SandboxHandle) -> None:
        """End one sandbox; closing one that is already gone is not an error."""
        ...

    async def aclose(self) -> None:
        """Release what the provider holds for all its sandboxes (clients, pools)."""
        ...


@runtime_checkable
class SupportsSandboxEndpoint(Protocol):
    """Optional: the provider can turn a declared service port into a URL the caller can reach."""

    async def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint: ...


@runtime_checkable
class ConnectableProvider(Protocol):
    """Optional: a live sandbox can be described as JSON in one process and picked up by another."""

    async def serialize_handle(self, handle: SandboxHandle, *, scope: str | None = None) -> dict[str, Any]: ...

    async def connect(self, descriptor: Mapping[str, Any]) -> SandboxHandle: ...


@dataclass(frozen=True)
class SandboxGroupVolume:
    """A named volume of a sandbox group mounted into one member at ``target`` (an absolute path)."""

    name: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class SandboxGroupMember:
    """What one member of a group needs beyond its spec: the names the others reach it by, the group's volumes it
    mounts, and runtime settings a Compose service may ask for (added capabilities, ``/dev/shm`` size in bytes)."""

    aliases: tuple[str, ...]
    volumes: tuple[SandboxGroupVolume, ...] = ()
    cap_add: tuple[str, ...] = ()
    shm_size: int | None = None


@runtime_checkable
class SupportsSandboxGroups(Protocol):
    """Optional: several sandboxes as one (a Compose workload). Members of a group share a private network on which
    each is reachable by its aliases, and the group's named volumes.

    ``create_group`` makes the network and volumes; a member is created with the provider options
    ``group_member_options`` returns merged into its spec; ``remove_group`` deletes the network and volumes once the
    members are closed (a group already gone is not an error).
    """

    async def create_group(self, group: str, volumes: Sequence[str]) -> None: ...

    def group_member_options(self, group: str, member: SandboxGroupMember) -> dict[str, Any]: ...

    async def remove_group(self, group: str) -> None: ...
