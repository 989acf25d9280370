"""LLM-as-judge calls whose failure is not a wrong answer, under NeMo Gym's public name ``nemo_gym.judge``.

A judge that answers, even with text the verifier cannot read, gives a verdict (usually "wrong"). A judge that cannot
be *asked* (unreachable, an HTTP error, a timeout, a reply that is not the expected shape) says nothing about the
model, so scoring the rollout 0 would bias the metrics. Such a call raises :class:`JudgeError`, and
:func:`judge_failsafe` (around ``/verify``) turns it into a row with ``_ng_failure_class: judge_failed``, which the
collector writes to ``<stem>_failures.jsonl``: kept out of the metrics, retried on resume, re-verifiable later.

Use :func:`call_judge` for a plain POST to a judge model server, or wrap a bespoke call in
:func:`reraise_judge_errors`. Wrap the call only, not the scoring around it: every exception inside becomes a
``JudgeError``, so a bug in the verifier would otherwise be filed as a judge failure.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from nemo_gym.errors import TransportError as _TransportError
from nemo_gym.server_utils import ServerClient as _ServerClient
from nemo_gym.server_utils import get_response_json as _get_response_json

__all__ = ["JudgeError", "call_judge", "judge_failsafe", "reraise_judge_errors"]

_JUDGE_FAILED = "judge_failed"
"""The ``_ng_failure_class`` of a rollout whose judge could not be asked."""
_JUDGE_ERROR_KEY = "_ng_failure_judge_error"
"""NeMo Gym's field for the judge error's text (the collector's own ``_ng_failure_message`` carries it too)."""

_ResponseT = TypeVar("_ResponseT", bound=BaseModel)
_T = TypeVar("_T")
_P = ParamSpec("_P")


class JudgeError(_TransportError):
    """A judge model could not be asked. ``server``, ``url_path`` and ``status`` name the failed call when known."""

    def __init__(
        self, message: str, *, server: str | None = None, url_path: str | None = None, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.server = server
        self.url_path = url_path
        self.status = status


async def reraise_judge_errors(coro: Awaitable[_T]) -> _T:
    """Await a judge call; any exception comes out as a :class:`JudgeError` reading ``"<ExceptionType>: <message>"``.

    Cancellation is not an exception here (it is a ``BaseException``) and passes through unchanged.
    """
    try:
        return await coro
    except JudgeError:
        raise
    except Exception as e:
        raise JudgeError(
            f"{type(e).__name__}: {e}",
            server=getattr(e, "server", None),
            url_path=getattr(e, "url_path", None),
            status=getattr(e, "status", None),
        ) from e


async def call_judge(
    server_client: _ServerClient,
    *,
    server_name: str,
    url_path: str,
    json: Any,
    response_model: type[_ResponseT],
) -> _ResponseT:
    """POST ``json`` to the judge server ``server_name`` and parse its reply as ``response_model``.

    ``url_path`` is the judge's API (``/v1/responses`` with ``NeMoGymResponse``, ``/v1/chat/completions`` with
    ``NeMoGymChatCompletion``). An HTTP error is reported as such (status and body), not as a validation error of the
    error body. Any failure raises :class:`JudgeError`.
    """

    async def ask() -> _ResponseT:
        response = await server_client.post(server_name=server_name, url_path=url_path, json=json)
        if not response.ok:
            from nemo_gym.transport.http_client import raise_for_status

            raise_for_status(response, server_name, url_path)
        return response_model.model_validate(await _get_response_json(response))

    return await reraise_judge_errors(ask())


def judge_failsafe(verify_fn: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T | JSONResponse]]:
    """Wrap a ``verify`` so a :class:`JudgeError` answers 200 with a failure row instead of an error.

    The row is the request body plus ``reward: 0.0``, ``mask_sample`` (also in its ``instance_config``),
    ``failure_kind`` and ``_ng_failure_class`` ``judge_failed`` and the error text, so the
    model's ``response`` is kept for a later judge-only re-verification. The wrapper keeps ``verify``'s signature,
    so FastAPI injects the same parameters.
    """

    @functools.wraps(verify_fn)
    async def verify(*args: _P.args, **kwargs: _P.kwargs) -> _T | JSONResponse:
        try:
            return await verify_fn(*args, **kwargs)
        except JudgeError as e:
            body = _request_body(args, kwargs)
            if body is None:
                raise RuntimeError("judge_failsafe: the wrapped verify() received no request body") from e
            from nemo_gym.row_fields import FAILURE_CLASS_KEY, FAILURE_MESSAGE_KEY

            data = body.model_dump()
            settings = data.get("instance_config")
            row = data | {
                "reward": 0.0,
                "mask_sample": True,  # the reward measures nothing: the judge was not asked
                "failure_kind": _JUDGE_FAILED,
                "failure_reason": str(e),
                FAILURE_CLASS_KEY: _JUDGE_FAILED,
                _JUDGE_ERROR_KEY: str(e),
                FAILURE_MESSAGE_KEY: str(e),
                # a trainer that reads the row's instance config sees the mask there too (NeMo Gym 0.7)
                "instance_config": {**(settings if isinstance(settings, dict) else {}), "mask_sample": True},
            }
            return JSONResponse(content=jsonable_encoder(row))

    return verify


def _request_body(args: tuple[Any, ...], kwargs: dict[str, Any]) -> BaseModel | None:
    """The verify request: the ``body`` keyword (as FastAPI passes it), else the first argument shaped like one."""
    body = kwargs.get("body")
    if isinstance(body, BaseModel):
        return body
    candidates = (*kwargs.values(), *args)
    return next((a for a in candidates if isinstance(a, BaseModel) and hasattr(a, "response")), None)
