"""mcp_agent's tool dispatch without servers: bad calls become error text the model reads.

The loop against real servers (an MCP-exposed resources server, the scripted model, `gym eval run`) is tested in the
core suite: tests/mcp/test_mcp.py.
"""

from __future__ import annotations

import json
from typing import Any

from mcp.types import CallToolResult, TextContent

from responses_api_agents.mcp_agent.app import MCPAgentConfig, MCPTools


class _Session:
    def __init__(self, result: CallToolResult) -> None:
        self.result = result
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        self.calls.append((name, arguments))
        return self.result


def _tools(result: CallToolResult) -> tuple[MCPTools, _Session]:
    tools, session = MCPTools(), _Session(result)
    tools.sessions["add"] = session  # type: ignore[assignment]
    return tools, session


async def test_a_call_goes_to_the_session_that_offers_the_tool() -> None:
    tools, session = _tools(CallToolResult(content=[TextContent(type="text", text='{"sum": 3}')]))
    assert await tools.call({"name": "add", "arguments": '{"a": 1, "b": 2}'}) == '{"sum": 3}'
    assert session.calls == [("add", {"a": 1, "b": 2})]


async def test_bad_calls_are_error_text() -> None:
    tools, session = _tools(CallToolResult(content=[TextContent(type="text", text="HTTP 422")], isError=True))
    assert "Unknown tool" in json.loads(await tools.call({"name": "nope", "arguments": "{}"}))["error"]
    assert "Invalid tool call arguments" in json.loads(await tools.call({"name": "add", "arguments": "{"}))["error"]
    assert "JSON object" in json.loads(await tools.call({"name": "add", "arguments": "[1]"}))["error"]
    assert json.loads(await tools.call({"name": "add", "arguments": "{}"})) == {"error": "HTTP 422"}
    assert session.calls == [("add", {})]


def test_config_defaults() -> None:
    config = MCPAgentConfig(
        host="127.0.0.1", port=1, entrypoint="app.py", name="agent",
        resources_server={"type": "resources_servers", "name": "env"},
        model_server={"type": "responses_api_models", "name": "policy_model"},
    )  # fmt: skip
    assert config.mcp_servers == [] and config.max_steps == 10
