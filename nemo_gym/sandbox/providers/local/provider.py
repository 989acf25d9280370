"""The ``local`` provider: a sandbox is a fresh directory on this machine, and commands run under Landlock.

Nothing to install: it needs Linux with Landlock (5.13+), the same kernel layer ``resources_servers/code_gen`` uses
(``nemo_gym/sandbox/landlock.py``). Each command starts through that module's launcher, which restricts itself and
then ``exec``s ``<shell> -c <command>``, so the command and everything it starts can

* change files only inside the sandbox directory (and write ``/dev/null``): writes elsewhere fail with EACCES;
* read and run only the system directories (``/usr``, ``/bin``, ``/lib*``, ``/etc``, ``/opt``, ``/dev``, ``/proc``,
  ``/sys``) and the sandbox directory; other users' files, the home directory and ``/tmp`` are invisible;
* open no TCP connection unless ``network: true`` (needs Landlock ABI 4, Linux 6.7);
* signal no process outside the sandbox (ABI 6).

It is not a container: there is no image (``spec.image`` is ignored), commands run as the server's user, and
``cpu``/``disk`` requests are not enforced (``memory_mib`` becomes an address-space limit per process). Paths given to
the file API, ``cwd`` and ``spec.workdir`` are relative to the sandbox directory (also ``~`` and ``$HOME``) or absolute
inside it; anything outside is refused (``PermissionError``; ``SandboxCreateError`` for a workdir).
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import shutil
import sys
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from nemo_gym.sandbox import landlock as _landlock
from nemo_gym.sandbox.providers.base import (
    RUNTIME_RETURN_CODE,
    SandboxCreateError,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
)
from nemo_gym.sandbox.providers.process import (
    ProbeConfig,
    coerce_config,
    kill_group,
    run_process,
    wait_until_ready,
)

__all__ = ["DEFAULT_READ_PATHS", "LocalProvider"]

logger = logging.getLogger(__name__)

LandlockMode = Literal["required", "auto", "off"]

DEFAULT_READ_PATHS = ("/bin", "/sbin", "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/dev", "/proc",
                      "/sys")  # fmt: skip
"""What a command may read and execute besides its sandbox: enough for a shell, coreutils and system interpreters."""
_SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LAUNCHER = str(Path(_landlock.__file__).resolve())
_STATE_FILE = "sandbox.json"


@dataclass
class _LocalSandbox:
    """The provider's record of one sandbox (``SandboxHandle.raw``); also saved to disk for ``connect``."""

    base: str
    """Holds ``work/`` (the sandbox directory) and ``launch/`` (launcher configs, unreadable from inside)."""
    workdir: str
    env: dict[str, str]
    memory_bytes: int | None
    process_groups: set[int] = field(default_factory=set)
    closed: bool = False

    @property
    def home(self) -> str:
        return os.path.join(self.base, "work")

    @property
    def launch_dir(self) -> str:
        return os.path.join(self.base, "launch")

    def __getitem__(self, key: str) -> Any:
        """NeMo Gym 0.7's local handles are dicts: ``raw["workspace"]`` (the sandbox directory, a ``Path``),
        ``raw["env"]`` and ``raw["owned"]`` (always true here: every sandbox directory is made, and removed, by us)."""
        if key == "workspace":
            return Path(self.home)
        if key == "env":
            return self.env
        if key == "owned":
            return True
        raise KeyError(key)


