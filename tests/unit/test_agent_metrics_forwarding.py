"""An agent whose ``aggregate_metrics`` only asks its resources server passes the run's rows on as bytes.

``@forwards_aggregate_metrics`` lets the route send the body it got to the resources server as it came and hand the
answer back likewise. Every request must get what the typed route gives: the same status and JSON value, the same
422 for a bad body, the same error for a bad answer. Here the same agent is asked with and without the mark.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from omegaconf import OmegaConf

from nemo_gym.base_responses_api_agent import (
    BaseResponsesAPIAgentConfig,
    SimpleResponsesAPIAgent,
    forwards_aggregate_metrics,
)
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest, BaseServerConfig, ResourcesServerRef
from nemo_gym.server_utils import ServerClient
from nemo_gym.transport.lean_client import LeanResponse

pytestmark = pytest.mark.timeout(60)

ROWS = [
    {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "response": {"usage": {"total_tokens": 7}}},
    {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0, "note": "ü ✓", "nested": {"a": [1, None, True]}},
]
METRICS = {"agent_metrics": {"mean/reward": 0.5}, "key_metrics": {"mean/reward": 0.5}, "group_level_metrics": [{}]}


class _Client(ServerClient):
    """Answers every call with one canned response, and records each body as it would go on the wire."""

    def __init__(self, status: int, body: bytes) -> None:
        config = OmegaConf.create({"env": {"resources_servers": {"env": {"host": "127.0.0.1", "port": 1}}}})
        super().__init__(head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=config)
        self._answer = (status, body)
        self._sent: list[tuple[str, bytes]] = []

    async def request(self, method: str, server_name: str, url_path: str, **kwargs: Any) -> Any:
        data = kwargs.get("data")
        sent = ("bytes", data) if data is not None else ("json", orjson.dumps(kwargs.get("json")))
        self._sent.append(sent)
        status, body = self._answer
        loop = asyncio.get_running_loop()
        return LeanResponse(method, f"http://127.0.0.1:1{url_path}", status, "", (), body, None, (), loop)


class _Config(BaseResponsesAPIAgentConfig):
    resources_server: ResourcesServerRef


class _Typed(SimpleResponsesAPIAgent):
    config: _Config

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        return await self.resources_server_metrics(self.config.resources_server.name, body)


class _Forwarding(_Typed):
    @forwards_aggregate_metrics
    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        return await self.resources_server_metrics(self.config.resources_server.name, body)


class _Overriding(_Forwarding):
    """A subclass of a forwarding agent with its own ``aggregate_metrics``: that method must answer."""

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        return AggregateMetrics(
            agent_metrics={"own": len(body.verify_responses)}, key_metrics={}, group_level_metrics=[]
        )


def _ask(agent_class: type[_Typed], body: Any, answer: tuple[int, bytes]) -> tuple[Any, list[tuple[str, bytes]]]:
    client = _Client(*answer)
    config = _Config(
        host="127.0.0.1", port=2, entrypoint="app.py", name="agent",
        resources_server={"type": "resources_servers", "name": "env"},
    )  # fmt: skip
    app = agent_class(config=config, server_client=client).setup_webserver()
    with TestClient(app, raise_server_exceptions=False) as http:
        if isinstance(body, bytes):
            reply = http.post("/aggregate_metrics", content=body, headers={"content-type": "application/json"})
        else:
            reply = http.post("/aggregate_metrics", json=body)
    return reply, client._sent


def _same_reply(body: Any, answer: tuple[int, bytes]) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    typed, typed_sent = _ask(_Typed, body, answer)
    forwarded, forwarded_sent = _ask(_Forwarding, body, answer)
    assert forwarded.status_code == typed.status_code
    assert forwarded.headers["content-type"] == typed.headers["content-type"]
    if typed.status_code == 200:
        assert forwarded.json() == typed.json()
    else:
        assert forwarded.text == typed.text
    assert [orjson.loads(sent) for _, sent in forwarded_sent] == [orjson.loads(sent) for _, sent in typed_sent]
    return typed_sent, forwarded_sent


def test_the_rows_go_on_as_the_bytes_that_came_and_the_answer_back_as_it_came() -> None:
    body = b'{ "verify_responses" : [\n' + b",\n".join(orjson.dumps(row) for row in ROWS) + b"]}"
    answer = b'{"agent_metrics": {"mean/reward": 0.5, "big": 4611686018427387904}, "key_metrics": {},\n'
    answer += b' "group_level_metrics": [{"_ng_task_index": 0, "x": 1e-07}]}'
    typed_sent, forwarded_sent = _same_reply(body, (200, answer))
    assert forwarded_sent == [("bytes", body)]  # the request body itself, not a dump of parsed rows
    assert typed_sent[0][0] == "json"
    forwarded, _ = _ask(_Forwarding, body, (200, answer))
    assert forwarded.content == answer


@pytest.mark.parametrize(
    "body",
    [
        {"verify_responses": ROWS},
        {"verify_responses": []},
        {"verify_responses": ROWS, "extra": 1},  # ignored by the model: the typed route sends the rows alone
        {"verify_responses": [1, 2]},  # 422
        {"verify_responses": {"a": 1}},  # 422
        {"rows": ROWS},  # 422
        [ROWS],  # 422
        b'{"verify_responses": [{"reward": NaN}]}',  # only Python's parser takes it
        b'{"verify_responses": [',  # not JSON
    ],
)
def test_every_body_gets_the_typed_routes_reply(body: Any) -> None:
    _same_reply(body, (200, orjson.dumps(METRICS)))


@pytest.mark.parametrize(
    "answer",
    [
        (200, orjson.dumps(METRICS | {"extra": 1})),  # ignored by the model: the typed route leaves it out
        (200, orjson.dumps({"agent_metrics": {}, "key_metrics": {}})),  # invalid: the model's error, a 500
        (200, orjson.dumps(METRICS | {"group_level_metrics": [1]})),
        (200, b"not json"),
        (500, b"Internal Server Error"),
        (422, orjson.dumps({"detail": "no"})),
    ],
)
def test_every_answer_of_the_resources_server_gets_the_typed_routes_reply(answer: tuple[int, bytes]) -> None:
    _same_reply({"verify_responses": ROWS}, answer)


def test_a_subclass_with_its_own_aggregate_metrics_is_served_by_it() -> None:
    reply, sent = _ask(_Overriding, {"verify_responses": ROWS}, (200, orjson.dumps(METRICS)))
    assert reply.status_code == 200
    assert reply.json()["agent_metrics"] == {"own": 2}
    assert sent == []
