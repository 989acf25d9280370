"""Model servers: adapters that expose any LLM backend as ``/v1/responses`` and ``/v1/chat/completions``.

Subclasses implement ``responses()`` and ``chat_completions()``; bodies are validated strictly, so a malformed
request is a 422 naming the bad field rather than an error deep in the backend. ``stream: true`` needs nothing from
a subclass: the dispatch (``responses_dispatch`` / ``chat_completions_dispatch``, NeMo Gym 0.7's names) encodes the
finished result as the event stream, and a subclass whose engine makes text incrementally may answer with its own
stream (see ``stream_options``). ``GET /v1/models`` lists ``model_ids()``. ``POST /v1/messages`` (Anthropic's Messages
API) needs nothing either: ``MessagesMiddleware`` (``nemo_gym/anthropic_messages.py``) translates it to
``/v1/responses``, whose dispatch answers with the Message. Whatever the form, ``_finalize_served_response`` receives
the answer exactly as served, before any of it is sent (``served_answers.py`` says why).

A handler that knows more about a call than its answer says (it never reached the engine, the answer was made
locally) records it with :func:`start_model_execution` (``observability/execution.py``), for the model-call capture.
"""

from __future__ import annotations

import logging as _logging
from collections.abc import Callable as _Callable
from collections.abc import Iterable as _Iterable
from collections.abc import Iterator as _Iterator
from typing import Any, ClassVar

import orjson
from fastapi import Body, FastAPI, Response
from fastapi import Request as _Request
from fastapi.responses import StreamingResponse as _StreamingResponse
from pydantic import BaseModel as _BaseModel

from nemo_gym import served_answers as _served
from nemo_gym.anthropic_converter import AnthropicConverter as _AnthropicConverter
from nemo_gym.anthropic_messages import MESSAGES_STATE_KEY as _MESSAGES_STATE_KEY
from nemo_gym.anthropic_messages import SERVED_AS_MESSAGES_HEADER as _SERVED_AS_MESSAGES_HEADER
from nemo_gym.anthropic_messages import MessagesMiddleware as _MessagesMiddleware
from nemo_gym.config.server_models import BaseRunServerInstanceConfig
from nemo_gym.observability import token_capture as _token_capture
from nemo_gym.observability.capture import (
    CaptureStore,
    ModelCallCaptureConfig,
    ModelCallRecord,
    _CaptureMiddleware,
    aggregate_model_call_metrics,
    aggregate_model_call_records,
    build_model_call_record,
    install_model_call_capture,
    read_model_call_records,
)
from nemo_gym.observability.execution import ModelExecutionOutcome, start_model_execution
from nemo_gym.observability.trajectory import merge_model_call_capture_into_record
from nemo_gym.openai_utils import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.server_utils import SimpleServer
from nemo_gym.streaming import SSE_MEDIA_TYPE as _SSE_MEDIA_TYPE
from nemo_gym.streaming import StreamingMiddleware as _StreamingMiddleware
from nemo_gym.streaming import stream_options as _stream_options
from nemo_gym.streaming_dialects import NamespaceMap as _NamespaceMap
from nemo_gym.streaming_dialects import flatten_request_namespaces as _flatten_request_namespaces
from nemo_gym.streaming_dialects import reconstruct_streamed_response as _reconstruct_streamed_response
from nemo_gym.streaming_dialects import restore_namespace_tool_calls as _restore_namespace_tool_calls
from nemo_gym.token_id_capture.sink import current_capture_context as _current_capture_context

_logger = _logging.getLogger(__name__)

__all__ = [
    "BaseResponsesAPIModelConfig",
    "BaseRunServerInstanceConfig",
    "Body",
    "CaptureStore",
    "ModelCallCaptureConfig",
    "ModelCallRecord",
    "ModelExecutionOutcome",
    "NeMoGymChatCompletion",
    "NeMoGymChatCompletionCreateParamsNonStreaming",
    "NeMoGymResponse",
    "NeMoGymResponseCreateParamsNonStreaming",
    "SimpleResponsesAPIModel",
    "SimpleServer",
    "_CaptureMiddleware",
    "_orjson_dispatch_response",
    "_reconstruct_streamed_response",
    "aggregate_model_call_metrics",
    "aggregate_model_call_records",
    "build_model_call_record",
    "install_model_call_capture",
    "merge_model_call_capture_into_record",
    "observability_enabled_from_config",
    "read_model_call_records",
    "start_model_execution",
]


