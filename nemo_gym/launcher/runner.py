"""Running a composed config: one process per server instance, a head server, readiness, and orderly shutdown.

Order of a launch (:meth:`Launcher.start`): find every implementation directory and entrypoint (fail before anything
slow), bind the head server's port, write the resolved config file (mode 0600, secrets included: children need them),
start the head server, build or reuse the venvs, start the children on the sockets reserved for them at compose
time (environment servers last, :func:`spawn_order`), close the launcher's copies of those sockets, then wait until
every server answers ``GET /`` with 200. Every server kind (``responses_api_models``, ``resources_servers``,
``responses_api_agents``, ``environment_servers``) runs the same way, in its own venv.

Secrets (:mod:`nemo_gym.config.secrets`) stay in two places only: the children's config file, which :meth:`Launcher.stop`
deletes (normal exit, Ctrl-C, SIGTERM, a failed start: every path ends there), and the children's memory. The head
server serves the masked config, and every line written to a server's log (or echoed) is masked too. The run's token
(:mod:`nemo_gym.transport.access`) lives in the children's config file and a 0600 token file, both removed at stop.

A child is started as ``<venv python> <entrypoint>`` in its implementation directory with ``NEMO_GYM_CONFIG_FILE``
(path of the config file), ``NEMO_GYM_CONFIG_PATH`` (its instance name), ``NEMO_GYM_LISTEN_FD`` (the inherited
listening socket), ``PYTHONPATH=<impl dir>:<its root>:...`` and ``PYTHONUNBUFFERED=1``.
"""

from __future__ import annotations

import _thread
import asyncio
import concurrent.futures
import contextlib
import functools
import os
import platform
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from nemo_gym.config import ports
from nemo_gym.config.compose import ComposedConfig, ComposeOptions, compose
from nemo_gym.config.placement import RAY_ADDRESS_KEY
from nemo_gym.config.roots import child_env
from nemo_gym.config.secrets import mask_text, secret_values
from nemo_gym.config.server_models import ServerInstanceConfig, maybe_get_server_instance_config
from nemo_gym.config.supervision import SUPERVISION_KEY, SupervisionConfig
from nemo_gym.config.tree import plain_dict
from nemo_gym.errors import ConfigError
from nemo_gym.global_config import (
    NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME,
    NEMO_GYM_CONFIG_FILE_ENV_VAR_NAME,
    NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME,
    masked_config_yaml,
)
from nemo_gym.launcher.head_server import HeadServer, bind_head_socket, build_head_app
from nemo_gym.launcher.preflight import check_replicas, find_implementation
from nemo_gym.launcher.processes import (
    LogSink,
    exit_code,
    read_lines_into,
    server_pythonpath,
    spawn,
    stop_process_groups,
)
from nemo_gym.launcher.reaper import CONFIG_FILE, Reaper, remove_run_files, sweep_dead_runs, write_owner
from nemo_gym.launcher.server_process import ServerLaunchError, ServerProcess, describe_exit, tail_text
from nemo_gym.launcher.signals import second_signal_forces, sigterm_as_interrupt
from nemo_gym.launcher.supervisor import Health, Supervisor, probe_health
from nemo_gym.launcher.venvs import BuildContext, build_venv, shared_venv_enabled, venv_spec
from nemo_gym.transport import access, heap

DEFAULT_STARTUP_TIMEOUT_S = 900.0
"""Venv builds and model loads are slow; this bounds the whole launch, builds included."""
SHUTDOWN_GRACE_S = 10.0
"""Time a server gets after SIGTERM to finish in-flight requests before it is killed."""
_PROBE_TIMEOUT_S = 3.0
"""Bound on one readiness probe (connect, send, status line)."""
_PROGRESS_EVERY_S = 30.0

__all__ = ["Launcher", "ServerLaunchError", "ServerProcess", "new_launcher", "running_servers"]

T = TypeVar("T")


