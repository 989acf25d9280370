"""Model-call capture: every ``/v1/*`` exchange of a correlated rollout, appended to ``<dir>/<rollout_id>.capture.jsonl``.

It is on only when the run sets ``observability_enabled: true`` and an absolute ``model_call_capture_dir``; a model
server without it still routes ``/ng-rollout/<id>/...`` as ``/...`` (an agent or harness may add the prefix anyway,
and a server such as switchyard_model reads the id from it). With it, agents post to
``/ng-rollout/<id>/v1/...``; :class:`_CaptureMiddleware` strips the prefix, forwards request and response unchanged
(streams included), keeps a copy, and appends one exchange per call off the event loop. The final body message is
held back until the exchange is on disk, so a caller that reads the capture after the answer finds it there. The
collector reads a rollout's file back into ``ng_model_call_capture`` (:func:`merge_model_call_capture_into_record`).

What one stored exchange says (:class:`ModelCallRecord`, :func:`token_stats`, the sums over a rollout's calls) is read
out of it in ``model_call_records.py``; those names are importable from here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any
from uuid import uuid4

import orjson
from pydantic import BaseModel, ValidationError, model_validator

from nemo_gym.config.server_models import ModelServerRef as ModelServerRef  # importable here as before
from nemo_gym.errors import ConfigError
from nemo_gym.observability.correlation import ROLLOUT_ID_PATTERN, RolloutContextMiddleware, split_rollout_path
from nemo_gym.observability.model_call_records import (
    ModelCallRecord,
    aggregate_model_call_records,
    build_model_call_record,
)
from nemo_gym.observability.model_call_records import token_stats as token_stats  # importable here as before

logger = logging.getLogger(__name__)

CAPTURE_KEY = "ng_model_call_capture"
OBSERVATIONS_KEY = "ng_agent_observations"
TRAJECTORY_KEY = "ng_trajectory"
"""Where a rollout's merged trajectory goes (``observability/trajectory.py`` writes it); named here with the other keys
so that a collector can test for them without importing the trajectory models."""
PAYLOAD_FIELDS = ("request", "response", "request_raw", "response_raw")
OBSERVED_PATHS = {"/v1/responses": "responses", "/v1/chat/completions": "chat", "/v1/messages": "messages"}


class ModelCallCaptureConfig(BaseModel):
    """The run-wide switch, read from the global config (other keys are ignored)."""

    observability_enabled: bool = False
    model_call_capture_dir: Path | None = None
    training_token_capture: dict[str, Any] | None = None
    """The config keys of an enabled ``token_id_capture`` block, unvalidated: ``token_capture.py`` reads them."""

    @model_validator(mode="after")
    def _needs_directory(self) -> ModelCallCaptureConfig:
        if self.observability_enabled:
            if self.model_call_capture_dir is None:
                raise ValueError("observability_enabled: true needs model_call_capture_dir (an absolute path)")
            if not self.model_call_capture_dir.is_absolute():
                raise ValueError(f"model_call_capture_dir must be an absolute path, not {self.model_call_capture_dir}")
        return self

    @classmethod
    def of(cls, global_config: Any) -> ModelCallCaptureConfig:
        """The settings of a run's config; an enabled capture without an absolute directory is a ConfigError."""
        if not isinstance(global_config, Mapping):
            return cls()
        block = global_config.get("token_id_capture")
        tokens = None
        if isinstance(block, Mapping) and block.get("enabled"):
            tokens = {key: global_config.get(key) for key in ("token_id_capture", "model_call_capture_dir")}
        if not global_config.get("observability_enabled"):
            return cls(training_token_capture=tokens)
        try:
            directory = global_config.get("model_call_capture_dir")
            return cls(observability_enabled=True, model_call_capture_dir=directory, training_token_capture=tokens)
        except ValidationError as e:
            raise ConfigError(str(e.errors()[0]["msg"]).removeprefix("Value error, ")) from None


def capture_dirs_from_config(global_config: Any) -> list[Path]:
    """The capture directory of a run as a one-element list, or ``[]`` when capture is off."""
    config = ModelCallCaptureConfig.of(global_config)
    return [config.model_call_capture_dir] if config.model_call_capture_dir is not None else []


