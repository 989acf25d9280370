"""mcp_agent: a tool loop whose tools come from MCP servers, not from the task row.

One rollout = ``/seed_session`` on the resources server → open one MCP session on every MCP server (the resources
server's own ``/mcp`` when its ``/seed_session`` answer carries ``"mcp"``, with that rollout's session token, plus any
``mcp_servers`` of the config) → list their tools and offer them to the model in place of the row's ``tools`` →
(``/v1/responses``, then ``tools/call`` for each function call) × up to ``max_steps`` → ``/verify``. A failing tool
call becomes an ``{"error": ...}`` output the model can read; a failing model, seed or verify fails the rollout.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx
import orjson
from fastapi import Request, Response
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, Field

from nemo_gym.base_resources_server import NEMO_GYM_MCP_METADATA_KEY, BaseRunRequest
from nemo_gym.base_responses_api_agent import (
    BaseResponsesAPIAgentConfig,
    SimpleResponsesAPIAgent,
    add_usage,
    forwards_aggregate_metrics,
)
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest, ModelServerRef, ResourcesServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.transport import access
from nemo_gym.transport.http_client import cookies_from, raise_for_status, response_json


class MCPServerSpec(BaseModel):
    """An MCP server reached over streamable HTTP, shared by every rollout (its tools must keep no rollout state)."""

    url: str
    headers: dict[str, str] = Field(default_factory=dict)


class MCPAgentConfig(BaseResponsesAPIAgentConfig):
    resources_server: ResourcesServerRef
    model_server: ModelServerRef
    max_steps: int = Field(default=10, ge=1)
    """Most model calls in one rollout."""
    mcp_servers: list[MCPServerSpec] = Field(default_factory=list)
    """More MCP servers whose tools the model gets, besides the resources server's own ``/mcp``."""
    mcp_timeout_s: float = Field(default=300.0, gt=0)
    """Deadline of one MCP request (a tool call included)."""


class MCPTools:
    """The open MCP sessions of one rollout and which session serves which tool."""

    def __init__(self) -> None:
        self.sessions: dict[str, ClientSession] = {}
        self.definitions: list[dict[str, Any]] = []

    async def add(self, stack: AsyncExitStack, url: str, headers: dict[str, str], timeout_s: float) -> None:
        """Open a session on ``url``, and take its tools; a name two servers offer is an error (which to call?)."""
        token = access.registered_token(url)  # the run's servers answer only calls that carry the run token
        headers = headers | {access.TOKEN_HEADER: token} if token else headers
        client = await stack.enter_async_context(httpx.AsyncClient(headers=headers, timeout=timeout_s))
        read, write, _ = await stack.enter_async_context(streamable_http_client(url, http_client=client))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        for tool in (await session.list_tools()).tools:
            if tool.name in self.sessions:
                raise ValueError(f"two MCP servers offer a tool named {tool.name!r} ({url} is the second)")
            self.sessions[tool.name] = session
            self.definitions.append(
                {"type": "function", "name": tool.name, "description": tool.description or "",
                 "parameters": tool.inputSchema, "strict": False}
            )  # fmt: skip

    async def call(self, call: dict[str, Any]) -> str:
        """Run one function call; every failure becomes text the model can read."""
        name = str(call.get("name", ""))
        session = self.sessions.get(name)
        if session is None:
            return _error(f"Unknown tool {name!r}.")
        try:
            arguments = orjson.loads(call.get("arguments") or "{}")
        except orjson.JSONDecodeError as e:
            return _error(f"Invalid tool call arguments for {name!r}: {e}")
        if not isinstance(arguments, dict):
            return _error(f"Invalid tool call arguments for {name!r}: expected a JSON object")
        result = await session.call_tool(name, arguments)
        text = _text(result)
        return _error(text) if result.isError else text


class MCPAgent(SimpleResponsesAPIAgent):
    config: MCPAgentConfig

    async def responses(
        self, request: Request, response: Response, body: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse:
        """One tool loop with the configured ``mcp_servers`` only (no rollout, so no resources server session)."""
        async with AsyncExitStack() as stack:
            tools = await self._open(stack, seeded=None)
            final = await self.run_loop(body.model_dump(mode="json", exclude_unset=True), tools, dict(request.cookies))
        return NeMoGymResponse.model_validate(final)

    async def run(self, request: Request, body: BaseRunRequest) -> Response:
        row = body.model_dump(mode="json", exclude_unset=True)
        cookies = dict(request.cookies)
        resources = self.config.resources_server.name
        seeded = await self.seed_rollout(resources, row, cookies)
        async with AsyncExitStack() as stack:
            tools = await self._open(stack, seeded=await response_json(seeded))
            final = await self.run_loop(row["responses_create_params"], tools, cookies)
        return await self.verify_rollout(resources, row, final, cookies)

    @forwards_aggregate_metrics
    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Metric logic lives with the environment: ask the resources server."""
        return await self.resources_server_metrics(self.config.resources_server.name, body)

    async def _open(self, stack: AsyncExitStack, seeded: Any) -> MCPTools:
        tools = MCPTools()
        metadata = seeded.get(NEMO_GYM_MCP_METADATA_KEY) if isinstance(seeded, dict) else None
        if isinstance(metadata, dict):
            base = self.server_client.server_base_url(self.config.resources_server.name)
            url = base + str(metadata.get("url_path", "/mcp"))
            await tools.add(stack, url, dict(metadata.get("headers") or {}), self.config.mcp_timeout_s)
        for spec in self.config.mcp_servers:
            await tools.add(stack, spec.url, spec.headers, self.config.mcp_timeout_s)
        return tools

    async def run_loop(self, params: dict[str, Any], tools: MCPTools, cookies: dict[str, str]) -> dict[str, Any]:
        """The model → tools loop; returns the final Responses object with every new item and the summed usage."""
        original_input = params.get("input", [])
        if isinstance(original_input, str):
            original_input = [{"role": "user", "content": original_input, "type": "message"}]
        if tools.definitions:
            params = params | {"tools": tools.definitions}
        model = self.config.model_server.name
        new_outputs: list[dict[str, Any]] = []
        usage: dict[str, Any] | None = None
        last: dict[str, Any] = {}
        for _ in range(self.config.max_steps):
            answer = await self.server_client.post(
                model, "/v1/responses", json=params | {"input": original_input + new_outputs}, cookies=cookies
            )
            raise_for_status(answer, model, "/v1/responses")
            cookies.update(cookies_from(answer))
            last = await response_json(answer)
            outputs = last.get("output") or []
            new_outputs.extend(outputs)
            usage = add_usage(usage, last.get("usage"))
            calls = [item for item in outputs if item.get("type") == "function_call"]
            if last.get("status") == "incomplete" or not calls:
                break
            for call in calls:
                output = await tools.call(call)
                new_outputs.append({"type": "function_call_output", "call_id": call.get("call_id"), "output": output})
        return last | {"output": new_outputs, "usage": usage}


def _text(result: CallToolResult) -> str:
    return "\n".join(part.text for part in result.content if isinstance(part, TextContent))


def _error(message: str) -> str:
    return orjson.dumps({"error": message}).decode()


if __name__ == "__main__":
    MCPAgent.run_webserver()
