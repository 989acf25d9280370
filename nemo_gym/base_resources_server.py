"""Resources servers: an environment's tools, its per-rollout state and its verifier.

A resources server adds one route per tool in ``setup_webserver()`` (the route name is the function tool's name, the
request body is the parsed tool-call arguments, the response JSON is the tool output the model sees), and implements
``verify()``, which scores a finished trajectory. Per-rollout state is keyed by ``request.session["session_id"]``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar, Generic, TypeVar

from fastapi import Body, FastAPI
from pydantic import BaseModel, ConfigDict, field_validator

from nemo_gym.config.server_models import BaseRunServerInstanceConfig
from nemo_gym.episode_types import EpisodeId as _EpisodeId
from nemo_gym.episode_types import TaskId as _TaskId
from nemo_gym.failure_kinds import validate_failure_kind as _validate_failure_kind
from nemo_gym.judge import judge_failsafe as _judge_failsafe
from nemo_gym.mcp_exposure import METADATA_KEY as _MCP_METADATA_KEY
from nemo_gym.mcp_exposure import SESSION_TOKEN_HEADER as _SESSION_TOKEN_HEADER
from nemo_gym.mcp_exposure import expose_tools_over_mcp as _expose_tools_over_mcp
from nemo_gym.metrics import (
    AggregateMetrics,
    AggregateMetricsRequest,
    aggregate_verify_responses,
)
from nemo_gym.metrics import aggregate_with_hooks as _aggregate_with_hooks
from nemo_gym.metrics import every_mean as _every_mean
from nemo_gym.metrics import key_picker as _key_picker
from nemo_gym.observability.correlation import RolloutContextMiddleware as _RolloutContextMiddleware
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.resources_sessions import (
    MCPServerMetadata,
    ResourcesCloseSessionRequest,
    ResourcesCloseSessionResponse,
    ResourcesSeedSessionRequest,
    ResourcesSeedSessionResponse,
)
from nemo_gym.resources_sessions import add_session_routes as _add_session_routes
from nemo_gym.server_utils import SimpleServer

__all__ = [
    "AggregateMetrics",
    "AggregateMetricsRequest",
    "BaseMultiRewardVerifyResponse",
    "BaseResourcesServerConfig",
    "BaseRunRequest",
    "BaseRunServerInstanceConfig",
    "BaseSeedSessionRequest",
    "BaseSeedSessionResponse",
    "BaseVerifyRequest",
    "BaseVerifyResponse",
    "Body",
    "MCPServerMetadata",
    "MetricsHooks",
    "NEMO_GYM_MCP_METADATA_KEY",
    "NEMO_GYM_MCP_SESSION_TOKEN_HEADER",
    "NeMoGymResponse",
    "NeMoGymResponseCreateParamsNonStreaming",
    "ResourcesCloseSessionRequest",
    "ResourcesCloseSessionResponse",
    "ResourcesSeedSessionRequest",
    "ResourcesSeedSessionResponse",
    "ResourcesVerifyRequest",
    "ReverifyMode",
    "SimpleResourcesServer",
    "SimpleServer",
    "aggregate_verify_responses",
]

NEMO_GYM_MCP_METADATA_KEY = _MCP_METADATA_KEY
"""The key of a ``/seed_session`` answer that carries a rollout's MCP connection details."""
NEMO_GYM_MCP_SESSION_TOKEN_HEADER = _SESSION_TOKEN_HEADER
"""The header an MCP client sends to name its rollout's session on ``/mcp``."""


class ReverifyMode(StrEnum):
    """What ``GET /reverify_mode`` answers; a plain string such as ``"stateless"`` compares and serializes equal."""

    STATELESS = "stateless"
    UNSUPPORTED = "unsupported"
    UNKNOWN = "unknown"


class BaseResourcesServerConfig(BaseRunServerInstanceConfig):
    REVERIFY_MODE: ClassVar[ReverifyMode | str] = ReverifyMode.UNKNOWN
    """Whether ``/verify`` can be re-run on a stored rollout without replaying its tool calls."""

    expose_tools_over_mcp: bool = False
    """Also serve the tool routes over MCP at ``/mcp``, one rollout session per token (:mod:`nemo_gym.mcp_exposure`)."""

    allowed_agents: list[str] | None = None
    """The agent types (agent folder names) that score this environment correctly; None accepts any. An agent of
    another type bound to it is refused when the config is composed (NeMo Gym 0.7; ``allow_unsupported_pairing``)."""

    allowed_model_types: list[str] | None = None
    """Likewise for the model server types (``vllm_model``, ...) its agents may use as the policy."""

    @field_validator("allowed_agents", "allowed_model_types", mode="before")
    @classmethod
    def _one_name_is_a_list(cls, value: Any) -> Any:
        """``++...allowed_agents=simple_agent`` on the command line arrives as one string."""
        return [value] if isinstance(value, str) else value


class BaseSeedSessionRequest(BaseModel):
    """The task row, as sent by the agent before the first model call; subclasses declare the fields they need."""


class BaseSeedSessionResponse(BaseModel):
    pass


class BaseVerifyRequest(BaseModel):
    """The task row plus the model's final ``response``; subclasses declare task fields such as ``expected_answer``."""

    responses_create_params: NeMoGymResponseCreateParamsNonStreaming
    response: NeMoGymResponse


