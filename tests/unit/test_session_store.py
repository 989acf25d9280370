"""The bounded per-session store stateful servers keep their rollouts' state in."""

from __future__ import annotations

import pytest

from nemo_gym.session_store import SessionStore


def test_least_recently_used_sessions_are_evicted_beyond_the_bound():
    store = SessionStore[int](max_sessions=2)
    store.set("a", 1)
    store.set("b", 2)
    assert store.get("a") == 1  # reading "a" makes "b" the oldest
    store.set("c", 3)
    assert ("a" in store, "b" in store, "c" in store, len(store)) == (True, False, True, 2)


def test_pop_removes_and_unknown_sessions_are_none():
    store = SessionStore[str]()
    store.set("s", "state")
    assert (store.pop("s"), store.pop("s"), store.get("s")) == ("state", None, None)


def test_overwriting_keeps_one_entry():
    store = SessionStore[int](max_sessions=1)
    store.set("s", 1)
    store.set("s", 2)
    assert (len(store), store.get("s")) == (1, 2)


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        SessionStore(max_sessions=0)