class CaptureStore:
    """A directory of per-rollout capture files; every write takes an exclusive ``flock`` and is fsync-ed.

    The calls block on disk, so the middleware runs them in a worker thread.
    """

    _EXCHANGES_SUFFIX = ".capture.jsonl"
    _UNFINISHED_SUFFIX = ".capture.incomplete"

    def __init__(self, root: str | Path) -> None:
        directory = Path(root)
        directory.mkdir(parents=True, exist_ok=True)
        self._directory = directory

    @property
    def root(self) -> Path:
        return self._directory

    def _file(self, rollout_id: str, suffix: str) -> Path:
        return self._directory / (_checked(rollout_id) + suffix)

    def path_for(self, rollout_id: str) -> Path:
        return self._file(rollout_id, self._EXCHANGES_SUFFIX)

    def incomplete_path_for(self, rollout_id: str) -> Path:
        return self._file(rollout_id, self._UNFINISHED_SUFFIX)

    def mark_incomplete(self, rollout_id: str) -> None:
        """Leave a marker file saying that at least one exchange of this rollout was lost."""
        self.incomplete_path_for(rollout_id).touch()

    def is_incomplete(self, rollout_id: str) -> bool:
        marker = self.incomplete_path_for(rollout_id)
        return marker.exists()

    def record(self, rollout_id: str, exchange: dict[str, Any]) -> None:
        """Append one exchange as a single JSON line."""
        encoded = orjson.dumps(exchange, default=str, option=orjson.OPT_APPEND_NEWLINE)
        with _locked(self.path_for(rollout_id), "ab", fcntl.LOCK_EX) as out:
            out.write(encoded)
            out.flush()
            os.fsync(out.fileno())

    def read(self, rollout_id: str) -> list[dict[str, Any]]:
        """Every exchange in append order; a damaged line raises ``orjson.JSONDecodeError``."""
        return list(map(orjson.loads, self._lines(rollout_id)))

    def read_available(self, rollout_id: str) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        """``([(position, exchange), ...], damaged lines)``: one bad line does not hide the others."""
        lines = self._lines(rollout_id)
        good = [(index, parsed) for index, line in enumerate(lines) if isinstance(parsed := _json_or_none(line), dict)]
        return good, len(lines) - len(good)

    def _lines(self, rollout_id: str) -> list[bytes]:
        source = self.path_for(rollout_id)
        if not source.exists():
            return []
        with _locked(source, "rb", fcntl.LOCK_SH) as stream:
            content = stream.read()
        return [text for text in (raw.strip() for raw in content.splitlines()) if text]


@contextmanager
def _locked(path: Path, mode: str, lock: int) -> Iterator[IO[Any]]:
    """``path`` opened in binary ``mode`` under an ``flock`` of kind ``lock``, unlocked before it is closed."""
    with open(path, mode) as stream:
        fcntl.flock(stream.fileno(), lock)
        try:
            yield stream
        finally:
            fcntl.flock(stream.fileno(), fcntl.LOCK_UN)


