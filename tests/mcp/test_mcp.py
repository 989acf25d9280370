"""Acceptance 3 of issue 16 with the official ``mcp`` SDK client, real processes on loopback.

A resources server (example_session_state_mgmt, a per-rollout counter) with ``expose_tools_over_mcp: true`` runs in
its own process: the SDK lists and calls its tools, and two MCP sessions seeded as two rollouts never see each
other's counter. Then ``gym eval run`` drives mcp_agent (tools from that server's ``/mcp``) with the scripted model
as the policy and scores the rollout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

mcp = pytest.importorskip("mcp")
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 60
TOKEN_HEADER = "X-NeMo-Gym-Session-Token"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SERVER = textwrap.dedent(
    """
    import socket, sys
    from unittest.mock import MagicMock
    import uvicorn
    from nemo_gym.server_utils import ServerClient
    from resources_servers.example_session_state_mgmt.app import (
        ExampleSessionStateMgmtResourcesServer as Server, ExampleSessionStateMgmtResourcesServerConfig as Config)
    sock = socket.create_server(("127.0.0.1", 0))
    config = Config(host="127.0.0.1", port=sock.getsockname()[1], entrypoint="app.py", name="counter",
                    expose_tools_over_mcp=True)
    app = Server(config=config, server_client=MagicMock(spec=ServerClient)).setup_webserver()
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    """
)


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", SERVER], cwd=REPO, stdout=subprocess.PIPE, text=True,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        assert child.stdout is not None
        port = child.stdout.readline().strip()  # printed before serving: the socket is already listening
        assert port.isdigit(), port
        yield f"http://127.0.0.1:{port}"
    finally:
        child.terminate()
        child.wait(timeout=HANG_GUARD_S)


def _seed(url: str, initial_count: int) -> dict[str, Any]:
    """A new rollout: its /seed_session answer (with the MCP metadata), from a client with no cookie."""
    answer = httpx.post(f"{url}/seed_session", json={"initial_count": initial_count}, timeout=HANG_GUARD_S)
    answer.raise_for_status()
    return answer.json()["mcp"]


@asynccontextmanager
async def _session(url: str, metadata: dict[str, Any]) -> AsyncIterator[ClientSession]:
    async with (
        httpx.AsyncClient(headers=metadata["headers"], timeout=HANG_GUARD_S) as client,
        streamable_http_client(url + metadata["url_path"], http_client=client) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def _json(result: Any) -> Any:
    assert not result.isError, result
    return json.loads(result.content[0].text)


async def test_the_sdk_lists_and_calls_the_tools(server_url: str) -> None:
    metadata = _seed(server_url, initial_count=3)
    assert metadata["server_name"] == "counter" and metadata["url_path"] == "/mcp"
    async with _session(server_url, metadata) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(tools) == {"increment_counter", "get_counter_value"}  # never /seed_session, /verify, ...
        assert tools["increment_counter"].inputSchema["properties"]["count"]["type"] == "integer"
        assert _json(await session.call_tool("increment_counter", {"count": 2})) == {"success": True}
        assert _json(await session.call_tool("get_counter_value", {})) == {"count": 5}
        bad = await session.call_tool("increment_counter", {"count": "many"})
        assert bad.isError and "422" in bad.content[0].text  # the route's own validation, as text for the model
        unknown = await session.call_tool("verify", {})
        assert unknown.isError


async def test_two_mcp_sessions_do_not_see_each_others_state(server_url: str) -> None:
    first, second = _seed(server_url, initial_count=10), _seed(server_url, initial_count=100)
    assert first["headers"][TOKEN_HEADER] != second["headers"][TOKEN_HEADER]
    async with _session(server_url, first) as one, _session(server_url, second) as two:
        await one.call_tool("increment_counter", {"count": 1})
        await two.call_tool("increment_counter", {"count": 7})
        await one.call_tool("increment_counter", {"count": 1})
        assert _json(await one.call_tool("get_counter_value", {})) == {"count": 12}
        assert _json(await two.call_tool("get_counter_value", {})) == {"count": 107}


async def test_a_tool_call_without_the_rollout_token_is_an_error(server_url: str) -> None:
    _seed(server_url, initial_count=0)
    async with _session(server_url, {"headers": {}, "url_path": "/mcp"}) as session:
        assert {tool.name for tool in (await session.list_tools()).tools}  # listing needs no rollout
        result = await session.call_tool("get_counter_value", {})
        assert result.isError and TOKEN_HEADER in result.content[0].text


SCRIPT = [
    [{"type": "function_call", "name": "increment_counter", "arguments": '{"count": 1}'}],
    [{"type": "function_call", "name": "increment_counter", "arguments": '{"count": 2}'}],
    [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "The count is 6."}]}],
]


def test_mcp_agent_completes_a_scored_rollout_with_gym_eval_run(workdir: Path) -> None:
    """Row: start at 3, add 1 then 2, expect 6. The row's own tools are dropped: the agent offers the MCP ones."""
    row = json.loads(
        (REPO / "resources_servers/example_session_state_mgmt/data/example.jsonl").read_text().split("\n")[0]
    )
    row["responses_create_params"].pop("tools")
    rows = workdir / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    script = workdir / "script.yaml"
    script.write_text(json.dumps({"policy_model": {"responses_api_models": {"scripted_model": {"script": SCRIPT}}}}))
    output = workdir / "out" / "rollouts.jsonl"
    argv = [
        sys.executable, "-m", "nemo_gym.cli.main", "eval", "run", "--resources-server", "example_session_state_mgmt",
        "--config", str(REPO / "responses_api_agents/mcp_agent/configs/example_session_state_mgmt_mcp.yaml"),
        "--model-type", "scripted_model", "--config", str(script),
        "--agent", "example_session_state_mgmt_mcp_agent", "--input", str(rows), "--output", str(output),
        "+shared_venv=true", "+head_server={port: 0}", f"+cache_dir={workdir / 'cache'}",
    ]  # fmt: skip
    env = os.environ | {"NEMO_GYM_ENV_YAML": "", "OPENAI_API_KEY": ""}
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    [rollout] = [json.loads(line) for line in output.read_text().splitlines()]
    assert rollout["reward"] == 1.0 and rollout["final_count"] == 6, rollout
    outputs = rollout["response"]["output"]
    assert [item["output"] for item in outputs if item["type"] == "function_call_output"] == ['{"success":true}'] * 2
    assert {tool["name"] for tool in rollout["response"]["tools"]} == {"increment_counter", "get_counter_value"}
