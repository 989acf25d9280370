"""Agent servers: the loop that drives a model against an environment's tools and asks for a reward.

``/v1/responses`` runs the loop for one set of create params and returns the final Responses object (so an agent can
stand in for a model); ``/run`` takes a whole dataset row, seeds the environment's session, runs the loop and returns
the verified row with its ``reward``.

When the run captures model calls (``observability_enabled``), an agent sends its model calls for a rollout through
:meth:`SimpleResponsesAPIAgent.url_path_for_run` (``/ng-rollout/<id>/v1/responses``), so the model server can file
them under that rollout; an agent that takes part in training-token capture (the run's ``token_id_capture.enabled``
with ``all_agents`` or its own ``token_id_capture``) uses ``/ng-rollout/<id>/training-token-capture/...`` instead.
Otherwise the helpers return the path unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, TypeVar

import orjson
from fastapi import Body, FastAPI, HTTPException, Request, Response
from pydantic import Field, PrivateAttr, field_validator

from nemo_gym.agent_sessions import AGENT_SESSION_COOKIE_KEY as _AGENT_SESSION_COOKIE_KEY
from nemo_gym.agent_sessions import (
    AgentCloseSessionRequest,
    AgentCloseSessionResponse,
    AgentSeedSessionRequest,
    AgentSeedSessionResponse,
    AgentSessionSetupError,
    AgentSessionState,
)
from nemo_gym.agent_sessions import AgentSessionTable as _AgentSessionTable
from nemo_gym.agent_sessions import _AgentSessionRecord as _AgentSessionRecord
from nemo_gym.agent_sessions import unique_access_names as _unique_access_names
from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyResponse
from nemo_gym.base_resources_server import MetricsHooks as _MetricsHooks
from nemo_gym.config.server_models import BaseRunServerInstanceConfig
from nemo_gym.global_config import get_first_server_config_dict as _get_first_server_config_dict
from nemo_gym.metrics import AggregateMetrics, AggregateMetricsRequest, aggregate_verify_responses
from nemo_gym.metrics import compute_aggregate_metrics as _compute_aggregate_metrics
from nemo_gym.metrics import key_picker as _key_picker
from nemo_gym.observability import correlation as _correlation
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import SESSION_ID_KEY as _SESSION_ID_KEY
from nemo_gym.server_utils import SimpleServer
from nemo_gym.server_utils import json_response as _json_response
from nemo_gym.token_id_capture.config import token_id_capture_applies as _token_id_capture_applies
from nemo_gym.tool_access import ToolAccess as _ToolAccess
from nemo_gym.transport import http_client as _http
from nemo_gym.transport.routes import BodyRoute as _BodyRoute

__all__ = [
    "AgentCloseSessionRequest",
    "AgentCloseSessionResponse",
    "AgentSeedSessionRequest",
    "AgentSeedSessionResponse",
    "AgentSessionSetupError",
    "AgentSessionState",
    "AggregateMetrics",
    "AggregateMetricsRequest",
    "BaseResponsesAPIAgentConfig",
    "BaseRunRequest",
    "BaseRunServerInstanceConfig",
    "BaseVerifyResponse",
    "Body",
    "NeMoGymResponse",
    "NeMoGymResponseCreateParamsNonStreaming",
    "SimpleResponsesAPIAgent",
    "SimpleServer",
    "add_usage",
    "aggregate_verify_responses",
    "forwards_aggregate_metrics",
]

_MethodT = TypeVar("_MethodT", bound=Callable[..., Any])
_FORWARDS_METRICS = "_nemo_gym_forwards_aggregate_metrics"
_JSON_BODY = {"Content-Type": "application/json"}
_METRICS_FIELDS = frozenset({"agent_metrics", "key_metrics", "group_level_metrics"})
"""The containers every answer has; ``repeat_level_metrics`` and ``perf_summary`` (NeMo Gym 0.7) may come too."""
_OPTIONAL_METRICS = frozenset(AggregateMetrics.model_fields) - _METRICS_FIELDS


def forwards_aggregate_metrics(method: _MethodT) -> _MethodT:
    """Marks an agent's ``aggregate_metrics`` that only asks its ``config.resources_server`` (through
    :meth:`SimpleResponsesAPIAgent.resources_server_metrics`).

    Its route then passes the run's rows on as the bytes they came in, and the answer back likewise
    (:meth:`SimpleResponsesAPIAgent.forward_metrics`): at the end of a run they are the largest bodies an agent
    handles, and it reads neither. A subclass that overrides ``aggregate_metrics`` is served by its own method.
    """
    setattr(method, _FORWARDS_METRICS, True)
    return method


class BaseResponsesAPIAgentConfig(BaseRunServerInstanceConfig):
    skip_verification: bool = False
    skip_verification_reward: float = 0.0
    session_close_retry_window_seconds: float = Field(default=300, gt=0, allow_inf_nan=False)
    """How long a closed agent session's answer is kept, for a caller that retries the close."""
    token_id_capture: bool = False
    """Take part in training token capture when the run's ``token_id_capture.enabled`` is on (external harnesses
    whose answers carry no token ids)."""
    tool_accesses: list[_ToolAccess] = Field(default_factory=list)
    """Tools every agent session may use; a session's own accesses replace these by name."""

    _unique_accesses = field_validator("tool_accesses")(_unique_access_names)


