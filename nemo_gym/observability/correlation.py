"""Which rollout a request belongs to: ids from ``/run`` bodies, the ``/ng-rollout/<id>`` prefix, a context variable.

An agent that correlates model calls posts to ``/ng-rollout/<id>/v1/responses`` instead of ``/v1/responses``; the
model server's middleware strips the prefix before routing and keys the call's capture by ``<id>``. The id of a
rollout is its explicit ``_ng_rollout_id``, else ``<task>-<rollout>``, with ``-a<n>`` on the n-th retry, so the
collector can find a rollout's captured calls again from the finished row alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from pydantic import BaseModel

from nemo_gym.row_fields import ATTEMPT_INDEX_KEY, ROLLOUT_ID_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY

ROLLOUT_PATH_PREFIX = "ng-rollout"
TOKEN_CAPTURE_PATH_SEGMENT = "training-token-capture"
ROLLOUT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
"""A rollout id is one path segment and one file name: no slashes, no leading dot."""

_PREFIX_START = f"/{ROLLOUT_PATH_PREFIX}/"
_ROLLOUT_ID: ContextVar[str | None] = ContextVar("nemo_gym_rollout_id", default=None)
_PREFIXED_PATH = re.compile(
    rf"^/{ROLLOUT_PATH_PREFIX}/(?P<rollout_id>[A-Za-z0-9][A-Za-z0-9._-]*)"
    rf"(?P<token_capture>/{TOKEN_CAPTURE_PATH_SEGMENT})?(?P<rest>/.*)$"
)


def _lookup(body: BaseModel | Mapping[str, Any], key: str) -> Any:
    """A field of a pydantic body or a plain mapping alike (None where it is absent)."""
    if isinstance(body, Mapping):
        return body.get(key)
    return getattr(body, key, None)


def _base_rollout_id(body: BaseModel | Mapping[str, Any]) -> str | None:
    chosen = _lookup(body, ROLLOUT_ID_KEY)
    if chosen is None:
        indices = _lookup(body, TASK_INDEX_KEY), _lookup(body, ROLLOUT_INDEX_KEY)
        return None if None in indices else "{}-{}".format(*indices)
    if isinstance(chosen, str) and ROLLOUT_ID_PATTERN.match(chosen):
        return chosen
    raise ValueError(
        f"{ROLLOUT_ID_KEY} {chosen!r} is not a usable rollout id: use letters, digits, '.', '-' and '_', "
        "and begin with a letter or digit"
    )


def rollout_id_from_run_body(body: BaseModel | Mapping[str, Any] | None) -> str | None:
    """The capture key of a ``/run`` body, or None when it has neither an explicit id nor both indices.

    A malformed explicit ``_ng_rollout_id`` is a ``ValueError``: rewriting it would make a key nobody can look up.
    """
    if not isinstance(body, (BaseModel, Mapping)):
        return None
    base = _base_rollout_id(body)
    if base is None:
        return None
    retry = _lookup(body, ATTEMPT_INDEX_KEY)
    retry_no = 0 if retry is None else int(retry)
    return base if retry_no <= 0 else f"{base}-a{retry_no}"


def rollout_path_prefix(rollout_id: str | None, *, token_capture: bool = False) -> str:
    """``/ng-rollout/<id>`` (plus the training-capture segment), or "" without an id."""
    if not rollout_id:
        return ""
    return f"/{ROLLOUT_PATH_PREFIX}/{rollout_id}" + (f"/{TOKEN_CAPTURE_PATH_SEGMENT}" if token_capture else "")


def apply_rollout_prefix(base_url: str, rollout_id: str | None, *, token_capture: bool = False) -> str:
    """A model server's root URL with the rollout prefix appended (unchanged without an id)."""
    if not rollout_id:
        return base_url
    return base_url.rstrip("/") + rollout_path_prefix(rollout_id, token_capture=token_capture)


def split_rollout_path(path: str) -> tuple[str | None, bool, str]:
    """``(rollout_id, token_capture, rest)`` of a prefixed path; ``(None, False, path)`` for any other path."""
    found = _PREFIXED_PATH.match(path) if path.startswith(_PREFIX_START) else None
    if found is None:
        return None, False, path
    rollout_id, marker, rest = found.group("rollout_id", "token_capture", "rest")
    return rollout_id, bool(marker), rest


def current_rollout_id() -> str | None:
    """The rollout id of the request being handled (set by :class:`RolloutContextMiddleware`), or None."""
    return _ROLLOUT_ID.get()


@contextmanager
def rollout_context(rollout_id: str | None) -> Iterator[None]:
    """Make ``rollout_id`` the current one for the ``with`` body, then restore whatever was current before."""
    previous = _ROLLOUT_ID.set(rollout_id)
    try:
        yield
    finally:
        _ROLLOUT_ID.reset(previous)


class RolloutContextMiddleware:
    """Pure ASGI: route ``/ng-rollout/<id>/<path>`` as ``/<path>`` with ``<id>`` as the current rollout id.

    A path without the prefix costs one ``startswith`` and is passed through untouched.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        rollout_id, rest = None, ""
        if scope.get("type") == "http":
            rollout_id, _, rest = split_rollout_path(scope.get("path", ""))
        if rollout_id is None:
            await self.app(scope, receive, send)
        else:
            with rollout_context(rollout_id):
                await self.app({**scope, "path": rest, "raw_path": rest.encode()}, receive, send)
