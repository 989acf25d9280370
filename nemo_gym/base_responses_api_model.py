"""Model servers: adapters that expose any LLM backend as ``/v1/responses`` and ``/v1/chat/completions``.

Subclasses implement ``responses()`` and ``chat_completions()``; bodies are validated strictly, so a malformed
request is a 422 naming the bad field rather than an error deep in the backend. ``stream: true`` needs nothing from
a subclass: ``StreamingMiddleware`` (``nemo_gym/streaming.py``) turns the finished result into the event stream, and a
subclass whose engine makes text incrementally may answer with its own stream (see ``stream_options``).
``GET /v1/models`` lists ``model_ids()``. ``POST /v1/messages`` (Anthropic's Messages API) needs nothing either:
``MessagesMiddleware`` (``nemo_gym/anthropic_messages.py``) answers it through ``/v1/responses``.

A handler that knows more about a call than its answer says (it never reached the engine, the answer was made
locally) records it with :func:`start_model_execution` (``observability/execution.py``), for the model-call capture.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson
from fastapi import Body, FastAPI, Response
from pydantic import BaseModel

from nemo_gym.anthropic_messages import MessagesMiddleware as _MessagesMiddleware
from nemo_gym.config.server_models import BaseRunServerInstanceConfig
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
from nemo_gym.streaming import StreamingMiddleware as _StreamingMiddleware
from nemo_gym.streaming_dialects import reconstruct_streamed_response as _reconstruct_streamed_response

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


def observability_enabled_from_config(global_config_dict: Any) -> bool:
    """The run's ``observability_enabled`` switch (on without a capture directory: a ``ConfigError``)."""
    return ModelCallCaptureConfig.of(global_config_dict).observability_enabled


def _orjson_dispatch_response(content: Any) -> Any:
    """A finished answer as one orjson-encoded JSON ``Response``: FastAPI's own encoder walks every token id and
    log-prob of a training answer before encoding it. A ``Response`` a handler built itself is passed on as it is."""
    if isinstance(content, Response):
        return content
    data = content.model_dump(mode="json", by_alias=True) if isinstance(content, BaseModel) else content
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
        app.post("/v1/responses")(self.responses)
        app.post("/v1/chat/completions")(self.chat_completions)
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

    async def chat_completions(self, body: NeMoGymChatCompletionCreateParamsNonStreaming) -> NeMoGymChatCompletion:
        raise NotImplementedError(f"{type(self).__name__} must implement chat_completions()")
