"""A circuit breaker per server: a dead or frozen server pauses the run instead of burning every rollout's attempts.

A rollout failure *points at a server* when the collector could not reach the agent (connection error, timeout) or
the agent answered 502 naming an upstream hop it could not reach or that did not answer in time
(``upstream_status`` empty, or ``upstream_timeout``). Such a failure is not charged until the server has been asked:

* one health probe (``GET /`` with a short timeout; any HTTP answer counts as alive, a 401 included) decides. Probes
  of one server are shared: 64 rollouts failing at once cost one probe;
* the server answers: the failure belongs to the rollout (a slow rollout, a request the server rejected) and is
  charged as before;
* it does not: the server is *down*. One line names it, dispatch of new rollouts stops, the server is probed every
  ``probe_interval_s`` and the rollouts that failed because of it run again once it is back (each worker keeps its
  row, so at most ``concurrency`` rows wait). Not back within ``deadline_s``: :class:`ServersDownError`, the run stops
  with the untried rollouts left untried, and ``--resume`` continues after a restart;
* ``threshold`` consecutive failures pointing at one server (no scored rollout in between) stop dispatch at once,
  while the probe is still out: with 64 rollouts in flight when a server dies, dozens fail within milliseconds, and
  without this each worker would take a fresh row to the dead server before the first probe comes back.

A scored rollout resets every count: it went through its agent, model and resources servers.

A server restarted under a run (the launcher's supervisor, ``launcher/supervisor.py``, restarts one that died or
froze, within a second or two) may already answer when the probe asks. Its health answer says when its process
started (``X-NeMo-Gym-Started-At``): started after the failed rollout did, the failure was the restart's, not the
rollout's, and the rollout runs again uncharged. The same holds for a failure that names no server (a tool call that
found its session gone with the old process): :meth:`Breakers.restarted_since` asks every server, once a second at
most, whether one of them started after the rollout.

Replicas (a launch on a Ray cluster, ``launcher/ray_placement.py``): servers of one ``group`` are copies of one
instance. A replica found down pauses nothing while a sibling is up: the collector's router (``rollouts/replicas.py``)
stops sending it rows, the rollouts it failed run again on a sibling (uncharged, as above), and past the deadline it
is left out for good instead of stopping the run. Only when every replica of a group is down does the run pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from nemo_gym.errors import TransportError
from nemo_gym.transport import access
from nemo_gym.transport.origins import origin_of
from nemo_gym.transport.types import STARTED_AT_HEADER

DEFAULT_THRESHOLD = 3
PROBE_TIMEOUT_S = 3.0
"""A health check answers in milliseconds even on a busy server (``GET /`` skips the admission queue), so 3 s without
an answer means the server is frozen or its machine overloaded beyond use."""
PROBE_INTERVAL_S = 1.0

KIND_NAMES = {"responses_api_models": "model server", "resources_servers": "resources server",
              "responses_api_agents": "agent server", "environment_servers": "environment server"}  # fmt: skip

Probe = Callable[[str], Awaitable[str | None]]
"""``probe(base_url)``: ``None`` when the server answered, else why not (``connection refused``, ...)."""

_NAMED = re.compile(r"server '([^']+)'")
_ADDRESS = re.compile(r"\(([^()\s]+:\d+)\)$|^([^\s()]+:\d+)$")


class ServersDownError(TransportError):
    """A server stayed down past the deadline: the run stopped, its untried rollouts left for ``--resume``."""


@dataclass(frozen=True)
class Server:
    """A server the collector's rollouts go through: its instance name, type (``responses_api_models``...) and URL."""

    name: str
    kind: str
    url: str
    group: str = ""
    """The instance this server is a replica of ("": not a replica)."""
    node: str = ""
    """The cluster node it runs on ("": this machine)."""

    def describe(self) -> str:
        return f"{KIND_NAMES.get(self.kind, 'server')} {self.name!r} at {self.url}"


@dataclass
class _Breaker:
    server: Server
    failures: int = 0
    """Consecutive failures pointing at this server, since the last scored rollout."""
    down_since: float | None = None
    reason: str = ""
    probe: asyncio.Future[str | None] | None = None
    """The probe in flight, shared by every failure that waits for its verdict."""
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)


