"""Keeping a launch's servers up: a server that exits or freezes is restarted on the same address.

Once every server of a launch is ready, :class:`Supervisor` watches each one from a thread of the launcher (one
asyncio loop, a task per server), by its process and by its health route (``GET /``, which skips admission, so even
a loaded server answers it in milliseconds):

* **exits** (any code, any signal) while the launcher has not asked it to stop: reaped at once (no zombie), told in
  one line with the end of its log, and started again on the same host and port after a backoff that doubles with
  each restart in a row. Rollouts that failed because of it are not charged: the collector's breaker
  (``rollouts/breaker.py``) pauses the run while the server is down and sees from its health answer that it was
  restarted, so the failed rollouts run again;
* **freezes** (takes the connection, does not answer): after ``frozen_after_probes`` unanswered probes it is told as
  frozen by name, within ~10 s with the defaults (per-call deadlines stay long for real generations; this is what
  notices a stopped process). It answers again: one line, nothing done. Still frozen after
  ``restart_frozen_after_s``: its process group is killed and it is restarted as above;
* **keeps dying**: more than ``max_restarts`` deaths in a row (a restart that then stays up ``stable_after_s`` ends a
  row), or a restart that does not become ready within the launch's start-up timeout: given up on with one line, and
  the launch fails with that line (``gym env start`` exits 1; ``gym eval run`` stops its collection with it).

The rules' settings are the ``server_supervision`` block (:class:`~nemo_gym.config.supervision.SupervisionConfig`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from nemo_gym.config.supervision import SupervisionConfig
from nemo_gym.launcher.processes import exit_code, kill_group
from nemo_gym.launcher.server_process import ServerLaunchError, ServerProcess, describe_exit
from nemo_gym.transport import access

__all__ = ["Health", "Supervisor", "probe_health"]

_LOG_TAIL_IN_LINE = 3
"""Log lines quoted in the one line that tells a restart."""
_MAX_QUOTE_CHARS = 300


class Health(enum.Enum):
    """What one ``GET /`` found."""

    OK = "answers"
    REFUSED = "refuses connections"
    NO_ANSWER = "took the connection but did not answer"
    BAD = "answered, not with 200"


async def probe_health(server: ServerProcess, timeout_s: float = 3.0) -> Health:
    """One ``GET /`` on a fresh connection, with the run's token, bounded by ``timeout_s`` once connected.

    Plain asyncio streams rather than the pooled client: the launcher needs nothing more, and not loading an HTTP
    client library keeps it (it lives as long as the servers) ~10 MB smaller.
    """
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(server.host, server.host)
    authority = f"{f'[{host}]' if ':' in host else host}:{server.port}"
    token = access.registered_token(f"http://{authority}/")
    head = f"GET / HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n"
    if token:
        head += f"{access.TOKEN_HEADER}: {token}\r\n"
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, server.port)
    except (OSError, TimeoutError):
        return Health.REFUSED
    try:
        async with asyncio.timeout(timeout_s):
            writer.write(f"{head}\r\n".encode("latin-1"))
            status_line = await reader.readline()
    except TimeoutError:
        return Health.NO_ANSWER
    except OSError:
        return Health.REFUSED
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    parts = status_line.split(None, 2)
    if not parts:
        return Health.REFUSED  # closed without a word: going down
    return Health.OK if parts[0].startswith(b"HTTP/") and parts[1:2] == [b"200"] else Health.BAD


@dataclass
class _Watch:
    """One server's record: restarts in a row, and since when it has not answered."""

    server: ServerProcess
    restarts_in_row: int = 0
    up_since: float = 0.0
    unanswered: int = 0
    frozen_since: float | None = None


