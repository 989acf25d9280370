"""Training-token capture on a model server: calls under ``/ng-rollout/<id>/training-token-capture/v1/...`` record
their prompt and generated token ids (``nemo_gym.token_id_capture``) for rollout ``<id>``.

Installed next to evaluation capture by ``install_model_call_capture`` when the run sets ``token_id_capture:
{enabled: true}``, so every model server gets it without code of its own; any server whose answers carry token ids
(``vllm_model`` asks its engine for them on such calls, ``hf_policy_model`` always returns them) is captured. Per call,
:class:`TrainingTokenCaptureMiddleware` strips the prefix, reads the request, opens a ``CaptureContext``, resolves
the parent before dispatch, and once the answer is complete (a streamed Responses answer is read from its
``response.completed`` event) writes the ``TokenEntry`` before the final body bytes reach the caller, so a reader that
saw the answer finds the record. With evaluation capture installed too, the prefix is left for it to strip and both
records share the call's ``model_call_id``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any
from uuid import uuid4

import orjson

from nemo_gym.errors import ConfigError
from nemo_gym.observability.capture import OBSERVED_PATHS, _streamed_response
from nemo_gym.observability.correlation import rollout_context, split_rollout_path
from nemo_gym.token_id_capture.config import TokenIdCaptureConfig, token_id_capture_config
from nemo_gym.token_id_capture.lineage import FileLineageStore
from nemo_gym.token_id_capture.protocols import (
    CaptureLedger,
    LineageResolver,
    TokenSink,
    installed_lineage_store,
    installed_token_sink,
)
from nemo_gym.token_id_capture.records import UNCOMMITTED_CALL_REASON
from nemo_gym.token_id_capture.sink import (
    CaptureContext,
    capture_tokens,
    current_capture_context,
    register_call_intent,
    reset_token_sink,
    resolve_parent,
    set_token_sink,
)
from nemo_gym.token_id_capture.store import TokenCaptureStore

logger = logging.getLogger(__name__)

MODEL_CALL_ID_STATE_KEY = "nemo_gym_model_call_id"
"""Where this middleware leaves the call's id in the ASGI scope's state, for evaluation capture to reuse."""


def request_items(dialect: str, body: Any) -> list[dict[str, Any]] | None:
    """The conversation a request sends, as items in its own dialect (system text first), or None if unreadable."""
    if not isinstance(body, Mapping):
        return None
    items: list[Any] = []
    if dialect == "responses":
        if isinstance(body.get("instructions"), str) and body["instructions"]:
            items.append({"role": "system", "content": body["instructions"]})
        given = body.get("input")
        items += [{"role": "user", "content": given}] if isinstance(given, str) else list(given or [])
    elif dialect == "chat":
        items += list(body.get("messages") or [])
    else:
        if body.get("system"):
            items.append({"role": "system", "content": body["system"]})
        items += list(body.get("messages") or [])
    return items if all(isinstance(item, dict) for item in items) else None


def _answer(body: bytes, streaming: bool, dialect: str) -> dict[str, Any] | None:
    try:
        answer = _streamed_response(body, dialect) if streaming else orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return answer if isinstance(answer, dict) else None


class TrainingTokenCaptureMiddleware:
    """Pure ASGI; a request outside the training-capture prefix costs one prefix check."""

    def __init__(
        self,
        app: Any,
        *,
        sink: TokenSink | None,
        lineage_store: LineageResolver | None,
        delta_records: bool = False,
        external_staging: bool = False,
        keep_prefix: bool = False,
    ) -> None:
        self._app = app
        self._sink = sink
        self._lineage_store = lineage_store
        self._delta_records = delta_records
        self._external_staging = external_staging
        self._keep_prefix = keep_prefix

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self._app(scope, receive, send)
            return
        rollout_id, token_capture, rest = split_rollout_path(scope.get("path", ""))
        if rollout_id is None or not token_capture:
            await self._app(scope, receive, send)
            return
        if not self._keep_prefix:
            scope = {**scope, "path": rest, "raw_path": rest.encode()}
        dialect = OBSERVED_PATHS.get(rest)
        with rollout_context(rollout_id):
            if dialect is None or scope.get("method") != "POST":
                await self._app(scope, receive, send)
            else:
                await self._capture(scope, receive, send, rollout_id, dialect)

    async def _capture(self, scope: dict[str, Any], receive: Any, send: Any, rollout_id: str, dialect: str) -> None:
        received: list[dict[str, Any]] = []
        while True:
            message = await receive()
            received.append(message)
            if message.get("type") != "http.request" or not message.get("more_body", False):
                break
        raw = b"".join(message.get("body", b"") for message in received if message.get("type") == "http.request")
        pending = [{"type": "http.request", "body": raw, "more_body": False}]
        pending += [message for message in received if message.get("type") != "http.request"]

        async def replay() -> dict[str, Any]:
            return pending.pop(0) if pending else await receive()

        try:
            items = request_items(dialect, orjson.loads(raw)) if raw else None
        except orjson.JSONDecodeError:
            items = None
        model_call_id = uuid4().hex
        scope = {**scope, "state": {**(scope.get("state") or {}), MODEL_CALL_ID_STATE_KEY: model_call_id}}
        context = CaptureContext(
            rollout_id=rollout_id,
            model_call_id=model_call_id,
            token_sink=None if self._external_staging else self._sink,
            lineage_store=self._lineage_store,
            delta_records=self._delta_records,
            external_staging=self._external_staging,
            admitted_at=time.time(),
        )
        answer = bytearray()
        state: dict[str, Any] = {"status": None, "streaming": False}
        held: list[dict[str, Any]] = []
        hold_all = self._external_staging  # the engine answered whole anyway; a verdict must precede every byte

        async def keep(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message.get("status")
                headers = dict(message.get("headers") or [])
                state["streaming"] = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            elif message["type"] == "http.response.body":
                answer.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    held.append(message)  # released once the record is written
                    return
            if hold_all:
                held.append(message)
                return
            await send(message)

        token = set_token_sink(context)
        try:
            await resolve_parent(items)
            await register_call_intent()
            await self._app(scope, replay, keep)
            served = isinstance(state["status"], int) and state["status"] < 400
            if served and not self._external_staging and not (context.committed or context.answer_captured):
                await capture_tokens(_answer(bytes(answer), state["streaming"], dialect), request_messages=items)
        finally:
            try:
                if self._external_staging:
                    await _poison_uncommitted(context)
            finally:
                reset_token_sink(token)
                for message in held:
                    await send(message)


async def _poison_uncommitted(context: CaptureContext) -> None:
    """An admitted worker-staged call that was never acknowledged (failed, made up locally, or its answer could not
    be served) poisons its rollout, before the client sees how the call ended."""
    ledger = context.lineage_store
    if context.capture_admission is None or context.committed or not isinstance(ledger, CaptureLedger):
        return
    try:
        await ledger.record_failure(context.rollout_id, context.model_call_id, UNCOMMITTED_CALL_REASON)
    except Exception:
        logger.warning("could not poison uncommitted call %s", context.model_call_id, exc_info=True)


async def resolve_before_handler(dialect: str, body: Any) -> None:
    """Decide the parent from the request as the route received it, when no capture layer decided it already.

    A context set by an embedding caller (not by :class:`TrainingTokenCaptureMiddleware`) is resolved here, so prefix
    supply and capture see the same decision either way.
    """
    context = current_capture_context()
    if context is None or context.parent_resolution is not None:
        return
    plain = body.model_dump(mode="json", exclude_unset=True) if hasattr(body, "model_dump") else body
    await resolve_parent(request_items(dialect, plain))
    await register_call_intent()


async def capture_handler_answer(answer: Any) -> None:
    """Record the handler's own answer (it still carries its token ids, which a Messages answer no longer would)."""
    context = current_capture_context()
    if context is None or context.external_staging or context.committed:
        return
    await capture_tokens(answer, request_messages=context.request_items)