_ANTHROPIC = _AnthropicConverter()


def _messages_sse(message: dict[str, Any]) -> _Iterator[bytes]:
    for event in _ANTHROPIC.anthropic_response_to_sse(message):
        yield event.encode() if isinstance(event, str) else event


def observability_enabled_from_config(global_config_dict: Any) -> bool:
    """The run's ``observability_enabled`` switch (on without a capture directory: a ``ConfigError``)."""
    return ModelCallCaptureConfig.of(global_config_dict).observability_enabled


def _orjson_dispatch_response(content: Any) -> Any:
    """A finished answer as one orjson-encoded JSON ``Response``: FastAPI's own encoder walks every token id and
    log-prob of a training answer before encoding it. A ``Response`` a handler built itself is passed on as it is."""
    if isinstance(content, Response):
        return content
    data = content.model_dump(mode="json", by_alias=True) if isinstance(content, _BaseModel) else content
    return Response(orjson.dumps(data), media_type="application/json")


class BaseResponsesAPIModelConfig(BaseRunServerInstanceConfig):
    pass


class SimpleResponsesAPIModel(SimpleServer):
    config: BaseResponsesAPIModelConfig

    accepts_bearer_token: ClassVar[bool] = True  # openai.OpenAI(base_url=<this server>/v1, api_key=<run token>)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.add_middleware(_MessagesMiddleware)  # /v1/messages, answered by /v1/responses below
        app.add_middleware(_StreamingMiddleware)  # added before capture, so capture records the stream as sent
        capture = ModelCallCaptureConfig.of(getattr(self.server_client, "global_config_dict", None))
        install_model_call_capture(app, capture, model_server_name=self.config.name)
        app.post("/v1/responses")(self.route_for(self.responses, self.responses_dispatch))
        app.post("/v1/chat/completions")(self.route_for(self.chat_completions, self.chat_completions_dispatch))
        app.get("/v1/models")(self.models)
        return app

    def model_ids(self) -> list[str]:
        """What ``GET /v1/models`` lists; a subclass names the model it serves."""
        return [self.config.name]

    async def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": i, "object": "model", "created": 0, "owned_by": "nemo-gym"} for i in self.model_ids()],
        }

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        raise NotImplementedError(f"{type(self).__name__} must implement responses()")

    # -- dispatch: _served.validated body -> handler -> the answer as served (see ``served_answers.py`` for why) ----------

    def route_for(self, handler: _Callable[..., Any], dispatch: _Callable[..., Any]) -> _Callable[..., Any]:
        """The endpoint of a dialect: ``dispatch`` for a handler taking ``body``, else the handler itself."""
        if _served.body_type(handler, _BaseModel) is None:
            return handler

        async def endpoint(request: _Request, body: dict[str, Any] = Body()) -> Any:
            options = _stream_options(request)  # StreamingMiddleware took the flag out before validation
            if options is not None:
                body = {**body, "stream": True, "stream_options": options}
            return await dispatch(request, body)

        return endpoint

    async def _finalize_served_response(self, response: Any) -> None:
        """Called with the answer exactly as its client receives it (Response, Chat completion or Message), once it
        is made and before any of it is sent; a server whose calls are committed elsewhere commits them here."""

    async def responses_dispatch(self, request: _Request, body: dict[str, Any]) -> Any:
        params_type = _served.body_type(self.responses, NeMoGymResponseCreateParamsNonStreaming)
        assert params_type is not None
        asked = getattr(request.state, _MESSAGES_STATE_KEY, None)
        if asked is not None:
            return await self._serve_messages(request, _served.validated(params_type, body), asked)
        if not body.get("stream"):
            return await self._serve_json(await self._invoke_responses(request, _served.validated(params_type, body)))
        # Namespace tools (streaming harnesses send them) are flattened for the engine; the rest is validated as sent,
        # so the stream assembles to exactly the answer the same request gets without streaming.
        request_body = {key: value for key, value in body.items() if key not in ("stream", "stream_options")}
        flattened, namespaces = _flatten_request_namespaces(request_body)
        return await self._stream_responses(request, _served.validated(params_type, flattened), namespaces)

    async def chat_completions_dispatch(self, request: _Request, body: dict[str, Any]) -> Any:
        params_type = _served.body_type(self.chat_completions, NeMoGymChatCompletionCreateParamsNonStreaming)
        assert params_type is not None
        if body.get("stream") is not True:
            completion = await self._invoke_chat_completions(request, _served.validated(params_type, body))
            return await self._serve_json(completion)
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        cleaned = {key: value for key, value in body.items() if key not in ("stream", "stream_options")}
        completion = await self._invoke_chat_completions(request, _served.validated(params_type, cleaned))
        if isinstance(completion, Response):
            return completion
        served = _served.as_json(completion)
        return await self._stream_served_response(served, _served.chat_sse(served, include_usage))

    async def _invoke_responses(self, request: _Request, params: Any) -> Any:
        await _token_capture.resolve_before_handler("responses", params)
        response = await _served.call_handler(self.responses, request, params)
        await _token_capture.capture_handler_answer(response)
        return response

    async def _invoke_chat_completions(self, request: _Request, params: Any) -> Any:
        await _token_capture.resolve_before_handler("chat", params)
        completion = await _served.call_handler(self.chat_completions, request, params)
        await _token_capture.capture_handler_answer(completion)
        return completion

    async def _serve_json(self, answer: Any) -> Any:
        if isinstance(answer, Response):
            return answer
        dispatched = _orjson_dispatch_response(answer)
        await self._finalize_served_response(answer)
        return dispatched

    async def _stream_responses(self, request: _Request, params: Any, namespaces: _NamespaceMap) -> Response:
        """A streamed Response; a failure to make it is the stream's ``response.failed`` (the client was promised
        a stream, so an HTTP 500 would read as a broken connection)."""
        try:
            response = await self._invoke_responses(request, params)
            if isinstance(response, Response):
                return response
            served = _served.as_json(response)
            served["output"] = _restore_namespace_tool_calls(served.get("output") or [], namespaces)
            return await self._stream_served_response(served, _served.responses_sse(served))
        except Exception as error:
            _logger.exception("a streamed /v1/responses answer could not be made")
            return _StreamingResponse(_served.responses_failure_sse(str(error)), media_type=_SSE_MEDIA_TYPE)

    async def _stream_served_response(self, served: Any, events: _Iterable[bytes]) -> _StreamingResponse:
        """The event stream of ``served``; a call committed on serving is encoded whole first (see the module
        ``served_answers``), so an answer that cannot be encoded is never committed."""
        context = _current_capture_context()
        if context is not None and context.external_staging:
            events = list(events)
            await self._finalize_served_response(served)
        return _StreamingResponse(iter(events), media_type=_SSE_MEDIA_TYPE, headers=_served.STREAMING_HEADERS)

    async def _serve_messages(self, request: _Request, params: Any, asked: dict[str, Any]) -> Response:
        """A ``/v1/messages`` call that ``MessagesMiddleware`` translated: answered here as the Message itself, so
        it is the Message that is committed."""
        response = await self._invoke_responses(request, params)
        if isinstance(response, Response):
            return response
        model = asked.get("model") or _served.as_json(response).get("model") or ""
        message = _ANTHROPIC.responses_to_anthropic_response(response, model, asked.get("stop_sequences"))
        if asked.get("stream"):
            served: Response = await self._stream_served_response(message, _messages_sse(message))
        else:
            served = await self._serve_json(message)
        served.headers[_SERVED_AS_MESSAGES_HEADER.decode()] = "1"
        return served

    async def chat_completions(self, body: NeMoGymChatCompletionCreateParamsNonStreaming) -> NeMoGymChatCompletion:
        raise NotImplementedError(f"{type(self).__name__} must implement chat_completions()")