class Supervisor:
    """Watches the local servers of a launch and restarts them; see the module docstring for the rules.

    ``respawn(server)`` starts a server's process again on its address (the launcher's; it raises if the launcher is
    stopping or the port is taken); ``give_up(error)`` is told once when a server is given up on.
    """

    def __init__(
        self,
        servers: list[ServerProcess],
        settings: SupervisionConfig,
        *,
        respawn: Callable[[ServerProcess], None],
        give_up: Callable[[ServerLaunchError], None],
        startup_timeout_s: float,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self._watches = [_Watch(s, up_since=time.monotonic()) for s in servers if s.popen is not None]
        self._settings = settings
        self._respawn = respawn
        self._give_up = give_up
        self._startup_timeout_s = startup_timeout_s
        self._say = say or _say
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="server-supervisor", daemon=True)

    def start(self) -> None:
        if self._watches:
            self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop watching (before the launcher stops the servers, so their exits are not taken for crashes)."""
        self._stopping.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(wake.set)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    # -- the loop ------------------------------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        tasks = [asyncio.ensure_future(self._watch(watch)) for watch in self._watches]
        await self._wake.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _pause(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; False when the supervisor is stopping."""
        assert self._wake is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, seconds)):
                await self._wake.wait()
        return not self._stopping.is_set()

    async def _watch(self, watch: _Watch) -> None:
        settings, server = self._settings, watch.server
        while not self._stopping.is_set():
            assert server.popen is not None
            code = exit_code(server.popen)
            if code is not None:
                if not await self._restart(watch, describe_exit(code)):
                    return
                continue
            started = time.monotonic()
            health = await probe_health(server, settings.probe_timeout_s)
            if self._stopping.is_set():
                return
            if health is Health.OK:
                self._answered(watch)
            elif exit_code(server.popen) is None:
                self._unanswered(watch, health)
                if self._frozen_too_long(watch):
                    assert watch.frozen_since is not None
                    kill_group(server.popen, signal.SIGKILL)
                    frozen_for = time.monotonic() - watch.frozen_since
                    if not await self._restart(watch, f"was frozen for {frozen_for:.0f} s and was killed"):
                        return
                    continue
            if not await self._pause(settings.probe_interval_s - (time.monotonic() - started)):
                return

    def _answered(self, watch: _Watch) -> None:
        now = time.monotonic()
        if watch.frozen_since is not None:
            self._tell(watch.server, f"answers again after {now - watch.frozen_since:.0f} s frozen")
        watch.unanswered, watch.frozen_since = 0, None
        if watch.restarts_in_row and now - watch.up_since >= self._settings.stable_after_s:
            watch.restarts_in_row = 0

    def _unanswered(self, watch: _Watch, health: Health) -> None:
        watch.unanswered += 1
        if watch.frozen_since is None and watch.unanswered >= self._settings.frozen_after_probes:
            watch.frozen_since = time.monotonic()
            limit = self._settings.restart_frozen_after_s
            then = (
                f"it is killed and restarted if still so after {limit:g} s (the rollouts it fails run again)"
                if limit
                else "it is not restarted (restart_frozen_after_s is off)"
            )
            self._tell(
                watch.server,
                f"is frozen: its process runs but it {health.value} on GET / {watch.unanswered} times in a row "
                f"({self._settings.probe_timeout_s:g} s each); {then}",
            )

    def _frozen_too_long(self, watch: _Watch) -> bool:
        limit = self._settings.restart_frozen_after_s
        return watch.frozen_since is not None and limit is not None and time.monotonic() - watch.frozen_since >= limit

    async def _restart(self, watch: _Watch, why: str) -> bool:
        """Reap the dead server and start it again until it is ready; False when given up on (or stopping)."""
        server, settings = watch.server, self._settings
        while True:
            await asyncio.to_thread(_reap, server)
            if self._stopping.is_set():
                return False
            if watch.restarts_in_row >= settings.max_restarts:
                self._fail(server, f"{why}; given up on after {watch.restarts_in_row} restarts in a row")
                return False
            watch.restarts_in_row += 1
            backoff = min(settings.backoff_s * 2 ** (watch.restarts_in_row - 1), settings.max_backoff_s)
            self._tell(
                server,
                f"{why}; restarting it on {server.url} in {backoff:g} s (restart {watch.restarts_in_row} in a row, "
                f"at most {settings.max_restarts}){_last_words(server)}",
            )
            if not await self._pause(backoff):
                return False
            began = time.monotonic()
            try:
                await asyncio.to_thread(self._respawn, server)
            except ServerLaunchError as e:
                self._fail(server, f"{why}; could not be restarted: {e}")
                return False
            why = await self._until_ready(server)
            if not why:
                watch.up_since, watch.unanswered, watch.frozen_since = time.monotonic(), 0, None
                self._tell(server, f"is back on {server.url} after {time.monotonic() - began:.1f} s")
                return True
            if self._stopping.is_set():
                return False
            if why.startswith("did not become ready"):
                self._fail(server, f"was restarted but {why}")
                return False

    async def _until_ready(self, server: ServerProcess) -> str:
        """Wait for the restarted server's first 200; "" once it answers, else what went wrong."""
        assert server.popen is not None
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            code = exit_code(server.popen)
            if code is not None:
                return f"{describe_exit(code)} while starting again"
            if await probe_health(server, self._settings.probe_timeout_s) is Health.OK:
                server.ready = True
                server.sink.note(f"ready on {server.url}", echo=False)
                return ""
            if not await self._pause(0.2):
                return "stopping"
        return f"did not become ready in {self._startup_timeout_s:g} s"

    # -- telling -------------------------------------------------------------------------------------------------

    def _tell(self, server: ServerProcess, what: str) -> None:
        line = f"[nemo-gym] server {server.name!r} ({server.label}) {what}"
        server.sink.note(what, echo=False)
        self._say(line)

    def _fail(self, server: ServerProcess, what: str) -> None:
        error = ServerLaunchError(f"server {server.name!r} ({server.label}) {what}{_last_words(server)}")
        self._tell(server, what)
        self._give_up(error)


def _reap(server: ServerProcess) -> None:
    """Kill what is left of a dead server's process group and collect its exit status (no zombie stays behind)."""
    assert server.popen is not None
    kill_group(server.popen, signal.SIGKILL)
    with contextlib.suppress(Exception):
        server.popen.wait(timeout=10)
    server.ready = False
    if server.reader is not None:
        server.reader.join(timeout=2)  # its last words reach the log before they are quoted


def _last_words(server: ServerProcess) -> str:
    lines = [line.strip() for line in server.sink.tail(_LOG_TAIL_IN_LINE) if line.strip()]
    if not lines:
        return ""
    quoted = " | ".join(lines)
    if len(quoted) > _MAX_QUOTE_CHARS:
        quoted = "…" + quoted[-_MAX_QUOTE_CHARS:]
    return f". Its log ({server.log_path or server.sink.path}) ends: {quoted}"


def _say(line: str) -> None:
    """One line on stderr, above a progress bar when the collector in this process draws one."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is not None:
        tqdm.tqdm.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr)
    sys.stderr.flush()