class LocalProvider:
    """Sandboxes as Landlock-restricted directories on this machine; see the module docstring for what that means.

    Options (the ``local:`` block of a sandbox config): ``root`` (where sandbox directories go; the system temp
    dir by default; ``workspace_root`` is NeMo Gym 0.7's name for it), ``landlock`` (``required``: refuse to create without it; ``auto``: warn and run unrestricted;
    ``off``), ``network``, ``read_paths``/``write_paths`` (added to the defaults), ``shell`` (bash when present, else
    sh), ``default_timeout_s``, ``apply_resource_limits``, ``probe`` (the readiness check after create).
    """

    name = "local"

    def __init__(
        self,
        *,
        root: str | None = None,
        workspace_root: str | None = None,
        landlock: LandlockMode = "required",
        network: bool = False,
        read_paths: list[str] | None = None,
        write_paths: list[str] | None = None,
        shell: str | None = None,
        default_timeout_s: float | None = 180,
        apply_resource_limits: bool = True,
        probe: ProbeConfig | Mapping[str, Any] | None = None,
    ) -> None:
        if landlock not in ("required", "auto", "off"):
            raise ValueError(f"local sandbox provider: landlock must be required, auto or off, got {landlock!r}")
        if default_timeout_s is not None and default_timeout_s <= 0:
            raise ValueError("local sandbox provider: default_timeout_s must be > 0")
        if root is not None and workspace_root is not None and root != workspace_root:
            raise ValueError("local sandbox provider: give root or workspace_root (the same setting), not both")
        chosen = root if root is not None else workspace_root
        self._root = os.path.expanduser(chosen) if chosen else None
        self._landlock_mode: LandlockMode = landlock
        self._network = network
        self._read_paths = [*DEFAULT_READ_PATHS, *(read_paths or [])]
        self._write_paths = [os.devnull, *(write_paths or [])]
        self._shell = shell
        self._default_timeout_s = default_timeout_s
        self._apply_resource_limits = apply_resource_limits
        self._probe = coerce_config(probe, ProbeConfig)
        self._warned_tcp = False

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def _check_host(self) -> None:
        """Refuse, in one line, to create a sandbox this host cannot restrict as configured."""
        if self._landlock_mode == "off":
            return
        version = _landlock.abi()
        if version >= 4 or (version >= 1 and self._network):
            return
        if version < 1:
            message = (
                "local sandbox provider: this kernel has no Landlock (needs Linux >= 5.13 with landlock in the "
                "`lsm=` boot list)"
            )
            if self._landlock_mode == "required":
                raise SandboxCreateError(
                    f"{message}; use the docker or apptainer provider, or set `landlock: auto` to run unrestricted"
                )
            logger.warning("%s; commands run unrestricted (landlock: auto)", message)
        elif not self._warned_tcp:
            self._warned_tcp = True
            logger.warning("local sandbox provider: Landlock ABI %d cannot block TCP (needs 4, Linux 6.7)", version)

    def _resolve_shell(self) -> str:
        shell = self._shell or ("bash" if shutil.which("bash", path=_SEARCH_PATH) else "sh")
        path = shell if os.path.isabs(shell) else shutil.which(shell, path=_SEARCH_PATH)
        if path is None:
            raise SandboxCreateError(f"local sandbox provider: shell {shell!r} not found on {_SEARCH_PATH}")
        return path

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Make the directory, write down its settings and run the probe through the restriction."""
        self._check_host()
        if spec.entrypoint:
            raise SandboxCreateError(
                "local sandbox provider: spec.entrypoint is not supported; start services with exec('... &')"
            )
        if spec.image:
            logger.debug("local sandbox provider: image %r ignored (commands run on this machine)", spec.image)
        if self._root:
            os.makedirs(self._root, exist_ok=True)  # a root such as 0.7's `outputs/local_sandbox` need not exist yet
        base = tempfile.mkdtemp(prefix="nemo-gym-sandbox-", dir=self._root)
        box = _LocalSandbox(base=os.path.realpath(base), workdir="", env={}, memory_bytes=None)
        try:
            os.mkdir(box.home)
            os.mkdir(box.launch_dir, mode=0o700)
            box.workdir = self._workdir(box, spec.workdir)
            os.makedirs(box.workdir, exist_ok=True)
            box.env = {
                "PATH": _SEARCH_PATH,
                "HOME": box.home,
                "TMPDIR": box.home,
                "LANG": "C.UTF-8",
                "LC_ALL": "C.UTF-8",
                "SHELL": self._resolve_shell(),
                **spec.env,
            }
            memory_mib = SandboxResources.of(spec.resources).memory_mib
            box.memory_bytes = memory_mib * 1024 * 1024 if memory_mib and self._apply_resource_limits else None
            Path(box.launch_dir, _STATE_FILE).write_text(json.dumps(_state(box)), encoding="utf-8")
            handle = SandboxHandle(sandbox_id=os.path.basename(box.base), provider_name=self.name, raw=box)
            await wait_until_ready(
                self._probe, lambda command, timeout: self.exec(handle, command, timeout_s=timeout), handle.sandbox_id
            )
        except BaseException:
            await self._remove(box)
            raise
        return handle

    def _workdir(self, box: _LocalSandbox, workdir: str | None) -> str:
        if not workdir:
            return box.home
        try:
            return self._inside(box, workdir)
        except PermissionError:
            raise SandboxCreateError(
                f"local sandbox provider: workdir {workdir!r} is outside the sandbox; give a relative workdir "
                "(created inside the sandbox directory) or none"
            ) from None

    async def close(self, handle: SandboxHandle) -> None:
        """Kill what the sandbox's commands left running, then delete its directory."""
        await self._remove(handle.raw)

    async def _remove(self, box: _LocalSandbox) -> None:
        box.closed = True
        for pgid in sorted(box.process_groups):
            kill_group(pgid)
        box.process_groups.clear()
        shutil.rmtree(box.base, ignore_errors=True)

    async def aclose(self) -> None:
        """Nothing is shared between sandboxes."""

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        box: _LocalSandbox = handle.raw
        return SandboxStatus.STOPPED if box.closed or not os.path.isdir(box.home) else SandboxStatus.RUNNING

    # -- commands --------------------------------------------------------------------------------------------------

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
        """Run ``<shell> -c command`` under the restriction; a failing command is a result, not an exception."""
        box: _LocalSandbox = handle.raw
        refusal = self._refusal(box, user)
        if refusal is None:
            try:
                directory = self._inside(box, cwd) if cwd else box.workdir
            except PermissionError as e:
                refusal = str(e)
            else:
                if not os.path.isdir(directory):
                    refusal = f"local sandbox: cwd {cwd!r} is not a directory"
        if refusal is not None:
            return SandboxExecResult(stdout=None, stderr=refusal, return_code=RUNTIME_RETURN_CODE, error_type="sandbox")
        config_path = os.path.join(box.launch_dir, f"{uuid.uuid4().hex}.json")
        Path(config_path).write_text(json.dumps(self._launch_config(box, command)), encoding="utf-8")
        timeout = timeout_s if timeout_s is not None else self._default_timeout_s
        groups: list[int] = []

        def started(pgid: int) -> None:
            groups.append(pgid)
            box.process_groups.add(pgid)

        try:
            output = await run_process(
                [os.path.realpath(sys.executable), "-I", "-S", "-B", _LAUNCHER, config_path],
                timeout_s=timeout,
                stdin=stdin,
                env={**box.env, **(env or {})},
                cwd=directory,
                on_start=started,
            )
        except TimeoutError:
            return SandboxExecResult(
                stdout=None,
                stderr=f"local sandbox: command timed out after {timeout:g}s: {command!r}",
                return_code=RUNTIME_RETURN_CODE,
                error_type="timeout",
            )
        finally:
            Path(config_path).unlink(missing_ok=True)
            for pgid in groups:
                _forget_if_empty(box, pgid)
        if output.return_code == _landlock.LAUNCH_FAILED and output.stderr.startswith("sandbox: could not start"):
            return SandboxExecResult(output.stdout, output.stderr, RUNTIME_RETURN_CODE, "sandbox")
        code = output.return_code if output.return_code >= 0 else 128 - output.return_code  # the shell's convention
        return SandboxExecResult(stdout=output.stdout, stderr=output.stderr, return_code=code)

    def _launch_config(self, box: _LocalSandbox, command: str) -> dict[str, Any]:
        return {
            "mode": self._landlock_mode,
            "read_paths": self._read_paths,
            "write_paths": [box.home, *self._write_paths],
            "deny_tcp": not self._network,
            "memory_bytes": box.memory_bytes,
            "argv": [box.env["SHELL"], "-c", command],
        }

    @staticmethod
    def _refusal(box: _LocalSandbox, user: str | int | None) -> str | None:
        if box.closed:
            return "local sandbox: the sandbox has been closed"
        if user is None:
            return None
        me = pwd.getpwuid(os.getuid())
        if str(user) in (me.pw_name, str(me.pw_uid)):
            return None
        return f"local sandbox: commands run as {me.pw_name!r}; this provider cannot switch to user {user!r}"

    # -- files -----------------------------------------------------------------------------------------------------

    @staticmethod
    def _inside(box: _LocalSandbox, path: str) -> str:
        """``path`` (relative to the sandbox directory, also spelled ``~``) as an absolute path, symlinks resolved;
        ``PermissionError`` when that is outside the sandbox directory."""
        if path == "~" or path.startswith("~/"):
            path = box.home + path[1:]
        resolved = os.path.realpath(os.path.join(box.home, path))
        if os.path.commonpath([resolved, box.home]) != box.home:
            raise PermissionError(
                f"local sandbox: {path!r} is outside the sandbox directory {box.home}; use a path inside it "
                "(relative paths start there)"
            )
        return resolved

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        target = self._inside(handle.raw, target_path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(source_path, target)

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        source = self._inside(handle.raw, source_path)
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target_path)

    # -- optional capabilities -------------------------------------------------------------------------------------

    async def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint:
        """A service in the sandbox listens on this machine, so its URL is on loopback (only with ``network``)."""
        if not self._network:
            raise RuntimeError(
                "local sandbox provider: network is off, so nothing in the sandbox can listen; set `network: true`"
            )
        return SandboxEndpoint(endpoint=f"http://127.0.0.1:{port}")

    async def serialize_handle(self, handle: SandboxHandle, *, scope: str | None = None) -> dict[str, Any]:
        """A descriptor another process on this machine can ``connect`` to (``scope`` is ignored)."""
        box: _LocalSandbox = handle.raw
        return {"provider": self.name, "sandbox_id": handle.sandbox_id, "path": box.base, "workdir": box.workdir}

    async def connect(self, descriptor: Mapping[str, Any]) -> SandboxHandle:
        state_file = Path(str(descriptor.get("path", "")), "launch", _STATE_FILE)
        if descriptor.get("provider") != self.name or not state_file.is_file():
            raise ValueError(f"local sandbox provider: no live local sandbox at {descriptor.get('path')!r}")
        state = json.loads(state_file.read_text(encoding="utf-8"))
        box = _LocalSandbox(**state)
        return SandboxHandle(sandbox_id=os.path.basename(box.base), provider_name=self.name, raw=box)


def _state(box: _LocalSandbox) -> dict[str, Any]:
    state = asdict(box)
    del state["process_groups"], state["closed"]
    return state


def _forget_if_empty(box: _LocalSandbox, pgid: int) -> None:
    """Keep a command's process group for ``close`` only while something in it still runs."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        box.process_groups.discard(pgid)
    except PermissionError:
        pass
