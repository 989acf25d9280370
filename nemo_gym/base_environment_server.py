"""Environment servers: one episode end to end, behind ``POST /run`` (NeMo Gym 0.7's fourth server kind).

An environment server admits an episode (at most ``max_concurrent_episodes`` at once; one that waits longer than
``queue_timeout_seconds`` fails at the ``admission`` stage, retryably), runs :meth:`BaseEnvironmentServer.run` under
the episode deadline with the rollout id bound for correlation, and always unwinds the episode's
:class:`CleanupContext` (closing sessions it opened), even when the episode failed or was cancelled. It answers a
``result`` or a typed ``failure``: a :class:`HandledEpisodeError` becomes that failure as raised, a deadline a
retryable one, anything else a terminal one; every answer must echo the request's episode and task ids.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from anyio import CancelScope
from fastapi import FastAPI
from pydantic import ConfigDict, PositiveFloat, PositiveInt, PrivateAttr, model_validator

from nemo_gym.config.server_models import BaseRunServerInstanceConfig
from nemo_gym.episode_types import BaseEpisodeRequest, BaseEpisodeResponse, EpisodeFailure, EpisodeId
from nemo_gym.metrics import AggregateMetrics, AggregateMetricsRequest
from nemo_gym.observability.correlation import rollout_context
from nemo_gym.server_utils import SimpleServer

__all__ = [
    "BaseEnvironmentServer",
    "BaseEnvironmentServerConfig",
    "CleanupContext",
    "CleanupHandle",
    "HandledEpisodeError",
]

logger = logging.getLogger(__name__)

RequestT = TypeVar("RequestT", bound=BaseEpisodeRequest[Any])
ResponseT = TypeVar("ResponseT", bound=BaseEpisodeResponse[Any])
CleanupCallback = Callable[[], Awaitable[None]]


class BaseEnvironmentServerConfig(BaseRunServerInstanceConfig):
    """The episode limits every environment server has."""

    model_config = ConfigDict(extra="forbid")

    description: str | None = None
    """What the environment does, for ``gym list`` (the one key besides the limits that a catalog reads)."""
    max_concurrent_episodes: PositiveInt | None = None
    queue_timeout_seconds: PositiveFloat | None = None
    default_episode_timeout_seconds: PositiveFloat | None = None
    cleanup_timeout_seconds: PositiveFloat

    @model_validator(mode="after")
    def _queue_needs_timeout(self) -> BaseEnvironmentServerConfig:
        limited, bounded_wait = self.max_concurrent_episodes is not None, self.queue_timeout_seconds is not None
        if limited and not bounded_wait:
            raise ValueError("set queue_timeout_seconds too: an episode may not wait for admission forever")
        return self


@dataclass
class _Cleanup:
    """One registered callback; ``run_once`` calls it until it has succeeded once, then never again."""

    name: str
    callback: CleanupCallback
    _succeeded: bool = False
    _serial: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def run_once(self) -> None:
        async with self._serial:
            if self._succeeded:
                return
            await self.callback()
            self._succeeded = True


@dataclass
class CleanupHandle:
    """Runs one registered cleanup early (e.g. closing the agent before verifying); it then does not run again."""

    entry: _Cleanup
    timeout_seconds: float

    async def close(self) -> None:
        """Run the cleanup now, within ``timeout_seconds``."""
        await asyncio.wait_for(self.entry.run_once(), self.timeout_seconds)


@dataclass
class CleanupContext:
    """An episode's cleanups, run last-registered first within ``cleanup_timeout_seconds`` in all (each its share).

    Each runs at most once and must be safe to repeat remotely (a close that timed out may have happened). A failing
    one is logged and the rest still run. They live in this process only: whatever they release must also expire on
    its own if this process dies.
    """

    episode_id: EpisodeId
    cleanup_timeout_seconds: float
    _entries: list[_Cleanup] = field(default_factory=list)

    def register_cleanup(self, name: str, callback: CleanupCallback) -> CleanupHandle:
        self._entries.append(_Cleanup(name, callback))
        return CleanupHandle(self._entries[-1], self.cleanup_timeout_seconds)

    async def aclose(self) -> None:
        """Run what is left, last registered first. Each gets an equal share of the time still left, so one that
        hangs (a close sent to a server that died) cannot keep the others from releasing what they hold."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cleanup_timeout_seconds
        pending = list(reversed(self._entries))
        for position, entry in enumerate(pending):
            share = (deadline - loop.time()) / (len(pending) - position)
            try:
                async with asyncio.timeout(max(share, 0.0)):
                    await entry.run_once()
            except TimeoutError:
                logger.error("episode %s: cleanup %r did not finish in its %.1fs", self.episode_id.capture_key,
                             entry.name, share)  # fmt: skip
            except Exception:
                logger.exception("episode %s: cleanup %r failed", self.episode_id.capture_key, entry.name)


