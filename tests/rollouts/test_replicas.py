"""Replicas of an agent (a launch on a Ray cluster): rows spread over them, a lost one is routed around, and the
breakers pause the run only when every replica of a server is down (``rollouts/replicas.py``, ``breaker.py``)."""

from __future__ import annotations

import asyncio

from nemo_gym.rollouts.breaker import Breakers, Server
from nemo_gym.rollouts.replicas import Router

AGENTS = "responses_api_agents"
REPLICAS = [
    Server("agent@0", AGENTS, "http://127.0.0.1:1", group="agent", node="n1"),
    Server("agent@1", AGENTS, "http://127.0.0.1:2", group="agent", node="n2"),
    Server("env@1", "resources_servers", "http://127.0.0.1:3", group="env", node="n2"),
    Server("model", "responses_api_models", "http://127.0.0.1:4"),
]


def breakers(down: set[str], **options: object) -> tuple[Breakers, list[str]]:
    said: list[str] = []

    async def probe(url: str) -> str | None:
        return "connection refused" if url in down else None

    return Breakers(REPLICAS, 60.0, probe=probe, say=said.append, **options), said  # type: ignore[arg-type]


def test_rows_go_to_the_least_busy_replica():
    router = Router({"agent": "http://127.0.0.1:1"}, REPLICAS, lambda name: False, set)
    picked = [router.pick("agent")[0] for _ in range(4)]
    assert sorted(picked) == ["agent@0", "agent@0", "agent@1", "agent@1"]
    router.release("agent@1", scored=True)
    assert router.pick("agent") == ("agent@1", "http://127.0.0.1:2")
    assert router.served == {"agent@1": 1}


def test_an_agent_without_replicas_is_its_own_url():
    router = Router({"solo": "http://127.0.0.1:9"}, REPLICAS, lambda name: False, set)
    assert not router.replicated("solo") and router.pick("solo") == ("solo", "http://127.0.0.1:9")


def test_a_down_replica_and_every_replica_on_a_down_node_get_no_rows():
    router = Router({}, REPLICAS, lambda name: name == "agent@1", set)
    assert {router.pick("agent")[0] for _ in range(5)} == {"agent@0"}
    router = Router({}, REPLICAS, lambda name: False, lambda: {"n2"})  # its resources server died: the node is lost
    assert {router.pick("agent")[0] for _ in range(5)} == {"agent@0"}


async def test_a_lost_replica_pauses_nothing_while_a_sibling_is_up():
    group, said = breakers(down={"http://127.0.0.1:2", "http://127.0.0.1:3"}, threshold=1)
    try:
        assert await group.is_down(REPLICAS[1])
        assert group.known_down("agent@1") and group.down_nodes() == {"n2"}
        await asyncio.wait_for(group.wait_until_closed(), 60)  # returns at once: not paused
        assert "other replicas of 'agent'" in said[0]
    finally:
        await group.aclose()


async def test_every_replica_down_pauses_the_run():
    group, said = breakers(down={"http://127.0.0.1:1", "http://127.0.0.1:2"}, threshold=1)
    try:
        assert await group.is_down(REPLICAS[1]) and await group.is_down(REPLICAS[0])
        assert not group._closed.is_set(), "both replicas are down: the run must wait"
        assert "pausing rollouts" in said[-1]
    finally:
        await group.aclose()


async def test_past_the_deadline_a_lost_replica_is_left_out_instead_of_stopping_the_run():
    group, said = breakers(down={"http://127.0.0.1:2"}, threshold=1, probe_interval_s=0)
    group.deadline_s = 0
    try:
        assert await group.is_down(REPLICAS[1])
        watcher = group._breakers["agent@1"].watcher
        assert watcher is not None
        await asyncio.wait_for(watcher, 60)
        await asyncio.wait_for(group.wait_until_closed(), 60)  # no ServersDownError
        assert "left out of this run" in said[-1]
    finally:
        await group.aclose()
