"""Whole rollouts through simple_agent, run concurrently: the agent's cookie threading is what keeps counters apart.

The resources server and the agent run in-process (ASGI, no sockets); the model is a scripted stand-in that adds 1,
then 2, then reads the counter and answers, whatever the task says.
"""

from __future__ import annotations

import asyncio
import json
from http.cookies import SimpleCookie
from typing import Any
from unittest.mock import MagicMock

import httpx
from yarl import URL

from nemo_gym.server_utils import ServerClient
from resources_servers.example_session_state_mgmt.app import (
    ExampleSessionStateMgmtResourcesServer,
    ExampleSessionStateMgmtResourcesServerConfig,
)
from responses_api_agents.simple_agent.app import SimpleAgent, SimpleAgentConfig

RESOURCES, MODEL = "counter", "policy_model"


class _Reply:
    """Just enough of an aiohttp response for the agent: status, body, cookies."""

    def __init__(self, method: str, url: str, status: int, body: bytes, set_cookies: list[str]) -> None:
        self.method, self.url, self.status, self.reason, self._body = method, URL(url), status, None, body
        self.cookies: SimpleCookie = SimpleCookie()
        for header in set_cookies:
            self.cookies.load(header)

    async def read(self) -> bytes:
        return self._body

    async def text(self) -> str:
        return self._body.decode()


def _scripted_model(params: dict[str, Any]) -> dict[str, Any]:
    """The next model turn, chosen by how many tool results the conversation already holds."""
    done = sum(1 for item in params["input"] if item.get("type") == "function_call_output")
    if done == 0:
        output = [
            {"type": "function_call", "call_id": "a", "name": "increment_counter", "arguments": '{"count": 1}'},
            {"type": "function_call", "call_id": "b", "name": "increment_counter", "arguments": '{"count": 2}'},
        ]
    elif done == 2:
        output = [{"type": "function_call", "call_id": "c", "name": "get_counter_value", "arguments": "{}"}]
    else:
        count = json.loads(params["input"][-1]["output"])["count"]
        output = [{"type": "message", "id": "m", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": f"The count is {count}.", "annotations": []}]}]  # fmt: skip
    return {"id": "r", "created_at": 0, "model": "scripted", "object": "response", "status": "completed",
            "output": output}  # fmt: skip


def _agent_and_server() -> tuple[SimpleAgent, ExampleSessionStateMgmtResourcesServer]:
    server = ExampleSessionStateMgmtResourcesServer(
        config=ExampleSessionStateMgmtResourcesServerConfig(host="0.0.0.0", port=8080, entrypoint="", name=RESOURCES),
        server_client=MagicMock(spec=ServerClient),
    )
    resources_app = server.setup_webserver()

    async def post(server_name: str, url_path: str, json: Any = None, cookies: dict | None = None, **_: Any) -> _Reply:
        await asyncio.sleep(0)  # let concurrent rollouts interleave
        if server_name == MODEL:
            return _Reply("POST", url_path, 200, _json_bytes(_scripted_model(json)), [])
        assert server_name == RESOURCES
        transport = httpx.ASGITransport(app=resources_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            header = "; ".join(f"{k}={v}" for k, v in (cookies or {}).items())
            answer = await client.post(url_path, json=json, headers={"cookie": header} if header else {})
        return _Reply("POST", url_path, answer.status_code, answer.content, answer.headers.get_list("set-cookie"))

    client = MagicMock(spec=ServerClient)
    client.post.side_effect = post
    agent = SimpleAgent(
        config=SimpleAgentConfig(
            host="0.0.0.0",
            port=8081,
            entrypoint="",
            name="agent",
            resources_server={"type": "resources_servers", "name": RESOURCES},
            model_server={"type": "responses_api_models", "name": MODEL},
        ),
        server_client=client,
    )
    return agent, server


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()


def _row(initial_count: int, expected_count: int) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Add 1, then 2, then read the counter."}]},
        "initial_count": initial_count,
        "expected_count": expected_count,
    }


async def test_concurrent_rollouts_keep_separate_counters_and_release_them():
    agent, server = _agent_and_server()
    transport = httpx.ASGITransport(app=agent.setup_webserver())
    rows = [_row(3, 6), _row(10, 13), _row(0, 5), _row(-3, 0)]
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        # All four start before any finishes, and none carries a resources cookie: each seed opens its own session.
        answers = await asyncio.gather(*(client.post("/run", json=row) for row in rows))
    results = [answer.json() for answer in answers]
    assert [answer.status_code for answer in answers] == [200] * 4, [a.text for a in answers]
    assert [r["final_count"] for r in results] == [6, 13, 3, 0]
    assert [r["reward"] for r in results] == [1.0, 1.0, 0.0, 1.0]
    assert all((r["num_increment_calls"], r["num_get_calls"]) == (2, 1) for r in results)
    assert results[0]["response"]["output"][-1]["content"][0]["text"] == "The count is 6."
    assert len(server.store) == 0  # every verified rollout released its state