# Environments build the answer as ``XVerifyResponse(**body.model_dump(), ...)``, which validates the dumped request
# again in full (about as much CPU as parsing the request). No shortcut is taken there: the answer's nested models are
# new objects and every dumped field counts as set (``model_dump(exclude_unset=True)`` of the answer keeps the defaults
# the request left out), and code written for NeMo Gym may rely on either. Reusing the request's models would change
# both; copying them in Python costs more than pydantic-core's validation. (A comment, not a docstring: a docstring
# would become the model's description in the JSON schema.)
class BaseVerifyResponse(BaseVerifyRequest):
    reward: float
    # True when the reward measures the environment's failure, not the policy (a lost session, a judge that could
    # not be asked): evaluation and training leave the sample out. Independent of failure_kind.
    mask_sample: bool = False
    # The kind of failure from nemo_gym.failure_kinds (a metric label); failure_reason is the occurrence's detail.
    failure_kind: str | None = None
    failure_reason: str | None = None

    @field_validator("failure_kind")
    @classmethod
    def _shared_failure_kind(cls, value: str | None) -> str | None:
        return _validate_failure_kind(value)


class BaseMultiRewardVerifyResponse(BaseVerifyResponse):
    reward_components: dict[str, float]


_VerificationInputT = TypeVar("_VerificationInputT")


class ResourcesVerifyRequest(BaseModel, Generic[_VerificationInputT]):
    """A typed verification body for environments whose output is not a Responses trajectory."""

    model_config = ConfigDict(extra="forbid")

    episode_id: _EpisodeId
    task_id: _TaskId
    verification_input: _VerificationInputT


class BaseRunRequest(BaseModel):
    """One dataset row sent to an agent's ``/run``: the create params plus any task fields."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: NeMoGymResponseCreateParamsNonStreaming


class MetricsHooks:
    """``compute_metrics`` / ``get_key_metrics``: what a server overrides to shape its ``/aggregate_metrics``."""

    def compute_metrics(self, tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        """Extra agent metrics from every verify response at once; ``tasks[i]`` holds the rollouts of task ``i``.

        For metrics that need the whole set (pass@k, majority@k, confidence intervals). A ``per_task_metrics`` list
        (dicts with ``_ng_task_index``) goes into the per-task entries instead. Default: nothing extra.
        """
        return {}

    def get_key_metrics(self, agent_metrics: dict[str, Any]) -> dict[str, Any]:
        """The headline metrics picked from the agent metrics. Here, NeMo Gym's default (every ``mean/*``), for an
        override's ``super()`` call; a server that does not override it gets mean reward, pass@1 and the largest
        majority@k (:func:`nemo_gym.metrics.key_picker`)."""
        return _every_mean(agent_metrics)

    def _aggregate_with_hooks(self, rows: list[dict[str, Any]]) -> AggregateMetrics:
        return _aggregate_with_hooks(rows, self.compute_metrics, _key_picker(self, MetricsHooks))


class SimpleResourcesServer(MetricsHooks, SimpleServer):
    config: BaseResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        """Routes, with ``/verify`` behind :func:`~nemo_gym.judge.judge_failsafe`: a judge that cannot be asked
        answers a ``judge_failed`` failure row rather than an error. ``/ng-rollout/<id>/...`` paths are routed as
        the path after the prefix."""
        app = super().setup_webserver()
        app.add_middleware(_RolloutContextMiddleware)
        _add_session_routes(app, self)
        app.post("/verify")(_judge_failsafe(self.verify))
        app.post("/aggregate_metrics")(self.aggregate_metrics)
        app.get("/reverify_mode")(self.reverify_mode)
        if getattr(self.config, "expose_tools_over_mcp", False):
            _expose_tools_over_mcp(app, self.config.name, self.session_cookie_name)
        return app

    async def seed_session(self, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        """Set up a rollout's state (default: none). An environment server's seed reaches it too, with its
        ``task_data`` as the body, unless this method's body type accepts a :class:`ResourcesSeedSessionRequest`
        itself (see :mod:`nemo_gym.resources_sessions`)."""
        return BaseSeedSessionResponse()

    async def close_resources_session(self, body: ResourcesCloseSessionRequest) -> ResourcesCloseSessionResponse:
        """``POST /close_session``: release what an environment server's seed set up (default: nothing).

        An override succeeds for a session already closed or never seeded, keeps a seed arriving after the close
        from creating the session, and raises when it cannot release, so the caller may try again.
        """
        return ResourcesCloseSessionResponse(resources_session_id=body.resources_session_id)

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        raise NotImplementedError(f"{type(self).__name__} must implement verify()")

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Default metrics: statistics of ``reward`` and every other numeric field, overall and per task, extended by
        :meth:`compute_metrics` and headed by :meth:`get_key_metrics`."""
        return self._aggregate_with_hooks(body.verify_responses)

    async def get_reverify_mode(self) -> ReverifyMode:
        return ReverifyMode(self.config.REVERIFY_MODE)

    async def reverify_mode(self) -> ReverifyMode:
        """The route: :meth:`get_reverify_mode` (NeMo Gym's name; override either)."""
        return await self.get_reverify_mode()
