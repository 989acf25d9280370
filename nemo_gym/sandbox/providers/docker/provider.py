"""The ``docker`` provider: one long-lived container per sandbox, driven through the ``docker`` command line.

Needs the ``docker`` CLI on PATH and a running daemon, and nothing from PyPI. Both are checked when a sandbox is
created, not on import or construction, and a missing one is a :class:`DockerCreateError` that says what to install
or start. The container runs a keep-alive shell (the image's own entrypoint is replaced), so ``exec`` works on any
image; ``spec.ttl_s`` makes it exit (and ``--rm`` remove it) after that many seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import posixpath
import shlex
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym.sandbox.providers.base import (
    RUNTIME_RETURN_CODE,
    SandboxCreateError,
    SandboxCreateVerificationError,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxGroupMember,
    SandboxHandle,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
)
from nemo_gym.sandbox.providers.process import (
    EXEC_LIMITS,
    ProbeConfig,
    ProcessOutput,
    check_limits,
    coerce_config,
    run_process,
    wait_until_ready,
)

__all__ = [
    "DockerCreateConfig",
    "DockerCreateError",
    "DockerCreateVerificationError",
    "DockerExecConfig",
    "DockerProbeConfig",
    "DockerProvider",
]

logger = logging.getLogger(__name__)

CONTAINER_PREFIX = "nemo-gym-"
SANDBOX_LABEL = "nemo-gym.sandbox"
GROUP_LABEL = "nemo-gym.group"
INSTALL_HINT = "install Docker Engine (https://docs.docker.com/engine/install/) or pick the local provider"
_RUNTIME_FAILURES = ("no such container", "is not running", "cannot connect to the docker daemon", "error response from daemon")  # fmt: skip
_GONE = ("no such container", "no such object")
_STATES = {
    "running": SandboxStatus.RUNNING,
    "paused": SandboxStatus.RUNNING,
    "created": SandboxStatus.STARTING,
    "restarting": SandboxStatus.STARTING,
    "exited": SandboxStatus.STOPPED,
    "removing": SandboxStatus.STOPPED,
    "dead": SandboxStatus.STOPPED,
}


class DockerCreateError(SandboxCreateError):
    """Docker could not create the container (or is not installed or not running)."""


class DockerCreateVerificationError(SandboxCreateVerificationError):
    """The container started but failed its readiness probe."""


def _require_docker() -> str:
    """The ``docker`` executable, or a one-line error saying how to get it."""
    path = shutil.which("docker")
    if path is None:
        raise DockerCreateError(f"docker sandbox provider: the `docker` command is not on PATH; {INSTALL_HINT}")
    return path


@dataclass(frozen=True)
class DockerCreateConfig:
    """How containers are started (``docker run``). The isolation knobs are off by default; see the README."""

    keepalive_shell: str = "/bin/sh"
    keepalive_cmd: str = "while :; do sleep 2147483647; done"
    start_timeout_s: float | None = 600
    use_init: bool = True
    network: str | None = None
    """``None``: Docker's default bridge; ``"none"``: no network; anything else: that network (``"host"``, ...)."""
    read_only: bool = False
    cap_drop: list[str] = field(default_factory=list)
    security_opt: list[str] = field(default_factory=list)
    pids_limit: int | None = None
    extra_run_args: list[str] = field(default_factory=list)
    apply_resource_limits: bool = True
    publish_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        check_limits("create", self, {"start_timeout_s": "> 0", "pids_limit": "> 0"})
        try:
            ipaddress.ip_address(self.publish_host)
        except ValueError:
            raise ValueError(
                f"sandbox config create.publish_host is {self.publish_host!r}; set it to an IP address such as 127.0.0.1"
            ) from None


@dataclass(frozen=True)
class DockerExecConfig:
    """How commands run (``docker exec``). ``exec_shell: null`` picks bash when the image has it, else sh."""

    default_timeout_s: float | None = 180
    extra_exec_args: list[str] = field(default_factory=list)
    concurrency: int = 32
    exec_shell: str | None = None

    def __post_init__(self) -> None:
        check_limits("exec", self, EXEC_LIMITS)
        if self.exec_shell == "":
            raise ValueError(
                "sandbox config exec.exec_shell is empty; name a shell (e.g. /bin/bash) or use null for auto"
            )