def _json_or_none(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return None


def _checked(rollout_id: str) -> str:
    if not ROLLOUT_ID_PATTERN.match(rollout_id or ""):
        raise ValueError(f"invalid rollout id {rollout_id!r}: letters, digits, '.', '-', '_', not starting with '.'")
    return rollout_id


def read_model_call_records(store: CaptureStore, rollout_id: str) -> list[ModelCallRecord]:
    """The records of one rollout's calls, in append order (a damaged line raises)."""
    exchanges = store.read(rollout_id)
    return [build_model_call_record(exchanges[index], call_index=index) for index in range(len(exchanges))]


def _record_or_none(position: int, exchange: dict[str, Any]) -> ModelCallRecord | None:
    try:
        return build_model_call_record(exchange, call_index=position)
    except ValueError:  # pydantic's ValidationError included: a line of the wrong shape
        return None


def read_available_model_call_records(store: CaptureStore, rollout_id: str) -> tuple[list[ModelCallRecord], int]:
    """The records that can be read, and how many lines could not."""
    parsed, unparsable = store.read_available(rollout_id)
    built = [_record_or_none(position, exchange) for position, exchange in parsed]
    usable = [record for record in built if record is not None]
    return usable, unparsable + len(built) - len(usable)


def aggregate_model_call_metrics(store: CaptureStore, rollout_id: str) -> dict[str, Any]:
    return aggregate_model_call_records(read_model_call_records(store, rollout_id))


# ---------------------------------------------------------------------------------------------------------------------
# The middleware


def _client_session_id(scope: dict[str, Any]) -> str | None:
    """The request's ``x-session-id`` when it came exactly once (two differing copies name no invocation)."""
    found = [value for name, value in scope.get("headers") or () if name.lower() == b"x-session-id"]
    return found[0].decode("latin-1") if len(found) == 1 and found[0] else None


def _error_category(status: int | None) -> str | None:
    if status is None or status < 400:
        return None
    named = {408: "timeout", 504: "timeout", 429: "rate_limit", 401: "auth", 403: "auth", 404: "not_found"}
    return named.get(status, "client_error" if status < 500 else "upstream_error")


def _exception_category(error: BaseException) -> str:
    name = type(error).__name__.lower()
    if isinstance(error, asyncio.TimeoutError) or "timeout" in name:
        return "timeout"
    return "connection" if "conn" in name else "exception"


def _streamed_response(raw: bytes, dialect: str) -> dict[str, Any] | None:
    """The final object of a server-sent event stream where the stream carries one (Responses: the last
    ``response.*`` event with a ``response``; Chat: the chunks' message text and usage; Messages: the start
    message with the deltas' usage)."""
    events: list[dict[str, Any]] = []
    for line in raw.splitlines():
        if line.startswith(b"data:") and (data := line[5:].strip()) and data != b"[DONE]":
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict):
                events.append(event)
    if dialect == "responses":
        finals = [event["response"] for event in events if isinstance(event.get("response"), dict)]
        return finals[-1] if finals else None
    if dialect == "chat" and events:
        text = "".join(
            choice.get("delta", {}).get("content") or ""
            for event in events
            for choice in event.get("choices") or []
            if isinstance(choice, dict)
        )
        finish = next(
            (c.get("finish_reason") for e in events for c in e.get("choices") or [] if c.get("finish_reason")), None
        )
        usage = next((event["usage"] for event in reversed(events) if isinstance(event.get("usage"), dict)), None)
        first = events[0]
        return {
            "id": first.get("id"), "model": first.get("model"), "object": "chat.completion", "usage": usage,
            "choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": text}}],
        }  # fmt: skip
    if dialect == "messages":
        start = next((event["message"] for event in events if isinstance(event.get("message"), dict)), None)
        if start is None:
            return None
        message = dict(start)
        for event in events:
            if event.get("type") == "message_delta":
                message["usage"] = {**(message.get("usage") or {}), **(event.get("usage") or {})}
                message["stop_reason"] = (event.get("delta") or {}).get("stop_reason") or message.get("stop_reason")
        return message
    return None


def _record(
    store: CaptureStore, rollout_id: str, exchange: dict[str, Any], request: bytes, body: bytes, streaming: bool
) -> None:
    """Parse the copies and append the exchange (runs in a worker thread; never raises)."""
    try:
        try:
            parsed_request = orjson.loads(request) if request else None
        except orjson.JSONDecodeError:
            parsed_request = None
        exchange["request"] = parsed_request if isinstance(parsed_request, dict) else None
        if request and exchange["request"] is None:
            exchange["request_raw"] = request.decode("utf-8", "replace")
        response: Any = None
        if body:
            try:
                response = _streamed_response(body, exchange["dialect"]) if streaming else orjson.loads(body)
            except orjson.JSONDecodeError:
                response = None
        exchange["response"] = response if isinstance(response, dict) else None
        if body and (streaming or exchange["response"] is None):
            exchange["response_raw"] = body.decode("utf-8", "replace")
        if exchange["error_category"] is None and body and exchange["response"] is None:
            exchange["error_category"] = "capture_parse_error"
        store.record(rollout_id, exchange)
    except Exception:
        _flag_incomplete(store, rollout_id)


def _flag_incomplete(store: CaptureStore, rollout_id: str) -> None:
    """A lost exchange must not pass for a complete capture: log why, then leave the rollout's incomplete marker."""
    logger.warning("model-call capture failed for rollout %s", rollout_id, exc_info=True)
    with contextlib.suppress(OSError):
        store.mark_incomplete(rollout_id)
        return
    logger.warning("could not mark the capture of rollout %s incomplete either", rollout_id)