class Launcher:
    """Starts every server of a resolved config and stops them all again; see the module docstring for the order.

    Use :func:`running_servers` for the common start / use / stop sequence. Not reusable: one launch per object.
    """

    places_replicas = False
    """Only a launch on a Ray cluster (``ray_placement.RayLauncher``) starts several replicas of an instance."""

    def __init__(
        self,
        config: ComposedConfig | DictConfig,
        *,
        echo: bool = True,
        startup_timeout_s: float | None = None,
        shutdown_grace_s: float = SHUTDOWN_GRACE_S,
        external: Collection[str] = (),
    ) -> None:
        composed = ComposedConfig.of(config)
        # Instances the caller serves itself at their configured address (gym train grpo's in-process policy).
        self._external = frozenset(external)
        self._data = plain_dict(composed.config)
        self._instances = list(composed.instances)
        self._secrets = composed.secrets
        self._data.pop(access.RUN_TOKEN_KEY, None)  # only the launcher makes one
        # The run's token (transport/access.py): in the children's config file and the token file, nowhere else.
        self._token = access.new_token() if self._data.get(access.AUTH_KEY) is not False else None
        self._token_path: Path | None = None
        known = [*composed.secrets, *([self._token] if self._token else [])]
        self._mask_log_line = functools.partial(mask_text, secrets=secret_values(self._data, known))
        self.echo = echo
        timeout = startup_timeout_s
        if timeout is None:
            timeout = float(self._data.get("server_startup_timeout_seconds") or DEFAULT_STARTUP_TIMEOUT_S)
        self.startup_timeout_s = timeout
        self.shutdown_grace_s = shutdown_grace_s
        self.shared_venv = shared_venv_enabled(self._data.get("shared_venv"))
        self.supervision = SupervisionConfig.model_validate(self._data.get(SUPERVISION_KEY) or {})
        self.failure: ServerLaunchError | None = None
        """Set when a server was given up on (``launcher/supervisor.py``): the launch has failed with it."""
        self.interrupt_main_on_failure = False
        """Interrupt the main thread when a server is given up on: the caller works there (``running_servers``)."""
        self._supervisor: Supervisor | None = None
        self._spawn_lock = threading.Lock()
        self.results_dir = Path(self._data.get("results_dir") or "results").resolve()
        self.cache_dir = Path(self._data.get("cache_dir") or "cache").resolve()
        self.log_dir = self.results_dir / "logs"
        self.config_path: Path | None = None
        self.servers: list[ServerProcess] = []
        self.head: HeadServer | None = None
        self._reaper: Reaper | None = None
        self._builds: list[BuildContext] = []
        self._stop_requested = threading.Event()
        self._force = threading.Event()
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._started = False
        self._released_ports = False

    # ----------------------------------------------------------------------------------------------------------------
    # What callers read

    @property
    def config(self) -> DictConfig:
        """The resolved config the children received (actual head and server ports filled in)."""
        return OmegaConf.create(self._data)

    @property
    def composed(self) -> ComposedConfig:
        """:attr:`config` with its server instances, as the collector and reverify take it."""
        return ComposedConfig(self.config, list(self._instances), secrets=self._secrets)

    @property
    def urls(self) -> dict[str, str]:
        return {server.name: server.url for server in self.servers}

    @property
    def head_url(self) -> str:
        if self.head is None:
            raise RuntimeError("the head server is not running")
        return self.head.url

    def server_instances(self) -> list[dict[str, Any]]:
        return [server.as_dict() for server in self.servers]

    def banner(self) -> str:
        """The "all servers ready" summary printed by ``gym env start``."""
        width = max(len(s.name) for s in self.servers)
        lines = [f"All {len(self.servers)} servers ready:"]
        for s in self.servers:
            pid = s.popen.pid if s.popen else s.remote_pid or "-"
            node = f", node {s.node}" if s.node else ""
            lines.append(
                f"  {s.name:<{width}}  {s.url:<24} {s.label}  (pid {pid}{node}, log {s.log_path or s.sink.path})"
            )
        lines.append(f"Head server: {self.head_url}   config: {self.config_path}")
        if self._token_path is not None:
            lines.append(f"Run token (every request needs it; this user's clients read it): {self._token_path}")
        lines.append("Press Ctrl-C to stop.")
        return "\n".join(lines)

    # ----------------------------------------------------------------------------------------------------------------
    # Lifecycle

    def start(self) -> None:
        """Build, start and wait for every server; on any failure (or Ctrl-C) stop everything and re-raise."""
        if self._started:
            raise RuntimeError("a Launcher starts once; create a new one")
        self._started = True
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            self._plan()
            self._start_head_server()
            self._prepare_interpreters(deadline)
            self._spawn_all()
            _run_async(lambda: self._wait_until_ready(deadline))
            self._supervise()
            heap.release_freed_memory()  # composing and spawning freed ~3 MB that it holds for as long as they run
        except BaseException:
            self.stop()
            raise

    def prepare_only(self) -> None:
        """Dry run: find every server and build (or reuse) its venv, start nothing."""
        if self._started:
            raise RuntimeError("a Launcher starts once; create a new one")
        self._started = True
        try:
            self._plan()
            self._prepare_interpreters(time.monotonic() + self.startup_timeout_s)
        finally:
            self.stop()

    def wait(self, poll_s: float = 0.5) -> None:
        """Block until :meth:`request_stop` (returns) or until a server is given up on (raises
        :class:`ServerLaunchError`); without supervision, until a server exits."""
        while not self._stop_requested.wait(poll_s):
            if self._supervisor is None:
                self.raise_for_exited(during_startup=False)
        if self.failure is not None:
            raise self.failure

    def request_stop(self) -> None:
        """Make :meth:`wait` return (safe from any thread and from signal handlers)."""
        self._stop_requested.set()

    def raise_for_exited(self, during_startup: bool = False) -> None:
        """Raise :class:`ServerLaunchError` naming the first server whose process has exited."""
        for server in self.servers:
            if server.popen is None:
                continue
            code = exit_code(server.popen)
            if code is None:
                continue
            if server.reader is not None:
                server.reader.join(timeout=2)  # let its last words reach the log before quoting it
            when = "during startup" if during_startup else "unexpectedly"
            raise ServerLaunchError(
                f"server {server.name!r} ({server.label}) {describe_exit(code)} {when}. {tail_text(server.sink)}"
            )

    def stop(self) -> None:
        """SIGTERM every server group, wait up to the grace period, SIGKILL the rest, stop the head server."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        self._stop_requested.set()
        if self._supervisor is not None:
            self._supervisor.stop()  # first: the exits that follow are not crashes
        for build in self._builds:
            build.kill_running()
        with self._spawn_lock:  # a restart in progress has finished; none starts after this
            popens = [s.popen for s in self.servers if s.popen is not None]
        if popens:
            with second_signal_forces(self._force):
                stop_process_groups(popens, self.shutdown_grace_s, self._force)
        for server in self.servers:
            if server.reader is not None:
                server.reader.join(timeout=2)
            if server.popen is not None:
                server.sink.note(f"stopped ({describe_exit(server.popen.returncode)})", echo=False)
            server.sink.close()
        if self.head is not None:
            self.head.stop()
            access.forget([*self.urls.values(), self.head.url])
        if self._token_path is not None and self._token is not None:
            access.remove_token_file(self._token_path, self._token)
        if self._reaper is not None:
            self._reaper.release()
        if self.config_path is not None:
            remove_run_files(self.config_path)
        if not self._released_ports:  # failed before the children took the sockets over
            ports.release_all()
            self._released_ports = True

    # ----------------------------------------------------------------------------------------------------------------
    # Steps of start()

    def _plan(self) -> None:
        """Find each instance's directory and entrypoint and make sure it holds a reserved port."""
        if not self._instances:
            raise ConfigError("the config defines no server instances to start")
        for index, instance in enumerate(self._instances):
            if instance.name in self._external:
                continue
            inner = self._data[instance.name][instance.SERVER_TYPE][instance.implementation]
            impl_dir, root, entrypoint = find_implementation(instance, inner)  # checked as `gym env validate` does
            check_replicas(instance, inner, self.places_replicas)
            host = str(inner.get("host") or self._data.get("default_host") or "127.0.0.1")
            reservation = ports.get_reservation(instance.name)
            if reservation is None:  # composed without reserve_ports: take the port now
                reservation = ports.reserve_port(instance.name, host, inner.get("port") or None)
            if (inner.get("host"), inner.get("port")) != (host, reservation.port):
                inner["host"], inner["port"] = host, reservation.port
                self._instances[index] = _readdressed(instance.name, self._data[instance.name])
            sink = LogSink(instance.name, self.log_dir / f"{instance.name}.log", self.echo, self._mask_log_line)
            self.servers.append(
                ServerProcess(
                    instance.name, instance.SERVER_TYPE, instance.implementation, host, reservation.port,
                    impl_dir, root, entrypoint, sink,
                )
            )  # fmt: skip

    def _start_head_server(self) -> None:
        head = self._data.setdefault("head_server", {})
        host = str(head.get("host") or self._data.get("default_host") or "127.0.0.1")
        sock = bind_head_socket(host, int(head.get("port", 11000)))
        head["host"], head["port"] = host, sock.getsockname()[1]  # port 0 = any free port (tests)
        self.config_path = self._write_config()
        if self._token is not None:
            self._token_path = access.token_file(host, head["port"])
            access.write_token_file(self._token_path, self._token)
        app = build_head_app(masked_config_yaml(self.config, self._secrets), self.server_instances, self._token)
        self.head = HeadServer(app, sock)
        access.register(
            self._token, [*self.urls.values(), self.head.url]
        )  # this process's own calls: probes, collector
        self.head.start()

    def _write_config(self) -> Path:
        """The resolved config, secrets included, readable by this user only, next to its owner record; leftovers of
        dead launchers are swept first (see ``reaper.py``)."""
        run_root = self.results_dir / "run"
        run_root.mkdir(parents=True, exist_ok=True)
        for swept in sweep_dead_runs(run_root):
            if self.echo:
                print(f"[nemo-gym] removed a dead launcher's config file in {swept}", file=sys.stderr, flush=True)
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        attempt = 0
        while True:
            run_dir = run_root / (stamp if attempt == 0 else f"{stamp}-{attempt}")
            try:
                run_dir.mkdir(mode=0o700)
                break
            except FileExistsError:  # another launch of this process in the same second
                attempt += 1
        write_owner(run_dir)
        path = run_dir / CONFIG_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        token = {access.RUN_TOKEN_KEY: self._token} if self._token else {}
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(OmegaConf.to_yaml(OmegaConf.create({**self._data, **token})))
        return path

    def _prepare_interpreters(self, deadline: float) -> None:
        """Shared mode: this interpreter for all. Otherwise one venv per implementation, built in parallel."""
        if self.shared_venv:
            for server in self.servers:
                server.python = sys.executable
                server.sink.note(f"shared venv: running with {sys.executable}")
            return
        python_version = str(self._data.get("python_version") or platform.python_version())
        groups: dict[Path, list[ServerProcess]] = {}
        for server in self.servers:
            try:
                server.venv = venv_spec(
                    server.server_type, server.implementation, server.impl_dir, self.cache_dir, python_version
                )
            except ConfigError as e:
                raise ConfigError(f"server {server.name!r}: {e}") from e
            groups.setdefault(server.venv.path, []).append(server)
        uv_cache_dir = self._data.get("uv_cache_dir")
        verbose = bool(self._data.get("pip_install_verbose"))
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(4, len(groups))) as pool:
            futures: dict[concurrent.futures.Future, list[ServerProcess]] = {}
            for members in groups.values():
                ctx = BuildContext(log=_fan_out(members), uv_cache_dir=uv_cache_dir, verbose=verbose)
                self._builds.append(ctx)
                futures[pool.submit(build_venv, members[0].venv, ctx)] = members  # type: ignore[arg-type]
            try:
                self._await_builds(futures, deadline)
            except BaseException:
                for build in self._builds:
                    build.kill_running()
                raise

    def _await_builds(self, futures: dict[concurrent.futures.Future, list[ServerProcess]], deadline: float) -> None:
        pending = set(futures)
        while pending:
            done, pending = concurrent.futures.wait(pending, timeout=0.5, return_when="FIRST_COMPLETED")
            for future in done:
                members = futures[future]
                error = future.exception()
                if error is not None:
                    names = ", ".join(repr(m.name) for m in members)
                    raise ServerLaunchError(
                        f"server {names}: building its venv ({members[0].label}) failed: {error}. "
                        f"{tail_text(members[0].sink)}"
                    ) from error
                for member in members:
                    member.python = str(future.result())
            if pending and time.monotonic() > deadline:
                members = futures[next(iter(pending))]
                raise ServerLaunchError(
                    f"server {members[0].name!r} did not become ready in {self.startup_timeout_s:g} s: its venv "
                    f"({members[0].label}) was still being built. Raise +server_startup_timeout_seconds=<s>. "
                    f"{tail_text(members[0].sink)}"
                )

    def _spawn_all(self) -> None:
        assert self.config_path is not None
        self._reaper = Reaper(self.config_path)  # stops the servers if this process dies without doing it
        for server in spawn_order(self.servers):
            reservation = ports.get_reservation(server.name)
            assert reservation is not None
            self._spawn(server, reservation.fileno())
        # The children hold the listening sockets now; the launcher's copies would only keep ports busy after them.
        ports.release_all()
        self._released_ports = True

    def _spawn(self, server: ServerProcess, listen_fd: int) -> None:
        """Start one server's process on the listening socket ``listen_fd``, its output read into its log."""
        assert server.python is not None and self._reaper is not None
        env = self._child_env(server, listen_fd)
        server.sink.note(f"starting {server.python} {server.entrypoint} on {server.url}")
        try:
            server.popen = spawn([server.python, str(server.entrypoint)], cwd=server.impl_dir, env=env,
                                 pass_fds=[listen_fd])  # fmt: skip
        except OSError as e:
            raise ServerLaunchError(f"server {server.name!r}: cannot start {server.python}: {e}") from e
        self._reaper.watch(server.popen.pid)
        server.started_at = datetime.now(UTC).isoformat(timespec="seconds")
        assert server.popen.stdout is not None
        server.reader = threading.Thread(
            target=read_lines_into, args=(server.popen.stdout, [server.sink]), name=f"log-{server.name}", daemon=True
        )
        server.reader.start()

    def _respawn(self, server: ServerProcess) -> None:
        """Start a dead server again on its own address (the supervisor's restarts)."""
        with self._spawn_lock:
            if self._stop_requested.is_set():
                raise ServerLaunchError("the launch is stopping")
            try:
                reservation = ports.reserve_port(server.name, server.host, server.port)
            except ConfigError as e:
                raise ServerLaunchError(str(e)) from e
            try:
                self._spawn(server, reservation.fileno())
            finally:
                ports.release(server.name)

    def _supervise(self) -> None:
        """Restart servers that die or freeze from now on (``launcher/supervisor.py``), unless switched off. Servers
        placed on a Ray cluster run under their node's agent, not as children of this process: not supervised."""
        if not self.supervision.enabled or any(server.popen is None for server in self.servers):
            return
        self._supervisor = Supervisor(
            self.servers,
            self.supervision,
            respawn=self._respawn,
            give_up=self._given_up,
            startup_timeout_s=self.startup_timeout_s,
        )
        self._supervisor.start()

    def _given_up(self, error: ServerLaunchError) -> None:
        if self.failure is None:
            self.failure = error
        self._stop_requested.set()  # wait() raises it
        if self.interrupt_main_on_failure:
            _thread.interrupt_main()  # running_servers turns the interrupt into the error

    def _child_env(self, server: ServerProcess, listen_fd: int) -> dict[str, str]:
        env = child_env(dict(os.environ))  # --search-dir roots reach the child as NEMO_GYM_EXTRA_ROOTS
        env.pop(NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME, None)
        env[NEMO_GYM_CONFIG_FILE_ENV_VAR_NAME] = str(self.config_path)
        env[NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME] = server.name
        env[ports.LISTEN_FD_ENV_VAR] = str(listen_fd)
        env["PYTHONPATH"] = server_pythonpath(server.impl_dir, server.root, os.environ.get("PYTHONPATH"))
        env["PYTHONUNBUFFERED"] = "1"
        if server.venv is not None:
            env["VIRTUAL_ENV"] = str(server.venv.path)
            env["PATH"] = os.pathsep.join([str(server.venv.path / "bin"), env.get("PATH", "")])
        return env

    async def _wait_until_ready(self, deadline: float) -> None:
        started = time.monotonic()
        next_progress = started + _PROGRESS_EVERY_S
        delay = 0.1
        while True:
            self.raise_for_exited(during_startup=True)
            if self._stop_requested.is_set():
                raise KeyboardInterrupt
            pending = [s for s in self.servers if not s.ready]
            results = await asyncio.gather(*(probe_health(s, _PROBE_TIMEOUT_S) for s in pending))
            for server, health in zip(pending, results, strict=True):
                if health is Health.OK:
                    server.ready = True
                    server.sink.note(f"ready on {server.url}")
            if all(s.ready for s in self.servers):
                return
            now = time.monotonic()
            if now > deadline:
                late = next(s for s in self.servers if not s.ready)
                raise ServerLaunchError(
                    f"server {late.name!r} ({late.label}) did not become ready in {self.startup_timeout_s:g} s "
                    f"(no HTTP 200 on GET {late.url}/). Raise +server_startup_timeout_seconds=<s> if it is just "
                    f"slow. {tail_text(late.sink)}"
                )
            if self.echo and now >= next_progress:
                names = ", ".join(s.name for s in self.servers if not s.ready)
                print(f"[nemo-gym] waiting for {names} ({now - started:.0f} s)", flush=True)
                next_progress = now + _PROGRESS_EVERY_S
            await asyncio.sleep(min(delay, max(0.0, deadline - now)))
            delay = min(delay * 1.5, 1.0)


