"""The ``docker`` provider: one long-lived container per sandbox, driven through podman's or Docker's command line.

Needs ``podman`` (preferred, no daemon) or the ``docker`` CLI with a running daemon, and nothing from PyPI; which one,
and why the CLI rather than the Engine API, is in ``runtime.py``. The runtime is looked up when a sandbox is created,
not on import or construction, and a missing one is a :class:`DockerCreateError` that says what to install or start.
The container runs a keep-alive shell (the image's own entrypoint is replaced), so ``exec`` works on any image;
``spec.ttl_s`` makes it exit (and ``--rm`` remove it) after that many seconds.

Untrusted code is the default case: no network, a read-only root with tmpfs work directories, a process limit. A
command's timeout is enforced inside the container (``timeout``), so a command that runs past it is stopped there,
not only abandoned by the client. Every container is labelled with its run and with this provider's owner id, and a
watchdog process (``watchdog.py``) removes them if the server dies without doing so itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import os
import posixpath
import shlex
import socket
import subprocess
import sys
import time
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
from nemo_gym.sandbox.providers.docker import watchdog
from nemo_gym.sandbox.providers.docker.runtime import ContainerRuntime, ContainerRuntimeError, find_runtime
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
RUN_LABEL = "nemo-gym.run"
"""The run a container belongs to: the launcher's run directory name (``standalone`` outside a launched run)."""
OWNER_LABEL = "nemo-gym.owner"
"""The provider instance (host, process, random part) that made the container; its watchdog removes by this."""
TIMEOUT_EXIT_CODE = 124
"""What ``timeout`` exits with when the command ran past its deadline."""
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


def run_label() -> str:
    """This process's run, from the config file the launcher gave it (``results/run/<stamp>/config.yaml``)."""
    config_file = os.environ.get("NEMO_GYM_CONFIG_FILE")
    return os.path.basename(os.path.dirname(config_file)) if config_file else "standalone"