class _CaptureMiddleware:
    """Pure ASGI (streams pass through unbuffered): strip ``/ng-rollout/<id>``, copy the exchange, append it."""

    def __init__(
        self, app: Any, *, store: CaptureStore | None, model_server_name: str | None, **token_capture: Any
    ) -> None:
        """``token_capture``: NeMo Gym 0.7's training-capture arguments (``lineage_store``, ``external_staging``, ...),
        which put our training-capture layer in front of this one (``token_capture.training_capture_layer``)."""
        from nemo_gym.observability.token_capture import training_capture_layer

        self._app = app
        self._store = store
        self._model_ref = {"type": "responses_api_models", "name": model_server_name} if model_server_name else None
        token_capture.pop("non_generating_requests", None)  # every unobserved path is forwarded untouched here
        self._entry = training_capture_layer(self._observe, **token_capture) or self._observe

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self._entry(scope, receive, send)

    async def _observe(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self._app(scope, receive, send)
            return
        rollout_id, _, path = split_rollout_path(scope.get("path", ""))
        if rollout_id is not None:
            scope = {**scope, "path": path, "raw_path": path.encode()}
        dialect = OBSERVED_PATHS.get(path)
        if self._store is None or rollout_id is None or dialect is None:
            await self._app(scope, receive, send)
            return
        await self._capture(scope, receive, send, self._store, rollout_id, dialect)

    async def _capture(
        self, scope: dict[str, Any], receive: Any, send: Any, store: CaptureStore, rollout_id: str, dialect: str
    ) -> None:
        request, body = bytearray(), bytearray()
        state: dict[str, Any] = {"status": None, "streaming": False, "ttft_ms": None}
        held: list[dict[str, Any]] = []
        started_at, start = time.time(), time.perf_counter()

        async def copy_request() -> dict[str, Any]:
            message = await receive()
            if message.get("type") == "http.request":
                request.extend(message.get("body", b""))
            return message

        async def copy_response(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message.get("status")
                content_type = dict(message.get("headers") or []).get(b"content-type", b"")
                state["streaming"] = content_type.startswith(b"text/event-stream")
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                if chunk and state["ttft_ms"] is None:
                    state["ttft_ms"] = (time.perf_counter() - start) * 1000.0
                body.extend(chunk)
                if not message.get("more_body", False):
                    held.append(message)  # released once the exchange is on disk
                    return
            await send(message)

        call_id = (scope.get("state") or {}).get("nemo_gym_model_call_id") or uuid4().hex  # shared with token capture
        exchange: dict[str, Any] = {
            "model_call_id": call_id, "dialect": dialect, "model_ref": self._model_ref, "started_at": started_at,
        }  # fmt: skip
        exchange["status_code"], exchange["error_category"] = None, None
        if (client_session_id := _client_session_id(scope)) is not None:
            exchange["client_session_id"] = client_session_id
        try:
            await self._app(scope, copy_request, copy_response)
            exchange["status_code"] = state["status"]
            exchange["error_category"] = _error_category(state["status"])
        except Exception as error:
            status = state["status"] or getattr(error, "status_code", None) or getattr(error, "status", None)
            exchange["status_code"] = status if isinstance(status, int) else None
            exchange["error_category"] = _error_category(exchange["status_code"]) or _exception_category(error)
            raise
        finally:
            exchange["completed_at"] = time.time()
            exchange["latency_ms"] = round((time.perf_counter() - start) * 1000.0, 2)
            exchange["latency_ttft_ms"] = None if state["ttft_ms"] is None else round(state["ttft_ms"], 2)
            try:
                await asyncio.to_thread(
                    _record, store, rollout_id, exchange, bytes(request), bytes(body), state["streaming"]
                )
            finally:
                for message in held:
                    await send(message)


def install_model_call_capture(app: Any, config: ModelCallCaptureConfig, *, model_server_name: str | None) -> bool:
    """Add :class:`_CaptureMiddleware` when capture is on (True); otherwise only the prefix stripping (False).

    An enabled ``token_id_capture`` block also adds training-token capture (``token_capture.py``) outside it. The
    ``/ng-rollout/<id>`` prefix is always stripped before routing, capture or not, as NeMo Gym's model servers do.
    """
    app.add_middleware(RolloutContextMiddleware)  # innermost: a no-op on paths the capture layers already stripped
    directory = config.model_call_capture_dir if config.observability_enabled else None
    evaluation = directory is not None
    if directory is not None:
        app.add_middleware(_CaptureMiddleware, store=CaptureStore(directory), model_server_name=model_server_name)
    if config.training_token_capture is not None:
        from nemo_gym.observability.token_capture import install_training_token_capture

        install_training_token_capture(app, config.training_token_capture, keep_prefix=evaluation)
    return evaluation