@dataclass(frozen=True)
class DockerProbeConfig(ProbeConfig):
    command: str | None = "printf docker-sandbox-ready"
    expected_stdout: str | None = "docker-sandbox-ready"


@dataclass
class _Container:
    name: str
    image: str
    shell: str = "sh"
    env: dict[str, str] = field(default_factory=dict)
    ports: tuple[int, ...] = ()


def _string_list(value: Any, option: str) -> list[str]:
    """A provider option that may be one string or a list of them, as a list."""
    items = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise DockerCreateError(
            f"spec.provider_options[{option!r}] is a {type(value).__name__}; give a string or a list of strings"
        )
    return [str(item) for item in items]


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "no output")


class DockerProvider:
    """Sandboxes as Docker containers on the local daemon."""

    name = "docker"

    def __init__(
        self,
        *,
        exec: DockerExecConfig | Mapping[str, Any] | None = None,
        create: DockerCreateConfig | Mapping[str, Any] | None = None,
        probe: DockerProbeConfig | Mapping[str, Any] | None = None,
    ) -> None:
        """Each config section may be its dataclass or a plain mapping; the ``docker`` CLI is looked up on first use."""
        self._create_config, self._exec_config, self._readiness = (
            coerce_config(create, DockerCreateConfig),
            coerce_config(exec, DockerExecConfig),
            coerce_config(probe, DockerProbeConfig),
        )
        self._binary: str | None = None
        self._semaphore = asyncio.Semaphore(self._exec_config.concurrency)

    async def _docker(self, *args: str, timeout_s: float | None = None, stdin: bytes | None = None) -> ProcessOutput:
        """Run ``docker ARGS``; ``TimeoutError`` past the deadline (the exec config's default when not given)."""
        if self._binary is None:
            self._binary = _require_docker()
        async with self._semaphore:
            return await run_process(
                [self._binary, *args],
                timeout_s=timeout_s if timeout_s is not None else self._exec_config.default_timeout_s,
                stdin=stdin,
            )

    def _run_args(self, spec: SandboxSpec, name: str, image: str) -> list[str]:
        config = self._create_config
        args = ["run", "-d", "--name", name, "--label", f"{SANDBOX_LABEL}=1"]
        args += ["--init"] if config.use_init else []
        args += ["-w", spec.workdir] if spec.workdir else []
        for key, value in spec.env.items():
            args += ["--env", f"{key}={value}"]
        resources = SandboxResources.of(spec.resources)
        if config.apply_resource_limits and resources.cpu is not None:
            args += ["--cpus", str(resources.cpu)]
        if config.apply_resource_limits and resources.memory_mib is not None:
            memory = f"{resources.memory_mib}m"
            args += ["--memory", memory, "--memory-swap", memory]  # equal: no swap on top
        if resources.gpu:
            args += ["--gpus", str(resources.gpu)]
        network = spec.provider_options.get("network", config.network)  # a group member joins the group's network
        args += ["--network", str(network)] if network is not None else []
        for alias in _string_list(spec.provider_options.get("network_aliases"), "network_aliases"):
            args += ["--network-alias", alias]
        args += ["--read-only"] if config.read_only else []
        for capability in config.cap_drop:
            args += ["--cap-drop", capability]
        for option in config.security_opt:
            args += ["--security-opt", option]
        args += ["--pids-limit", str(config.pids_limit)] if config.pids_limit is not None else []
        for port in spec.ports:
            args += ["--publish", f"{_host(config.publish_host)}::{port}/tcp"]
        for volume in _string_list(spec.provider_options.get("volumes"), "volumes"):
            args += ["-v", volume]
        args += [*config.extra_run_args, *_string_list(spec.provider_options.get("run_args"), "run_args")]
        if spec.entrypoint:
            if spec.ttl_s is not None:
                logger.warning("docker sandbox provider: ttl_s is not enforced when spec.entrypoint is set")
            return [*args, "--entrypoint", spec.entrypoint[0], image, *spec.entrypoint[1:]]
        keepalive = config.keepalive_cmd
        if spec.ttl_s is not None:
            args.append("--rm")  # the keep-alive ends after ttl_s and the container removes itself
            keepalive = f"sleep {max(1, math.ceil(spec.ttl_s))}"
        return [*args, "--entrypoint", config.keepalive_shell, image, "-c", keepalive]

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """``docker run`` a keep-alive container, probe it, and pick its shell; a half-made one is removed."""
        if spec.image is None:
            raise DockerCreateError("docker sandbox provider: spec.image is required")
        image = spec.image.removeprefix("docker://")
        name = CONTAINER_PREFIX + uuid.uuid4().hex
        run_args = self._run_args(spec, name, image)
        try:
            output = await self._docker(*run_args, timeout_s=self._create_config.start_timeout_s)
        except TimeoutError as e:
            await self._remove(name)
            raise DockerCreateError(f"docker run timed out for image={image!r}: {e}") from e
        if output.return_code != 0:
            await self._remove(name)
            if "cannot connect to the docker daemon" in output.stderr.lower():
                raise DockerCreateError(
                    f"docker sandbox provider: the Docker daemon is not reachable ({_first_line(output.stderr)}); "
                    "start it (e.g. `sudo systemctl start docker`) or pick the local provider"
                )
            raise DockerCreateError(
                f"docker run failed (code={output.return_code}) for image={image!r}: {output.stderr.strip()}"
            )
        container = _Container(name=name, image=image, env=dict(spec.env), ports=tuple(spec.ports))
        handle = SandboxHandle(sandbox_id=name, provider_name=self.name, raw=container)
        try:
            await wait_until_ready(
                self._readiness,
                lambda command, timeout: self.exec(handle, command, timeout_s=timeout),
                name,
                DockerCreateVerificationError,
            )
            container.shell = await self._pick_shell(name)
        except BaseException:
            await self._remove(name)
            raise
        return handle

    async def _pick_shell(self, name: str) -> str:
        configured = self._exec_config.exec_shell
        if configured:
            return configured
        try:
            probe = await self._docker("exec", name, "sh", "-c", "command -v bash")
        except Exception:
            return "sh"
        return "bash" if probe.return_code == 0 else "sh"  # bash when present: conda's `source` and friends need it

    async def _remove(self, name: str) -> None:
        with contextlib.suppress(Exception):
            await self._docker("rm", "-f", name)

    async def exec(
        self,
        handle: SandboxHandle,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = None,
        user: str | int | None = None,
        stdin: bytes | None = None,
    ) -> SandboxExecResult:
        """``docker exec <shell> -c command``; ``user`` root/0 means uid 0. A timeout stops the client only."""
        container: _Container = handle.raw
        flags = ["-i"] if stdin is not None else []
        flags += ["-w", cwd] if cwd is not None else []
        for key, value in {**container.env, **(env or {})}.items():
            flags += ["--env", f"{key}={value}"]
        if user is not None:
            flags += ["--user", "0" if user in ("root", 0) else str(user)]
        flags += self._exec_config.extra_exec_args
        try:
            output = await self._docker(
                "exec", *flags, container.name, container.shell, "-c", command, timeout_s=timeout_s, stdin=stdin
            )
        except TimeoutError as e:
            return SandboxExecResult(stdout=None, stderr=str(e), return_code=RUNTIME_RETURN_CODE, error_type="timeout")
        if output.return_code != 0 and any(marker in output.stderr.lower() for marker in _RUNTIME_FAILURES):
            return SandboxExecResult(output.stdout, output.stderr, RUNTIME_RETURN_CODE, "sandbox")
        return SandboxExecResult(stdout=output.stdout, stderr=output.stderr, return_code=output.return_code)

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        """``docker cp`` in, after making the parent directory (as root)."""
        parent = posixpath.dirname(target_path)
        if parent:
            made = await self.exec(handle, f"mkdir -p {shlex.quote(parent)}", user="root")
            if made.return_code != 0:
                raise RuntimeError(f"docker upload to {target_path!r} failed (mkdir parent): {made.stderr}")
        output = await self._docker("cp", str(source_path), f"{handle.raw.name}:{target_path}")
        if output.return_code != 0:
            raise RuntimeError(f"docker cp upload to {target_path!r} failed: {output.stderr.strip()}")

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        target_path.parent.mkdir(parents=True, exist_ok=True)
        output = await self._docker("cp", f"{handle.raw.name}:{source_path}", str(target_path))
        if output.return_code != 0:
            raise RuntimeError(f"docker cp download from {source_path!r} failed: {output.stderr.strip()}")

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        """From ``docker inspect``: a container that is gone is STOPPED; an error or timeout is UNKNOWN."""
        try:
            output = await self._docker("inspect", "-f", "{{.State.Status}}", handle.raw.name)
        except TimeoutError:
            return SandboxStatus.UNKNOWN
        if output.return_code != 0:
            gone = any(marker in output.stderr.lower() for marker in _GONE)
            return SandboxStatus.STOPPED if gone else SandboxStatus.UNKNOWN
        return _STATES.get(output.stdout.strip().lower(), SandboxStatus.UNKNOWN)

    async def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint:
        """The host address Docker published ``port`` on (``docker port``), loopback preferred."""
        container: _Container = handle.raw
        if port not in container.ports:
            raise ValueError(
                f"Sandbox port {port} was not declared in SandboxSpec.ports; declared ports: {list(container.ports)!r}"
            )
        output = await self._docker("port", container.name, f"{port}/tcp")
        bindings = [line.strip() for line in output.stdout.splitlines() if line.strip()]
        if output.return_code != 0 or not bindings:
            raise RuntimeError(f"docker port found no host binding for {container.name!r} port {port}: {output.stderr}")
        binding = next((b for b in bindings if b.startswith("127.0.0.1:")), bindings[0])
        host, _, host_port = binding.rpartition(":")
        host = host.strip("[]")
        if host in ("", "0.0.0.0", "::"):
            host = self._create_config.publish_host
        return SandboxEndpoint(endpoint=f"http://{_host(host)}:{int(host_port)}")

    async def close(self, handle: SandboxHandle) -> None:
        """``docker rm -f``; a container that is already gone is fine."""
        output = await self._docker("rm", "-f", handle.raw.name)
        if output.return_code != 0 and not any(marker in output.stderr.lower() for marker in _GONE):
            raise RuntimeError(f"docker rm -f failed for {handle.raw.name!r}: {output.stderr.strip()}")

    # -- groups (Compose): a user-defined network, so members resolve each other by alias, and named volumes ---------

    async def _checked(self, what: str, *args: str) -> ProcessOutput:
        output = await self._docker(*args)
        if output.return_code != 0:
            raise DockerCreateError(f"docker {what} failed (code={output.return_code}): {_first_line(output.stderr)}")
        return output

    async def create_group(self, group: str, volumes: Sequence[str]) -> None:
        """``docker network create`` the group's network and ``docker volume create`` its volumes (all labelled)."""
        labels = ["--label", f"{SANDBOX_LABEL}=1", "--label", f"{GROUP_LABEL}={group}"]
        try:
            await self._checked("network create", "network", "create", *labels, group)
            for volume in volumes:
                await self._checked("volume create", "volume", "create", *labels, f"{group}_{volume}")
        except BaseException:
            with contextlib.suppress(Exception):
                await self.remove_group(group)
            raise

    def group_member_options(self, group: str, member: SandboxGroupMember) -> dict[str, Any]:
        """Provider options that put a container on the group's network under its aliases, with its volumes."""
        run_args: list[str] = []
        for capability in member.cap_add:
            run_args += ["--cap-add", capability]
        if member.shm_size is not None:
            run_args += ["--shm-size", str(member.shm_size)]
        mounts = [f"{group}_{v.name}:{v.target}{':ro' if v.read_only else ''}" for v in member.volumes]
        return {"network": group, "network_aliases": list(member.aliases), "volumes": mounts, "run_args": run_args}

    async def remove_group(self, group: str) -> None:
        """Remove the group's volumes and network; ones already gone are fine."""
        listed = await self._checked("volume ls", "volume", "ls", "-q", "--filter", f"label={GROUP_LABEL}={group}")
        names = listed.stdout.split()
        if names:
            await self._checked("volume rm", "volume", "rm", "-f", *names)
        output = await self._docker("network", "rm", group)
        if output.return_code != 0 and "not found" not in output.stderr.lower():
            raise RuntimeError(f"docker network rm {group!r} failed: {_first_line(output.stderr)}")

    async def aclose(self) -> None:
        """Nothing is shared between containers."""
