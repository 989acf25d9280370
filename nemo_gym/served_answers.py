"""The pieces of a model server's answer as its client receives it: request validation, the event streams, and the
Messages form, for the base dispatch in ``base_responses_api_model.py``.

Why the dispatch encodes streams itself instead of leaving it to ``StreamingMiddleware``: a call whose tokens a
framework worker staged (external staging) is committed to the rollout's ledger under the answer the client is served,
and only once that answer was fully made. So the stream is encoded first, committed second, sent third; an answer
that cannot be encoded is never committed. The encoders are looked up on NeMo Gym 0.7's module names
(``responses_streaming._sse_event``, ``chat_streaming._sse_data``, ``AnthropicConverter._sse_event``) at each call, as
0.7 does.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterator
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from nemo_gym import chat_streaming, responses_streaming
from nemo_gym.streaming import CHAT_DONE, chat_completion_chunks, failed_response_events, response_events

STREAMING_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def body_type(handler: Callable[..., Any], default: type[BaseModel]) -> type[Any] | None:
    """What a handler's ``body`` declares: a params model (``default`` when unannotated) the body is validated into,
    or ``dict`` for a handler that takes the JSON as it came. None: the handler does not take a ``body`` beside an
    optional ``request`` (it reads the request itself, and is routed as it is)."""
    parameters = inspect.signature(handler).parameters
    if "body" not in parameters or set(parameters) - {"request", "body"}:
        return None
    try:
        declared = typing.get_type_hints(handler).get("body", default)
    except (NameError, TypeError):
        declared = default
    if isinstance(declared, type) and issubclass(declared, BaseModel):
        return declared
    return dict


def validated(params_type: type[Any], body: Any) -> Any:
    """``body`` as ``params_type``; a failure is FastAPI's own 422, each location under ``body`` as FastAPI puts it."""
    if not (isinstance(params_type, type) and issubclass(params_type, BaseModel)):
        return body
    try:
        return params_type.model_validate(body)
    except ValidationError as error:
        raise RequestValidationError(
            [{**detail, "loc": ("body", *detail["loc"])} for detail in error.errors(include_url=False)]
        ) from None


async def call_handler(handler: Callable[..., Any], request: Any, params: Any) -> Any:
    """Call a handler that takes ``body`` and, if it declares one, ``request``."""
    if "request" in inspect.signature(handler).parameters:
        return await handler(request=request, body=params)
    return await handler(body=params)


def as_json(answer: Any) -> dict[str, Any]:
    """A handler's answer as plain JSON data (a pydantic model dumped by alias, as it is served)."""
    if isinstance(answer, BaseModel):
        dumped = answer.model_dump(mode="json", by_alias=True)
        return dumped if isinstance(dumped, dict) else {}
    return dict(answer)


def responses_sse(response: dict[str, Any]) -> Iterator[bytes]:
    for event in response_events(response):
        yield _bytes(responses_streaming._sse_event(event))


def responses_failure_sse(message: str) -> Iterator[bytes]:
    for event in failed_response_events(message):
        yield _bytes(responses_streaming._sse_event(event))


def chat_sse(completion: dict[str, Any], include_usage: bool) -> Iterator[bytes]:
    for chunk in chat_completion_chunks(completion, include_usage=include_usage):
        yield _bytes(chat_streaming._sse_data(chunk))
    yield CHAT_DONE


def _bytes(event: str | bytes) -> bytes:
    return event.encode() if isinstance(event, str) else event