class HandledEpisodeError(Exception):
    """Raised inside :meth:`BaseEnvironmentServer.run` to answer this failure (its kind, stage and terminality)."""

    def __init__(self, failure: EpisodeFailure) -> None:
        super().__init__(failure.failure_reason)
        self.failure = failure


class BaseEnvironmentServer(SimpleServer, Generic[RequestT, ResponseT]):
    """Subclass it with ``request_model``/``response_model`` and implement :meth:`run` and :meth:`aggregate_metrics`."""

    config: BaseEnvironmentServerConfig
    request_model: ClassVar[type[Any]]
    response_model: ClassVar[type[Any]]
    _admission: asyncio.Semaphore | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        limit = self.config.max_concurrent_episodes
        self._admission = asyncio.Semaphore(limit) if limit is not None else None

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        self.add_episode_routes(app)
        return app

    def add_episode_routes(self, app: FastAPI) -> None:
        """``POST /run`` (the typed episode) and ``POST /aggregate_metrics``; a server with another ``/run``
        contract (a relay, a flat-row adapter) replaces this."""

        async def run(body: Any) -> Any:
            return await self.run_request(body)

        async def aggregate_metrics(body: AggregateMetricsRequest) -> AggregateMetrics:
            return await self.aggregate_metrics(body)

        run.__annotations__["body"] = self.request_model  # FastAPI validates the body as this server's request
        app.post("/run", response_model=self.response_model)(run)
        app.post("/aggregate_metrics")(aggregate_metrics)

    async def run_request(self, request: RequestT) -> ResponseT:
        """One episode under the shared rules (module docstring); what ``POST /run`` serves."""
        admitted = False
        if self._admission is not None:
            try:
                await asyncio.wait_for(self._admission.acquire(), timeout=self.config.queue_timeout_seconds)
            except TimeoutError:
                # NeMo Gym 0.7's exact reason (its folders' tests compare it); the wait is in the log line
                logger.warning("episode %s: not admitted within %ss", request.episode_id.capture_key,
                               self.config.queue_timeout_seconds)  # fmt: skip
                reason = "Episode admission timed out"
                return self.failure_response(request, EpisodeFailure(failure_reason=reason, terminal=False,
                                                                     stage="admission"))  # fmt: skip
            admitted = True
        cleanup = CleanupContext(request.episode_id, float(self.config.cleanup_timeout_seconds))
        deadline = asyncio.timeout(self.config.default_episode_timeout_seconds)
        try:
            with rollout_context(request.episode_id.capture_key):
                try:
                    async with deadline:
                        response = await self.run(request, cleanup)
                except TimeoutError as error:
                    if not deadline.expired():
                        response = self._unhandled(request, error)
                    else:
                        logger.warning("episode %s: did not finish in %ss", request.episode_id.capture_key,
                                       self.config.default_episode_timeout_seconds)  # fmt: skip
                        reason = "Episode timed out"  # 0.7's exact reason, as for admission
                        response = self.failure_response(request, EpisodeFailure(failure_reason=reason,
                                                                                 terminal=False))  # fmt: skip
                except HandledEpisodeError as error:
                    response = self.failure_response(request, error.failure)
                except Exception as error:
                    response = self._unhandled(request, error)
                finally:
                    with CancelScope(shield=True):  # a cancelled episode still closes what it opened
                        await cleanup.aclose()
        finally:
            if admitted and self._admission is not None:
                self._admission.release()
        response = self.response_model.model_validate(response)
        self.validate_response_identity(request, response)
        return response

    async def run(self, request: RequestT, cleanup: CleanupContext) -> ResponseT:
        """Run one episode; register what must be released with ``cleanup.register_cleanup`` before opening it."""
        raise NotImplementedError(f"{type(self).__name__} must implement run()")

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """The run's metrics from its scored rows (usually asked of the resources server that verified them)."""
        raise NotImplementedError(f"{type(self).__name__} must implement aggregate_metrics()")

    def failure_response(self, request: RequestT, failure: EpisodeFailure) -> ResponseT:
        """The answer for ``failure``, with the request's ids."""
        return self.response_model.model_validate(
            {
                "episode_id": request.episode_id,
                "task_id": request.task.task_id,
                "failure": failure.model_dump(mode="json"),
            }
        )

    def _unhandled(self, request: RequestT, error: Exception) -> ResponseT:
        logger.exception("episode %s: %s failed", request.episode_id.capture_key, type(self).__name__)
        reason = f"{type(error).__name__}: {error}"[:2000]
        return self.failure_response(request, EpisodeFailure(failure_reason=reason, terminal=True))

    @staticmethod
    def validate_response_identity(request: RequestT, response: ResponseT) -> None:
        """An answer for another episode or task is a bug in the server, never a result to store."""
        if response.episode_id != request.episode_id:
            raise ValueError("the episode response's episode_id is not the request's")
        if response.task_id != request.task.task_id:
            raise ValueError("the episode response's task_id is not the request's")