class Breakers:
    """The breakers of one collection run, keyed by server name (a server known only by address: by that)."""

    def __init__(
        self,
        servers: list[Server],
        deadline_s: float,
        *,
        threshold: int = DEFAULT_THRESHOLD,
        probe: Probe | None = None,
        probe_interval_s: float = PROBE_INTERVAL_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self._servers = {server.name: server for server in servers}
        self._by_address = {server.url.split("://", 1)[-1]: server for server in servers}
        self._breakers: dict[str, _Breaker] = {}
        self.deadline_s = deadline_s
        self.threshold = threshold
        self._probe = probe or self._http_probe
        self._probe_interval_s = probe_interval_s
        self._probe_timeout_s = probe_timeout_s
        self._say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self._closed = asyncio.Event()
        self._closed.set()
        self._paused_by: set[str] = set()
        self._stopped: ServersDownError | None = None
        self._session: aiohttp.ClientSession | None = None
        self._started_at: dict[str, float] = {}
        """When each server's process started, by URL, as its last health answer said (servers that say it)."""
        self._census: asyncio.Future[None] | None = None
        self._census_at = -1.0

    # -- what the collector asks ---------------------------------------------------------------------------------

    def server_of(self, target: str) -> Server | None:
        """The server a transport error's target names (``server 'policy_model' (127.0.0.1:8000)`` or
        ``127.0.0.1:8000``); an address no config names is still probed, under that address."""
        named = _NAMED.search(target)
        if named and named.group(1) in self._servers:
            return self._servers[named.group(1)]
        address = _ADDRESS.search(target.strip())
        if address is None:
            return None
        host_port = address.group(1) or address.group(2)
        if host_port in self._by_address:
            return self._by_address[host_port]
        name = named.group(1) if named else host_port
        return Server(name, "", f"http://{host_port}")

    async def wait_until_closed(self) -> None:
        """Return when no server is down; raise :class:`ServersDownError` once one stayed down past the deadline."""
        while True:
            if self._stopped is not None:
                raise self._stopped
            if self._closed.is_set():
                return
            await self._closed.wait()

    def known_down(self, name: str) -> bool:
        """Whether the server ``name`` was found down and is not back (no probe: the router asks per row)."""
        breaker = self._breakers.get(name)
        return breaker is not None and breaker.down_since is not None

    def down_nodes(self) -> set[str]:
        """The nodes with a server found down: their other replicas are avoided too (a node is lost whole)."""
        return {b.server.node for b in self._breakers.values() if b.down_since is not None and b.server.node}

    def record_success(self) -> None:
        for breaker in self._breakers.values():
            breaker.failures = 0

    async def is_down(self, server: Server, since: float | None = None) -> bool:
        """Count a failure pointing at ``server`` and say whether the server is down (the failure is then not the
        rollout's). Waits for a probe unless the server is already known to be down. ``since``: when the failed
        rollout started (``time.time()``); a server that answers but started after it was restarted under the
        rollout, which counts as down too."""
        breaker = self._breakers.setdefault(server.name, _Breaker(server))
        breaker.failures += 1
        if breaker.down_since is not None:
            return True
        if breaker.failures >= self.threshold:
            self._pause(server.name)
        if breaker.probe is None:
            breaker.probe = asyncio.ensure_future(self._ask(server.url))
        probe = breaker.probe
        reason = await asyncio.shield(probe)
        if breaker.probe is probe:
            breaker.probe = None
        if reason is None:
            self._resume(server.name)
            return since is not None and self._started_at.get(server.url, 0.0) > since
        if breaker.down_since is None:
            self._went_down(breaker, reason)
        return True

    async def restarted_since(self, since: float) -> Server | None:
        """A server of the run whose process started after ``since`` (it was restarted), asking each at most once a
        second however many rollouts ask; None when none was (or none says when it started)."""
        if time.monotonic() - self._census_at >= self._probe_interval_s or self._census is None:
            if self._census is None or self._census.done():
                self._census = asyncio.ensure_future(self._take_census())
            await asyncio.shield(self._census)
        return next((s for s in self._servers.values() if self._started_at.get(s.url, 0.0) > since), None)

    async def _take_census(self) -> None:
        await asyncio.gather(*(self._ask(server.url) for server in self._servers.values()))
        self._census_at = time.monotonic()

    async def aclose(self) -> None:
        for breaker in self._breakers.values():
            for task in (breaker.watcher, breaker.probe):
                if task is not None and not task.done():
                    task.cancel()
        if self._census is not None and not self._census.done():
            self._census.cancel()
        if self._session is not None:
            await self._session.close()

    # -- state changes -------------------------------------------------------------------------------------------

    def _has_live_sibling(self, name: str) -> bool:
        server = self._servers.get(name)
        if server is None or not server.group:
            return False
        siblings = [s for s in self._servers.values() if s.group == server.group and s.name != name]
        return any(not self.known_down(s.name) for s in siblings)

    def _pause(self, name: str) -> None:
        if self._has_live_sibling(name):
            return  # the router sends its rows to the siblings
        self._paused_by.add(name)
        self._closed.clear()

    def _resume(self, name: str) -> None:
        self._paused_by.discard(name)
        if not self._paused_by:
            self._closed.set()

    def _went_down(self, breaker: _Breaker, reason: str) -> None:
        breaker.down_since, breaker.reason = time.monotonic(), reason
        if self._has_live_sibling(breaker.server.name):
            self._say(
                f"{breaker.server.describe()} is down ({reason}): its rollouts go to the other replicas of "
                f"{breaker.server.group!r} (failures it caused are not charged)"
            )
            breaker.watcher = asyncio.ensure_future(self._watch(breaker))
            return
        self._pause(breaker.server.name)
        self._say(
            f"{breaker.server.describe()} is down ({reason}): pausing rollouts, probing its health every "
            f"{self._probe_interval_s:g} s for up to {self.deadline_s:g} s (failures it caused are not charged) ..."
        )
        breaker.watcher = asyncio.ensure_future(self._watch(breaker))

    async def _watch(self, breaker: _Breaker) -> None:
        """Probe a down server until it answers (resume) or the deadline passes (stop the run)."""
        assert breaker.down_since is not None
        while True:
            await asyncio.sleep(self._probe_interval_s)
            reason = await self._ask(breaker.server.url)
            waited = time.monotonic() - breaker.down_since
            if reason is None:
                self._say(f"{breaker.server.describe()} is back after {waited:.0f} s: resuming rollouts")
                breaker.down_since, breaker.failures = None, 0
                self._resume(breaker.server.name)
                return
            breaker.reason = reason
            if waited >= self.deadline_s and self._has_live_sibling(breaker.server.name):
                self._say(f"{breaker.server.describe()} is still down after {waited:.0f} s: left out of this run")
                return
            if waited >= self.deadline_s:
                self._stopped = ServersDownError(
                    f"{breaker.server.describe()} is still down after {self.deadline_s:g} s ({reason}): run stopped, "
                    "the rollouts not yet run are left untried (none charged an attempt); restart the server and "
                    "run the same command with --resume to continue (--server-down-deadline sets the wait)"
                )
                self._closed.set()  # wake every waiting worker: each raises the error
                return

    async def _ask(self, url: str) -> str | None:
        """The probe's verdict; a probe that fails in an unforeseen way counts as no answer, never ends the run."""
        try:
            return await self._probe(url)
        except Exception as e:  # any failure to get an answer means: not alive
            return f"probe failed: {type(e).__name__}: {e}"

    async def _http_probe(self, url: str) -> str | None:
        """``GET /`` outside the shared pool (whose connections to this server may all be taken by rollouts)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True),
                timeout=aiohttp.ClientTimeout(total=self._probe_timeout_s),
            )
        try:
            # With the run's token: a 401 says the server is alive, but only its own answer says when it started.
            headers = access.headers_for(origin_of(url), None)
            async with self._session.get(f"{url}/", headers=headers) as response:
                await response.read()
                started_at = response.headers.get(STARTED_AT_HEADER)
            if started_at:
                with contextlib.suppress(ValueError):
                    self._started_at[url] = float(started_at)
            return None
        except TimeoutError:
            return f"no answer within {self._probe_timeout_s:g} s"
        except aiohttp.ClientConnectorError as e:
            return _connect_failure(e)
        except aiohttp.ClientError as e:
            return f"{type(e).__name__}: {e}"


def _connect_failure(error: aiohttp.ClientConnectorError) -> str:
    os_error = error.os_error
    if isinstance(os_error, ConnectionRefusedError):
        return "connection refused"
    return (os_error.strerror or type(os_error).__name__).lower() if os_error else str(error)