# --------------------------------------------------------------------------------------------------------------------
# Helpers


@contextlib.contextmanager
def running_servers(
    overrides: Sequence[str] | None = None,
    *,
    config: ComposedConfig | DictConfig | None = None,
    echo: bool = False,
    startup_timeout_s: float | None = None,
    shutdown_grace_s: float = SHUTDOWN_GRACE_S,
    external: Collection[str] = (),
) -> Iterator[Launcher]:
    """Start every server of a config, wait until all are ready, yield the launcher, stop them all on exit.

    ``config`` is an already composed config; otherwise ``overrides`` are composed with ports reserved. Enter and exit
    it from a thread that outlives the servers (children are tied to the launcher process, see ``processes.py``).
    ``external`` names instances the caller already serves at their configured host and port: they are not spawned.
    """
    if config is None:
        config = compose(
            ComposeOptions(overrides=list(overrides or []), reserve_ports=True, require_server_instances=True)
        )
    launcher = new_launcher(
        config, echo=echo, startup_timeout_s=startup_timeout_s, shutdown_grace_s=shutdown_grace_s, external=external
    )
    launcher.interrupt_main_on_failure = threading.current_thread() is threading.main_thread()
    with sigterm_as_interrupt():
        launcher.start()
        try:
            yield launcher
        except KeyboardInterrupt:
            if launcher.failure is not None:  # a server was given up on: that is why the caller was interrupted
                raise launcher.failure from None
            raise
        finally:
            launcher.stop()