def training_capture_layer(
    app: Any,
    *,
    token_store: TokenSink | None = None,
    configured_sink: TokenSink | None = None,
    lineage_store: LineageResolver | None = None,
    delta_records: bool = False,
    external_staging: bool = False,
    token_capture_enabled: bool = False,
) -> TrainingTokenCaptureMiddleware | None:
    """NeMo Gym 0.7's capture arguments as our training-capture layer around ``app`` (None: nothing to capture).

    ``app`` strips the rollout prefix itself, so the layer keeps it.
    """
    sink = configured_sink or installed_token_sink() or token_store
    if sink is None and not token_capture_enabled:
        return None
    return TrainingTokenCaptureMiddleware(
        app,
        sink=sink,
        lineage_store=lineage_store,
        delta_records=delta_records,
        external_staging=external_staging,
        keep_prefix=True,
    )


def _destinations(config: TokenIdCaptureConfig) -> tuple[TokenSink | None, LineageResolver | None]:
    """A configured sink, else one installed in this process, else the file store; its resolver likewise."""
    directory = config.resolved_dir()
    sink = config.build_sink() or installed_token_sink()
    lineage = config.build_lineage_store() or installed_lineage_store()
    if sink is None and directory is not None and not config.token_id_capture.external_staging:
        sink = TokenCaptureStore(directory)
    if lineage is None and directory is not None and config.token_id_capture.sink is None:
        lineage = FileLineageStore(directory)
    return sink, lineage


def install_training_token_capture(app: Any, global_config: Mapping[str, Any], *, keep_prefix: bool) -> bool:
    """Add :class:`TrainingTokenCaptureMiddleware` when the run enables training-token capture (True), else nothing.

    ``keep_prefix``: evaluation capture sits inside this middleware and strips the prefix itself.
    """
    try:
        config = token_id_capture_config(global_config)
    except ValueError as error:  # pydantic's ValidationError included
        raise ConfigError(f"token_id_capture: {error}") from None
    if not config.enabled:
        return False
    sink, lineage = _destinations(config)
    external = config.token_id_capture.external_staging
    if external and not isinstance(lineage, CaptureLedger):
        raise ConfigError("token_id_capture.external_staging needs a lineage_store that is a CaptureLedger")
    if sink is None and not external:
        raise ConfigError("token_id_capture is enabled but has nowhere to write: set token_id_capture.dir or a sink")
    if external:
        from nemo_gym.token_id_capture.control_routes import install_rollout_control_routes

        try:
            auth_token = config.token_id_capture.resolve_control_auth_token()
        except ValueError as error:
            raise ConfigError(f"token_id_capture: {error}") from None
        install_rollout_control_routes(app, lineage, auth_token=auth_token)  # type: ignore[arg-type]
    app.add_middleware(
        TrainingTokenCaptureMiddleware,
        sink=sink,
        lineage_store=lineage,
        delta_records=config.token_id_capture.delta_records,
        external_staging=external,
        keep_prefix=keep_prefix,
    )
    return True