class SimpleResponsesAPIAgent(_MetricsHooks, SimpleServer):
    config: BaseResponsesAPIAgentConfig
    _agent_sessions: _AgentSessionTable | None = PrivateAttr(default=None)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/v1/agent_sessions")(self.seed_agent_session)
        app.post("/v1/agent_sessions/close")(self.close_agent_session)
        app.post("/v1/responses")(self.responses)
        # A self-call made with url_path_for_run lands on a prefixed twin, and url_path_for_request reads the id back.
        # The twins are served whatever the config says: a caller may prefix its calls when this server does not.
        prefixed = f"/{_correlation.ROLLOUT_PATH_PREFIX}/{{rollout_id}}"
        app.post(f"{prefixed}/v1/responses")(self.responses)
        app.post(f"{prefixed}/{_correlation.TOKEN_CAPTURE_PATH_SEGMENT}/v1/responses")(self.responses)
        if self._capture_correlation_enabled():
            app.post("/run")(self._run_in_rollout_context())
        else:
            app.post("/run")(self.run)
        app.post("/aggregate_metrics")(self.aggregate_metrics)
        resources = getattr(getattr(self.config, "resources_server", None), "name", None)
        route = app.router.routes[-1]
        if (
            getattr(type(self).aggregate_metrics, _FORWARDS_METRICS, False)
            and resources
            and isinstance(route, _BodyRoute)
        ):
            route.passthrough = functools.partial(self.forward_metrics, resources)
        return app

    def _run_in_rollout_context(self) -> Any:
        """``run`` with the rollout id of its body as the current rollout (only installed when capture is on)."""
        run = self.run

        @functools.wraps(run)
        async def run_in_context(*args: Any, **kwargs: Any) -> Any:
            body = kwargs.get("body", next((a for a in args if isinstance(a, BaseRunRequest)), None))
            with _correlation.rollout_context(self.rollout_id_from_run(body)):
                return await run(*args, **kwargs)

        return run_in_context

    def _model_call_capture_enabled(self) -> bool:
        """Whether the run records model calls for evaluation (``observability_enabled``)."""
        config = getattr(self.server_client, "global_config_dict", None)
        return bool(config.get("observability_enabled", False)) if isinstance(config, Mapping) else False

    def _token_id_capture_enabled(self) -> bool:
        """Whether this agent's model calls record training token ids: the run's ``token_id_capture.enabled``, and
        its ``all_agents`` or this agent's own ``token_id_capture`` flag (an opt-in, since an external harness may
        make calls that should not be trained on)."""
        opted_in = bool(getattr(getattr(self, "config", None), "token_id_capture", False))
        return _token_id_capture_applies(getattr(self.server_client, "global_config_dict", None), opted_in)

    def _capture_correlation_enabled(self) -> bool:
        """Whether model calls carry their rollout id at all: either kind of capture needs it."""
        return self._model_call_capture_enabled() or self._token_id_capture_enabled()

    def rollout_id_from_run(self, body: Any) -> str | None:
        """The rollout id of a ``/run`` body when model calls are captured; None otherwise or without indices."""
        return _correlation.rollout_id_from_run_body(body) if self._capture_correlation_enabled() else None

    def url_path_for_run(self, url_path: str, body: Any) -> str:
        """``url_path`` for this rollout's model calls: ``/ng-rollout/<id>`` (plus the training-capture segment when
        this agent captures tokens) + path when captured, else unchanged."""
        prefix = _correlation.rollout_path_prefix(
            self.rollout_id_from_run(body), token_capture=self._token_id_capture_enabled()
        )
        return prefix + url_path

    def base_url_for_run(self, base_url: str, body: Any) -> str:
        """A model server's root URL with this rollout's prefix (append ``/v1`` after it)."""
        return _correlation.apply_rollout_prefix(
            base_url, self.rollout_id_from_run(body), token_capture=self._token_id_capture_enabled()
        )

    def url_path_for_request(self, url_path: str, request: Request | None) -> str:
        """``url_path`` with the rollout prefix of the request being served (a prefixed self-call), if any."""
        path_params = getattr(request, "path_params", None)
        rollout_id = path_params.get("rollout_id") if isinstance(path_params, Mapping) else None
        request_path = getattr(getattr(request, "url", None), "path", "")
        token_capture = f"/{_correlation.TOKEN_CAPTURE_PATH_SEGMENT}/" in request_path
        return _correlation.rollout_path_prefix(rollout_id, token_capture=token_capture) + url_path

    def resolve_model_base_url(self, model_server_name: str, rollout_id: str | None = None) -> str:
        """``http://host:port[/ng-rollout/<id>]/v1`` of a model server, for agents that hand a base URL to an
        OpenAI-compatible client. Built by the client's ``_build_server_base_url`` from the instance's settings, as
        NeMo Gym builds it, so a client that replaces that hook (a runner, a test's stand-in) decides the address."""
        client = self.server_client
        settings = _get_first_server_config_dict(client.global_config_dict, model_server_name)
        base = client._build_server_base_url(settings)
        token_capture = self._token_id_capture_enabled()
        return f"{_correlation.apply_rollout_prefix(base, rollout_id, token_capture=token_capture)}/v1"

    async def responses(
        self, request: Request, response: Response, body: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse:
        raise NotImplementedError(f"{type(self).__name__} must implement responses()")

    async def run(self, request: Request, body: BaseRunRequest) -> BaseVerifyResponse:
        raise NotImplementedError(f"{type(self).__name__} must implement run()")

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """The resources server's default statistics, extended by this agent's metric hooks, as NeMo Gym 0.7's agents
        compute them: masked rollouts (``mask_sample``) left out and counted, statistics per repeat, and
        :meth:`compute_repeat_metrics` summarized across repeats."""
        picker = _key_picker(self, _MetricsHooks)
        return _compute_aggregate_metrics(
            body.verify_responses, self.compute_metrics, picker, self.compute_repeat_metrics
        )

    def compute_repeat_metrics(self, tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        """Metrics of one repeat (its rollouts grouped by task), summarized across repeats as
        ``<stat>_across_repeats/<name>``. Default: none."""
        return {}

    # -- agent sessions (an environment server's episode; nemo_gym.agent_sessions) -------------------------------------

    @property
    def agent_sessions(self) -> _AgentSessionTable:
        if self._agent_sessions is None:
            window = getattr(self.config, "session_close_retry_window_seconds", 300.0)
            self._agent_sessions = _AgentSessionTable(window)
        return self._agent_sessions

    @property
    def _session_records(self) -> dict[str, _AgentSessionRecord]:
        """The table's records by ``agent_session_id`` (NeMo Gym 0.7's name; its tests read and plant records)."""
        return self.agent_sessions._records

    async def seed_agent_session(self, request: Request, body: AgentSeedSessionRequest) -> AgentSeedSessionResponse:
        """Open an agent session; the same request again answers the same session.

        Sessions live in this process's memory, so several workers could not find one another's: refused then.
        """
        if self.config.num_workers not in (None, 1):
            raise ValueError("Agent sessions require num_workers=1")
        current = self._agent_session_id_from_request(request)
        if current is not None and current != body.agent_session_id:
            raise HTTPException(409, "agent_session_id does not match the session cookie")
        session = _request_session(request)
        cookie_session = session.get(_SESSION_ID_KEY) if session is not None else None
        answer = await self.agent_sessions.seed(body, cookie_session, self._seed_agent_session_state)
        if isinstance(session, MutableMapping):
            session[_AGENT_SESSION_COOKIE_KEY] = body.agent_session_id
        return answer

    async def close_agent_session(self, request: Request, body: AgentCloseSessionRequest) -> AgentCloseSessionResponse:
        """Close it: what the agent observed and the resources cookies. A repeated close answers the same; a request
        whose cookie names another session is refused."""
        if type(self)._close_agent_session_state is SimpleResponsesAPIAgent._close_agent_session_state:
            raise NotImplementedError(f"{type(self).__name__} does not support agent sessions")
        current = self._agent_session_id_from_request(request)
        if current is not None and current != body.agent_session_id:
            raise HTTPException(409, "agent_session_id does not match the session cookie")
        return await self.agent_sessions.close(body, self._close_agent_session_state)

    def _agent_session_id_from_request(self, request: Request | None) -> str | None:
        """The agent session a request belongs to: the one its cookie was seeded under (or the marker a seed left
        in its session), None for a request outside any session. A closed one is still named, so that
        :meth:`_require_agent_session` refuses a late call rather than letting it run without the session."""
        session = _request_session(request)
        if session is None:
            return None
        if _AGENT_SESSION_COOKIE_KEY in session:
            marker = session[_AGENT_SESSION_COOKIE_KEY]
            if not isinstance(marker, str) or not marker:
                raise HTTPException(409, "Invalid agent session marker")
            return marker
        if self._agent_sessions is None:
            return None
        return self._agent_sessions.id_for_cookie(session.get(_SESSION_ID_KEY))

    def _require_agent_session(self, agent_session_id: str) -> AgentSessionState:
        """The open session's state; 409 for one unknown, closing or closed."""
        return self.agent_sessions.require(agent_session_id)

    def agent_session_of(self, request: Request) -> AgentSessionState | None:
        """The open agent session the request's cookie names, if any (409 when that session is closed)."""
        agent_session_id = self._agent_session_id_from_request(request)
        return None if agent_session_id is None else self._require_agent_session(agent_session_id)

    def effective_tool_accesses(self, request: AgentSeedSessionRequest) -> list[_ToolAccess]:
        """The configured tool accesses with the session's own laid over them by name."""
        accesses = {access.name: access for access in getattr(self.config, "tool_accesses", [])}
        accesses.update((access.name, access) for access in request.tool_accesses)
        return list(accesses.values())

    async def _seed_agent_session_state(self, body: AgentSeedSessionRequest) -> AgentSessionState:
        """Set up a session's state (an agent that supports sessions implements this and the close)."""
        raise NotImplementedError(f"{type(self).__name__} does not support agent sessions")

    async def _close_agent_session_state(self, state: AgentSessionState) -> AgentCloseSessionResponse:
        """Release a session's state; raise (keeping what a retry needs) when it cannot."""
        raise NotImplementedError(f"{type(self).__name__} does not support agent sessions")

    # -- the steps every seed -> solve -> verify agent shares ---------------------------------------------------------

    async def seed_rollout(self, resources: str, row: dict[str, Any], cookies: dict[str, str]) -> Any:
        """``/seed_session`` on ``resources`` for ``row``; its session cookies join ``cookies``. Returns the answer."""
        seeded = await self.server_client.post(resources, "/seed_session", json=row, cookies=cookies)
        _http.raise_for_status(seeded, resources, "/seed_session")
        cookies.update(_http.cookies_from(seeded))
        return seeded

    async def verify_rollout(
        self, resources: str, row: dict[str, Any], final: dict[str, Any], cookies: dict[str, str]
    ) -> Response:
        """``/verify`` of ``final`` for ``row`` (or the configured reward when ``skip_verification`` is set).

        The verifier's answer goes on as the bytes it sent, once they parse as JSON (a body that does not fails here,
        as it always did): the agent never reads inside it, so parsing it into objects and dumping them again would
        only make the same JSON value anew.
        """
        config = self.config
        if getattr(config, "skip_verification", False):
            reward = getattr(config, "skip_verification_reward", 0.0)
            return _json_response(row | {"response": final, "reward": reward, "verification_skipped": True})
        verified = await self.server_client.post(resources, "/verify", json=row | {"response": final}, cookies=cookies)
        _http.raise_for_status(verified, resources, "/verify")
        raw = await verified.read()
        orjson.loads(raw)
        return Response(content=raw, media_type="application/json")

    async def resources_server_metrics(self, resources: str, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Metric logic lives with the environment: ``/aggregate_metrics`` of ``resources``.

        The rows go on as they came (not dumped from the model first: the same bytes, without a copy of every row),
        and the answer is parsed once (:func:`_metrics_answer`): a run's rows and per-task metrics are the largest
        bodies an agent handles, all at the end of a run.
        """
        plain = type(body) is AggregateMetricsRequest and "verify_responses" in body.model_fields_set
        payload = {"verify_responses": body.verify_responses} if plain else body
        answer = await self.server_client.post(resources, "/aggregate_metrics", json=payload)
        _http.raise_for_status(answer, resources, "/aggregate_metrics")
        return _metrics_answer(await answer.read())

    async def forward_metrics(self, resources: str, raw: bytes) -> Response | None:
        """What :meth:`resources_server_metrics` answers for the body ``raw``, without making objects of its rows
        and of the per-task metrics that come back, only to dump them again.

        The body is parsed once, and dropped, to check it is exactly ``{"verify_responses": [objects]}``: then the
        validated body would send the same JSON value on. Anything else gives None, and the typed route answers it
        (with its 422 where the body is invalid). An answer of exactly the model's three containers goes back as it
        came; any other is validated by the model, as the typed route would (its error included).
        """
        if not _rows_only(raw):
            return None
        answer = await self.server_client.post(resources, "/aggregate_metrics", data=raw, headers=_JSON_BODY)
        _http.raise_for_status(answer, resources, "/aggregate_metrics")
        content = await answer.read()
        data = orjson.loads(content)
        if not _plain_metrics(data):
            content = _metrics_from(data).model_dump_json().encode()
        return Response(content=content, media_type="application/json")

    @staticmethod
    def pass_on_new_cookies(request: Request, response: Response, cookies: dict[str, str]) -> None:
        """Set on ``response`` the cookies a rollout gained or changed beyond those ``request`` came with."""
        for name, value in cookies.items():
            if request.cookies.get(name) != value:
                response.set_cookie(name, value)


def _request_session(request: Request | None) -> Mapping[str, Any] | None:
    """``request.session`` when the request has one (a test's stand-in may not; a request outside the session
    middleware raises on access)."""
    try:
        session = getattr(request, "session", None)
    except AssertionError:
        return None
    return session if isinstance(session, Mapping) else None


def add_usage(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Token usage of a multi-call rollout: ``usage`` added into ``total`` (a copy of ``usage`` when ``total`` is None).

    Agents report one ``usage`` per rollout, so the counts (and cached / reasoning token details) of every model call
    are summed; ``total`` is updated in place and returned.
    """
    if not usage:
        return total
    if total is None:
        return orjson.loads(orjson.dumps(usage))
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        total[key] = (total.get(key) or 0) + (usage.get(key) or 0)
    for details, field in (("input_tokens_details", "cached_tokens"), ("output_tokens_details", "reasoning_tokens")):
        if isinstance(usage.get(details), dict) and isinstance(total.get(details), dict):
            total[details][field] = (total[details].get(field) or 0) + (usage[details].get(field) or 0)
    return total


def _metrics_answer(raw: bytes) -> AggregateMetrics:
    """An ``/aggregate_metrics`` answer as :class:`AggregateMetrics`, validated without copying its per-task metrics.

    Validating the parsed answer copies each of its dicts, one per task: at 65,536 tasks the agent held both copies
    (~0.5 GB at the peak). An answer of the model's own shape (its three containers, a list of dicts) is taken as
    parsed, which is what validating it would give; anything else goes through the model and fails exactly as before.
    """
    return _metrics_from(orjson.loads(raw))


def _metrics_from(data: Any) -> AggregateMetrics:
    """:func:`_metrics_answer` of a parsed answer."""
    if _plain_metrics(data, extra_keys=True):
        return AggregateMetrics.model_construct(
            **{key: data[key] for key in data.keys() & AggregateMetrics.model_fields}
        )
    return AggregateMetrics.model_validate(data)


def _plain_metrics(data: Any, extra_keys: bool = False) -> bool:
    """Whether ``data`` is :class:`AggregateMetrics`'s containers as parsed JSON (lists of dicts among them), which
    validating would take as they are; other keys (which the model ignores) only where ``extra_keys``."""
    if type(data) is not dict or not data.keys() >= _METRICS_FIELDS:
        return False
    if not extra_keys and not data.keys() <= _METRICS_FIELDS | _OPTIONAL_METRICS:
        return False
    groups, repeats = data["group_level_metrics"], data.get("repeat_level_metrics", [])
    return (
        type(data["agent_metrics"]) is dict
        and type(data["key_metrics"]) is dict
        and type(groups) is list
        and all(type(group) is dict for group in groups)
        and type(repeats) is list
        and all(type(repeat) is dict for repeat in repeats)
        and type(data.get("perf_summary")) in (dict, type(None))
    )


def _rows_only(raw: bytes) -> bool:
    """Whether a body is exactly ``{"verify_responses": [objects]}``, what the collector sends; False for anything
    else, JSON that only Python's parser takes (``NaN``) included."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    if type(data) is not dict or data.keys() != {"verify_responses"}:
        return False
    rows = data["verify_responses"]
    return type(rows) is list and all(type(row) is dict for row in rows)