def spawn_order(servers: Sequence[ServerProcess]) -> list[ServerProcess]:
    """Config order, except that environment servers come last: they front the agents and resources servers, which
    are then already starting when they do."""
    return sorted(servers, key=lambda server: server.server_type == "environment_servers")


def new_launcher(config: ComposedConfig | DictConfig, **options: Any) -> Launcher:
    """A :class:`Launcher`, or with ``ray_head_node_address`` set the one that places servers on that Ray cluster
    (the only path that imports Ray)."""
    composed = ComposedConfig.of(config)
    address = composed.config.get(RAY_ADDRESS_KEY)
    if not address:
        return Launcher(composed, **options)
    from nemo_gym.launcher.ray_placement import RayLauncher

    return RayLauncher(composed, str(address), **options)


def _readdressed(name: str, block: dict[str, Any]) -> ServerInstanceConfig:
    """The instance ``name`` again, after the launcher gave it the address it now has in ``block``."""
    instance, error = maybe_get_server_instance_config(name, block)
    if instance is None:
        raise ConfigError(f"server {name!r}: {error}")
    return instance


def _fan_out(members: list[ServerProcess]) -> Callable[[bytes], None]:
    """Build output goes to the log of every instance sharing the venv, echoed once."""

    def log(line: bytes) -> None:
        for i, member in enumerate(members):
            member.sink.write(line, echo=i == 0)

    return log


def _run_async(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from sync code, also when the calling thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())  # type: ignore[arg-type]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()  # type: ignore[arg-type]
