"""A bounded, per-session state store for resources servers.

Stateful environments keep one value per rollout, keyed by the session id from the session cookie. Rollouts that never
finish (a crashed agent, an aborted run) would leak that state forever, so the store is an LRU capped at
``max_sessions``: once full, storing a new session evicts the least recently used one.

Handlers run on one event loop and never await while touching the store, so no lock is needed.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

T = TypeVar("T")

DEFAULT_MAX_SESSIONS = 100_000


class SessionStore(Generic[T]):
    """Session id -> state, evicting the least recently used session beyond ``max_sessions``.

    >>> store = SessionStore[int](max_sessions=1)
    >>> store.set("a", 1); store.set("b", 2)
    >>> "a" in store, store.get("b")
    (False, 2)
    """

    def __init__(self, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self._states: OrderedDict[str, T] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._states

    def get(self, session_id: str) -> T | None:
        """The state, or None for an unknown (or evicted) session; reading counts as use, so it delays eviction."""
        if session_id not in self._states:
            return None
        self._states.move_to_end(session_id)
        return self._states[session_id]

    def set(self, session_id: str, state: T) -> None:
        self._states[session_id] = state
        self._states.move_to_end(session_id)
        while len(self._states) > self.max_sessions:
            self._states.popitem(last=False)

    def pop(self, session_id: str) -> T | None:
        """Remove and return the state (None if absent): for verify or close, which end a session."""
        return self._states.pop(session_id, None)
