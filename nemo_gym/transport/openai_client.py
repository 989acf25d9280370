"""NeMo Gym's ``NeMoGymAsyncOpenAI``: an OpenAI-compatible endpoint called through the shared pool, no SDK.

The ``openai`` SDK brings its own HTTP stack (httpx, its pool, its retries) into every process that imports it.
Servers only need "POST this JSON, give me the JSON back", so this client sends it through
:mod:`nemo_gym.transport.passthrough`, which is imported on the first call: building a client loads nothing.

Retries: a status in :data:`RATE_LIMIT_ERROR_CODES` is retried until the transport's deadline (``total_timeout_s``)
with jittered backoff that honours ``Retry-After``; any other status of :data:`RETRY_ERROR_CODES` (500, and 404/408 as
NeMo Gym 0.7 retries them) until ``max_http_attempts`` attempts in all (:data:`MAX_SERVER_ERROR_TRIES` by default).
Then the last answer is raised as :class:`~nemo_gym.transport.failures.StatusError`: our ``ServerRequestError`` and
aiohttp's ``ClientResponseError`` with the body as ``response_content``, which NeMo Gym's model servers inspect (a
context-length 400 from vLLM). A connection that fails is retried ``max_connection_retries`` times at most, then
aiohttp's error is raised; unset, the transport's own connection budget applies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

from pydantic import BaseModel, Field

__all__ = ["MAX_SERVER_ERROR_TRIES", "RATE_LIMIT_ERROR_CODES", "RETRY_ERROR_CODES", "NeMoGymAsyncOpenAI"]

logger = logging.getLogger(__name__)

RATE_LIMIT_ERROR_CODES: Final[list[int]] = [429, 502, 503, 504, 520]
"""Statuses of an endpoint that is overloaded or rate limited: retried for as long as the deadline allows."""
RETRY_ERROR_CODES: Final[list[int]] = [*RATE_LIMIT_ERROR_CODES, 404, 408, 500]
"""Every status worth another try. Those that are not rate limiting only a few times (``max_http_attempts``): a 500
is often sporadic, and a 404 or 408 can come from an endpoint that is still starting or being moved."""
MAX_SERVER_ERROR_TRIES: Final[int] = 3


class NeMoGymAsyncOpenAI(BaseModel):
    """``await client.create_chat_completion(model=..., messages=[...])`` returns the endpoint's JSON as a dict."""

    base_url: str
    api_key: str
    internal: bool = Field(default=False, description="Only calls servers of this config (kept for NeMo Gym).")
    max_connection_retries: int | None = Field(
        default=None,
        description="Attempts when the connection fails before aiohttp's error is raised (a caller that can find a "
        "moved endpoint sets it); None: the transport's own connection budget.",
    )
    max_http_attempts: int = Field(
        default=MAX_SERVER_ERROR_TRIES,
        ge=1,
        description="Attempts in all for a retryable status that is not rate limiting (500, 404, 408).",
    )
    default_headers: dict[str, str] = Field(default_factory=dict, description="Sent with every request.")

    async def create_chat_completion(self, **kwargs: Any) -> Any:
        return await self._call("POST", f"{self.base_url}/chat/completions", kwargs)

    async def create_completion(self, **kwargs: Any) -> Any:
        return await self._call("POST", f"{self.base_url}/completions", kwargs)

    async def create_response(self, **kwargs: Any) -> Any:
        return await self._call("POST", f"{self.base_url}/responses", kwargs)

    async def create_models(self) -> Any:
        return await self._call("GET", f"{self.base_url}/models", None)

    async def create_tokenize(self, **kwargs: Any) -> Any:
        """vLLM's ``/tokenize``, which lives beside ``/v1``, not under it."""
        return await self._call("POST", f"{self.base_url.removesuffix('/v1')}/tokenize", kwargs)

    async def _call(self, method: str, url: str, body: dict[str, Any] | None) -> Any:
        from nemo_gym.transport import passthrough
        from nemo_gym.transport.http_client import _backoff_s, response_json, without_credentials
        from nemo_gym.transport.types import get_default_config

        cfg = get_default_config()
        headers = {**self.default_headers, "Authorization": f"Bearer {self.api_key}"}
        deadline = time.monotonic() + cfg.total_timeout_s
        server_errors = 0
        attempt = 0
        while True:
            attempt += 1
            response = await _send()(
                method=method,
                url=url,
                json=body,
                headers=headers,
                _internal=self.internal,
                _max_connection_retries=self.max_connection_retries,
            )
            await response.read()  # hands the connection back, and keeps the body for an error message
            if response.status not in RETRY_ERROR_CODES:
                break
            server_errors += response.status not in RATE_LIMIT_ERROR_CODES
            delay = _backoff_s(cfg, attempt, response)
            if server_errors >= self.max_http_attempts or time.monotonic() + delay >= deadline:
                break
            logger.info(
                "retrying %s %s after HTTP %d (attempt %d)", method, without_credentials(url), response.status, attempt
            )
            await asyncio.sleep(delay)
        await passthrough.check_status(response)
        return await response_json(response)


def _send() -> Any:
    """The send function, looked up on every call: ``nemo_gym.openai_utils.request`` when something replaced it there
    (NeMo Gym 0.7's client sends through that module attribute, and tests patch it), else the pooled transport."""
    import sys

    from nemo_gym.transport import passthrough

    face = sys.modules.get("nemo_gym.openai_utils")
    patched = vars(face).get("request") if face is not None else None
    return passthrough.request if patched is None else patched