@dataclass(frozen=True)
class DockerCreateConfig:
    """How containers are started (``run``). Isolated by default (no network, read-only root, a process limit)."""

    runtime: str = "auto"
    """``auto`` (podman when on PATH, else docker), ``podman`` or ``docker``."""
    keepalive_shell: str = "/bin/sh"
    keepalive_cmd: str = "while :; do sleep 2147483647; done"
    start_timeout_s: float | None = 600
    use_init: bool = True
    network: str | None = "none"
    """``"none"``: no network; ``None``: the runtime's default bridge; anything else: that network (``"host"``...)."""
    read_only: bool = True
    tmpfs: list[str] = field(default_factory=lambda: ["/work:rw,size=1g,mode=1777", "/tmp:rw,size=256m,mode=1777"])
    """Writable in-memory directories (``PATH[:OPTIONS]``), the only writable places when ``read_only``."""
    cap_drop: list[str] = field(default_factory=list)
    security_opt: list[str] = field(default_factory=list)
    pids_limit: int | None = 1024
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
        self._runtime: ContainerRuntime | None = None
        self._semaphore = asyncio.Semaphore(self._exec_config.concurrency)
        self.owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._containers: set[str] = set()
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._watchdog_pipe: int | None = None

    @property
    def runtime(self) -> ContainerRuntime:
        """The container CLI this provider drives, looked up on first use."""
        if self._runtime is None:
            try:
                self._runtime = find_runtime(self._create_config.runtime)
            except ContainerRuntimeError as e:
                raise DockerCreateError(str(e)) from None
        return self._runtime

    async def _docker(self, *args: str, timeout_s: float | None = None, stdin: bytes | None = None) -> ProcessOutput:
        """Run ``<runtime> ARGS``; ``TimeoutError`` past the deadline (the exec config's default when not given)."""
        runtime = self.runtime
        async with self._semaphore:
            return await run_process(
                runtime.command(*args),
                timeout_s=timeout_s if timeout_s is not None else self._exec_config.default_timeout_s,
                stdin=stdin,
                env=runtime.environ() if runtime.env else None,
                cwd=runtime.cwd,
            )

    def _start_watchdog(self) -> None:
        """Start the process that removes this provider's containers if this process dies first (once)."""
        if self._watchdog_pipe is not None:
            return
        read_end, write_end = os.pipe()
        os.set_inheritable(write_end, False)
        script = os.path.abspath(watchdog.__file__)
        self._watchdog = subprocess.Popen(
            [sys.executable, script, self.runtime.binary, f"{OWNER_LABEL}={self.owner}"],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=self.runtime.environ(),
            cwd=self.runtime.cwd,
        )
        os.close(read_end)
        self._watchdog.wait()  # it forks and its first process exits at once
        self._watchdog_pipe = write_end

    def _stop_watchdog(self) -> None:
        if self._watchdog_pipe is not None:
            with contextlib.suppress(OSError):
                os.write(self._watchdog_pipe, f"{watchdog.DONE}\n".encode())
                os.close(self._watchdog_pipe)
            self._watchdog_pipe = None

    def _run_args(self, spec: SandboxSpec, name: str, image: str) -> list[str]:
        config = self._create_config
        args = ["run", "-d", "--name", name, "--label", f"{SANDBOX_LABEL}=1"]
        args += ["--label", f"{RUN_LABEL}={run_label()}", "--label", f"{OWNER_LABEL}={self.owner}"]
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
        for mount in config.tmpfs:
            args += ["--tmpfs", mount]
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
        self._start_watchdog()
        self._containers.add(name)
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

    def _force(self) -> list[str]:
        """``rm`` flags that stop a container at once (podman otherwise waits 10 s for a keep-alive shell)."""
        return ["-f", "-t", "0"] if self.runtime.kind == "podman" else ["-f"]

    async def _remove(self, name: str) -> None:
        with contextlib.suppress(Exception):
            await self._docker("rm", *self._force(), name)
        self._containers.discard(name)

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
        """``exec <shell> -c command``; ``user`` root/0 means uid 0. The timeout is enforced inside the container
        (``timeout``, then SIGKILL 2 s later), with a host-side deadline a little later as a backstop."""
        container: _Container = handle.raw
        flags = ["-i"] if stdin is not None else []
        flags += ["-w", cwd] if cwd is not None else []
        for key, value in {**container.env, **(env or {})}.items():
            flags += ["--env", f"{key}={value}"]
        if user is not None:
            flags += ["--user", "0" if user in ("root", 0) else str(user)]
        flags += self._exec_config.extra_exec_args
        limit = timeout_s if timeout_s is not None else self._exec_config.default_timeout_s
        argv = [container.shell, "-c", command]
        if limit is not None:
            argv = ["timeout", "-k", "2", f"{limit:g}", *argv]
        started = time.monotonic()
        try:
            output = await self._docker(
                "exec", *flags, container.name, *argv, timeout_s=None if limit is None else limit + 15, stdin=stdin
            )
        except TimeoutError as e:
            return SandboxExecResult(stdout=None, stderr=str(e), return_code=RUNTIME_RETURN_CODE, error_type="timeout")
        # `timeout` exits 124 (or 137 after its SIGKILL) at the deadline; earlier, those codes are the command's own
        # (an OOM kill, or a deadline of its own inside the command)
        ran_out = limit is not None and time.monotonic() - started >= limit
        if ran_out and output.return_code in (TIMEOUT_EXIT_CODE, 128 + 9):
            stderr = f"{output.stderr}command timed out after {limit:g}s\n"
            return SandboxExecResult(output.stdout, stderr, RUNTIME_RETURN_CODE, error_type="timeout")
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
        """``rm -f``; a container that is already gone is fine."""
        output = await self._docker("rm", *self._force(), handle.raw.name)
        self._containers.discard(handle.raw.name)
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
        """Remove the containers this provider still has, then release its watchdog."""
        names = sorted(self._containers)
        if names:
            with contextlib.suppress(Exception):
                await self._docker("rm", *self._force(), *names)
            self._containers.clear()
        self._stop_watchdog()
