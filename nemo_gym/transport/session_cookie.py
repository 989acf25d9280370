"""The session a server gives each client: a random id in a cookie named after the server instance.

Resources servers keep per-rollout state under ``request.session["session_id"]``; the agent threads the cookies of
each rollout through its calls. Pure ASGI, so it costs one header scan per request.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

__all__ = ["SESSION_ID_KEY", "SessionCookieMiddleware"]

SESSION_ID_KEY = "session_id"
"""Where the id is found: ``request.session[SESSION_ID_KEY]``."""


class SessionCookieMiddleware:
    """Gives every client a session id, carried in a cookie named after this server instance.

    The id is exposed as ``request.session["session_id"]``. Each server has its own cookie name, so one cookie jar (an
    agent threading cookies through a rollout) carries the sessions of several servers at once. Ids are random
    128-bit tokens; a cookie that is not one is replaced. Every response carries the cookie, as NeMo Gym's do: a
    caller that keeps only the last response's cookies (``cookies = resp.cookies``) stays in its session.
    """

    def __init__(self, app: Any, cookie_name: str) -> None:
        self.app = app
        self.cookie_name = cookie_name
        self._prefix = f"{cookie_name}=".encode()
        # One part of a Cookie header that is exactly `<name>=<32 lowercase hex>` (spaces around it allowed).
        self._valid = re.compile(
            rb"(?:^|;)[ \t\n\r\x0b\x0c]*" + re.escape(self._prefix) + rb"([0-9a-f]{32})[ \t\n\r\x0b\x0c]*(?:;|\Z)"
        )

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session_id = self._read_cookie(scope) or secrets.token_hex(16)
        scope["session"] = {SESSION_ID_KEY: session_id}
        cookie = f"{self.cookie_name}={session_id}; Path=/; HttpOnly; SameSite=Lax".encode()

        async def send_with_cookie(message: dict) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"set-cookie", cookie)]
            await send(message)

        await self.app(scope, receive, send_with_cookie)

    def _read_cookie(self, scope: dict) -> str | None:
        for name, value in scope.get("headers", ()):
            if name == b"cookie" and self._prefix in value:
                found = self._valid.search(value)
                if found is not None:
                    return found.group(1).decode("latin-1")
        return None
