"""The ``apptainer`` provider: one Apptainer instance per sandbox, for hosts (HPC nodes) without a Docker daemon.

Needs the ``apptainer`` CLI (on PATH, or in ``bin_path``), checked when a sandbox is created; a missing one is an
:class:`ApptainerCreateError` saying how to get it. Each instance gets a host staging directory bound at
``create.mount_point`` (``/sandbox``): file transfers under it are plain host copies, others go through a ``cp``
inside the instance. Apptainer has no lifetime limit, so ``spec.ttl_s`` is ignored (with a warning).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import posixpath
import re
import shlex
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym.sandbox.providers.base import (
    RUNTIME_RETURN_CODE,
    SandboxCreateError,
    SandboxCreateVerificationError,
    SandboxExecResult,
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
    "ApptainerCreateConfig",
    "ApptainerCreateError",
    "ApptainerCreateVerificationError",
    "ApptainerExecConfig",
    "ApptainerProbeConfig",
    "ApptainerProvider",
]

logger = logging.getLogger(__name__)

INSTANCE_PREFIX = "nemo-gym-"
INSTALL_HINT = "install Apptainer (https://apptainer.org/docs/admin/main/installation.html), or pick the local provider"
_RUNTIME_FAILURES = ("fatal:", "no instance found", "instance not found", "does not exist")
_GONE = ("no instance found", "instance not found", "does not exist")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHELL_READONLY = frozenset({"EUID", "GID", "HOME", "IFS", "OPTIND", "PWD", "UID"})
_STATES = {"running": SandboxStatus.RUNNING, "starting": SandboxStatus.STARTING, "stopped": SandboxStatus.STOPPED}


class ApptainerCreateError(SandboxCreateError):
    """Apptainer could not start the instance (or is not installed)."""


class ApptainerCreateVerificationError(SandboxCreateVerificationError):
    """The instance started but failed its readiness probe."""


def _require_apptainer(bin_path: str | None = None) -> str:
    """The ``apptainer`` executable (in ``bin_path`` when given, else on PATH), or a one-line error."""
    candidate = Path(bin_path, "apptainer") if bin_path else None
    if candidate is None:
        found, missing = shutil.which("apptainer"), "the `apptainer` command is not on PATH"
    else:
        usable = candidate.is_file() and os.access(candidate, os.X_OK)
        found, missing = (str(candidate) if usable else None), f"no executable `apptainer` in {bin_path}"
    if not found:
        raise ApptainerCreateError(f"apptainer sandbox provider: {missing}; {INSTALL_HINT}")
    return found


@dataclass(frozen=True)
class ApptainerCreateConfig:
    """How instances start (``apptainer instance start``)."""

    mount_point: str = "/sandbox"
    start_timeout_s: float | None = 600
    extra_start_args: list[str] = field(default_factory=list)
    apply_resource_limits: bool = True

    def __post_init__(self) -> None:
        check_limits("create", self, {"start_timeout_s": "> 0"})
        if not posixpath.isabs(self.mount_point):
            raise ValueError(
                f"sandbox config create.mount_point is {self.mount_point!r}; use an absolute path such as /sandbox"
            )


@dataclass(frozen=True)
class ApptainerExecConfig:
    """How commands run (``apptainer exec instance://...``); ``default_binds`` are added to every instance."""

    default_timeout_s: float | None = 180
    fakeroot_for_root: bool = True
    default_binds: list[str] = field(default_factory=list)
    extra_exec_args: list[str] = field(default_factory=list)
    concurrency: int = 32

    def __post_init__(self) -> None:
        check_limits("exec", self, EXEC_LIMITS)


@dataclass(frozen=True)
class ApptainerProbeConfig(ProbeConfig):
    command: str | None = "printf apptainer-sandbox-ready"
    expected_stdout: str | None = "apptainer-sandbox-ready"


@dataclass
class _Instance:
    name: str
    staging_dir: Path
    """The host side of the bind mount at ``mount_point``."""
    mount_point: str
    image: str
    env: dict[str, str] = field(default_factory=dict)


def _image_ref(image: str) -> str:
    """A bare name (``ubuntu:22.04``) means a Docker image; URIs, paths and ``.sif`` files are used as given."""
    if "://" in image or image.startswith(("/", ".")) or image.endswith(".sif"):
        return image
    return f"docker://{image}"


def _env_file_text(env: Mapping[str, str]) -> str:
    """``--env-file`` content: Apptainer evaluates the file as shell once, so each value is shell-quoted."""
    lines = []
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise ValueError(f"Apptainer environment variable names must be shell identifiers, got {key!r}")
        if key in _SHELL_READONLY:
            raise ValueError(f"Apptainer --env-file cannot set the shell's read-only variable {key}")
        if not isinstance(value, str) or "\x00" in value:
            raise ValueError(f"Apptainer environment variable {key} must be a string without NUL")
        lines.append(f"{key}={shlex.quote(value)}\n")
    return "".join(lines)


@contextlib.contextmanager
def _env_file(directory: Path, env: Mapping[str, str]) -> Iterator[list[str]]:
    """The flags that pass ``env`` through a private (0600) file, removed afterwards; none for an empty env."""
    text = _env_file_text(env)
    if not text:
        yield []
        return
    fd, path = tempfile.mkstemp(prefix=".apptainer-env-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
        yield ["--no-eval", "--env-file", path]
    finally:
        Path(path).unlink(missing_ok=True)


def _relative_to_mount(mount_point: str, path: str) -> str | None:
    """``path`` relative to the mount point when it is under it (``""`` for the mount itself), else None."""
    if not path.startswith("/"):
        return None
    mount, normalized = posixpath.normpath(mount_point), posixpath.normpath(path)
    if normalized == mount:
        return ""
    prefix = mount.rstrip("/") + "/"
    return normalized[len(prefix) :] if normalized.startswith(prefix) else None


class ApptainerProvider:
    """Sandboxes as Apptainer instances on this host."""

    name = "apptainer"

    def __init__(
        self,
        *,
        exec: ApptainerExecConfig | Mapping[str, Any] | None = None,
        create: ApptainerCreateConfig | Mapping[str, Any] | None = None,
        probe: ApptainerProbeConfig | Mapping[str, Any] | None = None,
        bin_path: str | None = None,
    ) -> None:
        """Each config section may be its dataclass or a plain mapping; ``bin_path`` is searched before ``PATH``.

        The ``apptainer`` binary itself is looked up on first use, so constructing a provider never fails for it.
        """
        self._create_config, self._exec_config, self._readiness = (
            coerce_config(create, ApptainerCreateConfig),
            coerce_config(exec, ApptainerExecConfig),
            coerce_config(probe, ApptainerProbeConfig),
        )
        self._bin_path = bin_path
        self._binary: str | None = None
        self._semaphore = asyncio.Semaphore(self._exec_config.concurrency)

    async def _apptainer(self, *args: str, timeout_s: float | None = None, stdin: bytes | None = None) -> ProcessOutput:
        if self._binary is None:
            self._binary = _require_apptainer(self._bin_path)
        env = dict(os.environ)
        if self._bin_path:
            env["PATH"] = f"{self._bin_path}:{env.get('PATH', '')}"
        async with self._semaphore:
            return await run_process(
                [self._binary, *args],
                timeout_s=timeout_s if timeout_s is not None else self._exec_config.default_timeout_s,
                stdin=stdin,
                env=env,
            )

    def _start_flags(self, spec: SandboxSpec, staging_dir: Path) -> list[str]:
        flags = ["--bind", f"{staging_dir}:{self._create_config.mount_point}"]
        binds = spec.provider_options.get("binds")
        if binds is not None and not isinstance(binds, (str, list, tuple)):
            raise ApptainerCreateError(
                f"provider_options['binds'] must be a string or list, got {type(binds).__name__}"
            )
        extra_binds = [binds] if isinstance(binds, str) else [str(b) for b in binds or []]
        for bind in [*self._exec_config.default_binds, *extra_binds]:
            flags += ["--bind", bind]
        resources = SandboxResources.of(spec.resources)
        start_args = list(self._create_config.extra_start_args)
        limits = ["--cpus", str(resources.cpu)] if resources.cpu is not None else []
        limits += ["--memory", f"{resources.memory_mib}m"] if resources.memory_mib is not None else []
        if limits and self._create_config.apply_resource_limits:
            if "--fakeroot" in start_args:  # cgroup limits need a real root, which --fakeroot is not
                logger.warning("apptainer sandbox provider: cpu/memory limits skipped because of --fakeroot")
            else:
                flags += limits
        flags += ["--nv"] if resources.gpu else []
        return flags + start_args

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """``apptainer instance start`` with the staging bind, then the readiness probe; failures clean up."""
        if spec.ttl_s is not None:
            logger.warning("apptainer sandbox provider: ttl_s is not supported and is ignored")
        if spec.image is None:
            raise ApptainerCreateError("apptainer sandbox provider: spec.image is required")
        image = _image_ref(spec.image)
        try:
            _env_file_text(spec.env)
        except ValueError as e:
            raise ApptainerCreateError(f"invalid Apptainer environment: {e}") from e
        staging_dir = Path(tempfile.mkdtemp(prefix="nemo-gym-apptainer-"))
        name = INSTANCE_PREFIX + uuid.uuid4().hex
        try:
            flags = self._start_flags(spec, staging_dir)
            with _env_file(staging_dir, spec.env) as env_flags:
                output = await self._apptainer(
                    "instance", "start", *flags, *env_flags, image, name, timeout_s=self._create_config.start_timeout_s
                )
        except TimeoutError as late:
            shutil.rmtree(staging_dir, ignore_errors=True)
            raise ApptainerCreateError(
                f"{image!r} did not start as an apptainer instance in time ({late}); raise create.start_timeout_s"
            ) from late
        except BaseException:
            shutil.rmtree(staging_dir, ignore_errors=True)
            raise
        if output.return_code != 0:
            shutil.rmtree(staging_dir, ignore_errors=True)
            raise ApptainerCreateError(
                f"apptainer instance start failed (code={output.return_code}) for image={image!r}: "
                f"{output.stderr.strip()}"
            )
        instance = _Instance(name, staging_dir, self._create_config.mount_point, image, dict(spec.env))
        handle = SandboxHandle(sandbox_id=name, provider_name=self.name, raw=instance)
        try:
            await wait_until_ready(
                self._readiness,
                lambda command, timeout: self.exec(handle, command, timeout_s=timeout),
                name,
                ApptainerCreateVerificationError,
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await self._apptainer("instance", "stop", name)
            shutil.rmtree(staging_dir, ignore_errors=True)
            raise
        return handle

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
        """``apptainer exec instance://NAME sh -c command``. ``user`` root/0 adds ``--fakeroot``; another user runs
        through ``su`` under ``--fakeroot``."""
        instance: _Instance = handle.raw
        flags = ["--pwd", cwd] if cwd is not None else []
        if user in ("root", 0):
            flags += ["--fakeroot"] if self._exec_config.fakeroot_for_root else []
        elif user is not None:
            flags.append("--fakeroot")
            command = f"su -s /bin/sh -c {shlex.quote(command)} {shlex.quote(str(user))}"
        flags += self._exec_config.extra_exec_args
        try:
            with _env_file(instance.staging_dir, {**instance.env, **(env or {})}) as env_flags:
                output = await self._apptainer(
                    "exec", *flags, *env_flags, f"instance://{instance.name}", "sh", "-c", command,
                    timeout_s=timeout_s, stdin=stdin,
                )  # fmt: skip
        except TimeoutError as e:
            return SandboxExecResult(stdout=None, stderr=str(e), return_code=RUNTIME_RETURN_CODE, error_type="timeout")
        if output.return_code != 0 and any(marker in output.stderr.lower() for marker in _RUNTIME_FAILURES):
            return SandboxExecResult(output.stdout, output.stderr, RUNTIME_RETURN_CODE, "sandbox")
        return SandboxExecResult(stdout=output.stdout, stderr=output.stderr, return_code=output.return_code)

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        """A host copy into the staging dir when the target is under the mount; else staged there and ``cp``-ed."""
        instance: _Instance = handle.raw
        relative = _relative_to_mount(instance.mount_point, target_path)
        if relative is not None:
            target = instance.staging_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source_path, target)
            return
        staged = uuid.uuid4().hex
        shutil.copyfile(source_path, instance.staging_dir / staged)
        try:
            inside = posixpath.join(instance.mount_point, staged)
            parent = shlex.quote(posixpath.dirname(target_path) or "/")
            result = await self.exec(
                handle, f"mkdir -p {parent} && cp {shlex.quote(inside)} {shlex.quote(target_path)}", user="root"
            )
            if result.return_code != 0:
                raise RuntimeError(f"apptainer upload to {target_path!r} failed: {result.stderr}")
        finally:
            (instance.staging_dir / staged).unlink(missing_ok=True)

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        """The mirror of :meth:`upload_file`."""
        instance: _Instance = handle.raw
        target_path.parent.mkdir(parents=True, exist_ok=True)
        relative = _relative_to_mount(instance.mount_point, source_path)
        if relative is not None:
            shutil.copyfile(instance.staging_dir / relative, target_path)
            return
        staged = uuid.uuid4().hex
        try:
            inside = posixpath.join(instance.mount_point, staged)
            result = await self.exec(handle, f"cp {shlex.quote(source_path)} {shlex.quote(inside)}", user="root")
            if result.return_code != 0:
                raise RuntimeError(f"apptainer download from {source_path!r} failed: {result.stderr}")
            shutil.copyfile(instance.staging_dir / staged, target_path)
        finally:
            (instance.staging_dir / staged).unlink(missing_ok=True)

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        """From ``apptainer instance list --json``: listed is RUNNING, missing is STOPPED, anything odd UNKNOWN."""
        try:
            output = await self._apptainer("instance", "list", "--json")
            instances = json.loads(output.stdout).get("instances", []) if output.return_code == 0 else None
        except (TimeoutError, json.JSONDecodeError, AttributeError):
            return SandboxStatus.UNKNOWN
        if instances is None:
            return SandboxStatus.UNKNOWN
        for entry in instances:
            if entry.get("instance") == handle.raw.name:
                return _STATES.get(str(entry.get("state") or "running").lower(), SandboxStatus.UNKNOWN)
        return SandboxStatus.STOPPED

    async def close(self, handle: SandboxHandle) -> None:
        """``apptainer instance stop`` (already gone is fine), and the staging dir is removed either way."""
        instance: _Instance = handle.raw
        try:
            output = await self._apptainer("instance", "stop", instance.name)
        finally:
            shutil.rmtree(instance.staging_dir, ignore_errors=True)
        if output.return_code != 0 and not any(marker in output.stderr.lower() for marker in _GONE):
            raise RuntimeError(f"apptainer instance stop failed for {instance.name!r}: {output.stderr.strip()}")

    async def aclose(self) -> None:
        """Nothing is shared between instances."""
