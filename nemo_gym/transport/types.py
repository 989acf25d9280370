"""The transport's settings and errors, apart from the transport itself.

Kept free of aiohttp so that a server which never calls another one (most resources servers, a mock model) can
register error handlers and read pool settings without importing the HTTP client: that saves ~10 MB per process.
:mod:`nemo_gym.transport.http_client` re-exports everything here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.errors import TransportError

__all__ = [
    "LOOP_LAG_HEADER",
    "STARTED_AT_HEADER",
    "UPSTREAM_FAILURE_HEADER",
    "ServerRequestError",
    "ServerTimeoutError",
    "TransportConfig",
    "TransportError",
    "get_default_config",
    "set_default_config",
]


STARTED_AT_HEADER = "X-NeMo-Gym-Started-At"
"""On a server's health answer (``GET /``): when its process started (seconds since the epoch). A failure that a
restart of that server caused is told apart by it: the server answers, but started after the rollout did."""
LOOP_LAG_HEADER = "X-NeMo-Gym-Loop-Lag"
"""On a health answer to ``GET /?loop_lag=1``: seconds the server's event loop took to come back to the handler after
one yield (the work queued ahead of it), what ``gym env loadtest`` reports as the server's event-loop lag."""
UPSTREAM_FAILURE_HEADER = "X-NeMo-Gym-Upstream-Failure"
"""Set on the 502 a server of ours answers when a call it made to another server failed. Such a 502 is that server's
answer, after it may have done part of the work (an agent's rollout), not a gateway's "nothing was done": the
transport never retries it."""


class TransportConfig(BaseModel):
    """Timeouts, retry budget and connection-pool sizes of the transport.

    Timeout and retry fields apply per call (``request(config=...)``). Pool fields (``limit``, ``limit_per_host``,
    ``keepalive_timeout_s``, ``dns_cache_ttl_s``, ``tcp_keepalive_*``) are read once, from the process default
    (:func:`set_default_config`), when an event loop's session is created.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    connect_timeout_s: float = Field(default=10.0, gt=0)
    """Limit on opening one TCP connection. Waiting for a free pooled connection is not counted here (only the total
    deadline bounds it), so a saturated pool queues instead of failing."""

    total_timeout_s: float = Field(default=600.0, gt=0)
    """Deadline for the whole call: every attempt, backoff sleep and body read. Long because model calls can be."""

    max_attempts: int = Field(default=4, ge=1)
    """Attempts in all, the first one included."""

    backoff_base_s: float = Field(default=0.2, ge=0)
    """Upper bound of the first backoff sleep; doubles per attempt (full jitter: the sleep is uniform in [0, bound])."""

    backoff_cap_s: float = Field(default=5.0, ge=0)
    """Ceiling of the backoff bound, so late retries do not wait for minutes."""

    retry_after_cap_s: float = Field(default=30.0, ge=0)
    """Ceiling on a server's ``Retry-After``, so a misconfigured server cannot park a rollout for hours."""

    limit: int = Field(default=16384, ge=1)
    """Open connections per process and event loop, all destinations together. Stays under common fd hard limits
    (20k) while leaving room for inbound sockets."""

    limit_per_host: int = Field(default=1024, ge=1)
    """Open connections to one (host, port); beyond it requests wait in the pool (FIFO, no socket held) instead of
    opening more sockets. Every open connection costs memory on both ends (~20 KB here, ~10 KB in the server) and a
    descriptor each, while a server on 2 cores gains nothing from more than a few hundred requests at once: with 4096
    rollouts in flight, 1024 per host cut the stack's memory by ~100 MB at the same throughput. Raise it (config key
    ``global_aiohttp_connector_limit_per_host``) for a model server that really batches more requests than that."""

    keepalive_timeout_s: float = Field(default=4.0, gt=0)
    """How long an idle pooled connection may be reused. Kept below uvicorn's default server keep-alive (5 s) so the
    client always drops an idle socket before the server does, avoiding "server disconnected" on reuse."""

    dns_cache_ttl_s: int = Field(default=10, ge=0)
    """Seconds a resolved host name is cached (multi-node setups use host names; loopback needs no lookup)."""

    tcp_keepalive_idle_s: int = Field(default=60, ge=1)
    """Idle seconds before the kernel probes a silent connection, so a peer that vanished is detected."""

    tcp_keepalive_interval_s: int = Field(default=10, ge=1)
    """Seconds between kernel keep-alive probes."""

    tcp_keepalive_count: int = Field(default=3, ge=1)
    """Unanswered probes after which the kernel declares the connection dead."""


class ServerRequestError(TransportError):
    """A call failed: connection error, retries exhausted, or a non-2xx status passed to :func:`raise_for_status`."""

    def __init__(
        self,
        message: str,
        *,
        server: str = "",
        url_path: str = "",
        status: int | None = None,
        attempts: int = 1,
        body_snippet: str = "",
    ) -> None:
        super().__init__(message)
        self.server = server
        self.url_path = url_path
        self.status = status
        self.attempts = attempts
        self.body_snippet = body_snippet


class ServerTimeoutError(TransportError):
    """A call ran past its deadline (or could not connect in time). Never retried once the request may have been
    delivered, because the server may have acted on it."""

    def __init__(
        self,
        message: str,
        *,
        server: str = "",
        url_path: str = "",
        timeout_s: float = 0.0,
        attempts: int = 1,
    ) -> None:
        super().__init__(message)
        self.server = server
        self.url_path = url_path
        self.timeout_s = timeout_s
        self.attempts = attempts


_default_config = TransportConfig()


def set_default_config(config: TransportConfig) -> None:
    """Set the process-wide default; pool fields only affect sessions created after this call."""
    global _default_config
    _default_config = config


def get_default_config() -> TransportConfig:
    """Return the process-wide default used when a call passes no ``config``."""
    return _default_config
