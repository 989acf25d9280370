"""langgraph_agent: a tool-calling agent written with LangGraph, driving our servers like any OpenAI-speaking app.

The agent is a two-node LangGraph graph, ``model`` -> ``tools`` -> ``model`` ... -> END, as one writes it for any
OpenAI-compatible endpoint. ``model`` calls the policy through LangChain's own ``ChatOpenAI`` client pointed at the
model server's OpenAI-compatible ``/v1`` (Chat Completions; the run token as its API key), so nothing in the graph
knows it runs inside Gym. ``tools`` runs each tool call on the resources server with the rollout's session cookies.

Gym's part is only at the edges: ``/run`` seeds the resources server's session, converts the row's Responses input to
LangChain messages, runs the graph, converts the new messages back to Responses output items, and asks ``/verify``
for the reward. Why LangGraph and not the OpenAI Agents SDK: LangGraph sends nothing anywhere unless told to
(the Agents SDK exports traces to OpenAI by default), and its graph makes the control flow explicit.
"""

from __future__ import annotations

import operator
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

import orjson
from fastapi import Request, Response
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, convert_to_messages, convert_to_openai_messages
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pydantic import Field

from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.base_responses_api_agent import (
    BaseResponsesAPIAgentConfig,
    SimpleResponsesAPIAgent,
    add_usage,
    forwards_aggregate_metrics,
)
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest, ModelServerRef, ResourcesServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.responses_converter import ResponsesConverter
from nemo_gym.transport import access
from nemo_gym.transport.http_client import TransportError, cookies_from

RESERVED_ROUTES = frozenset({"seed_session", "verify", "aggregate_metrics", "reverify_mode"})


class LangGraphAgentConfig(BaseResponsesAPIAgentConfig):
    resources_server: ResourcesServerRef
    model_server: ModelServerRef
    max_steps: int = Field(default=10, ge=1)
    """Most model calls in one rollout."""
    model_name: str = "policy"
    """The ``model`` sent when the request names none (model servers answer with their own model)."""


class GraphState(TypedDict):
    messages: Annotated[list[BaseMessage], add_messages]
    steps: Annotated[int, operator.add]


@dataclass
class Rollout:
    """What one graph run needs besides its messages; handed to the nodes through LangGraph's ``configurable``."""

    model: Runnable[Any, Any]
    cookies: dict[str, str]
    usage: dict[str, Any] | None = None
    last_model_response: dict[str, Any] = field(default_factory=dict)


class LangGraphAgent(SimpleResponsesAPIAgent):
    config: LangGraphAgentConfig

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        self._converter = ResponsesConverter(uses_reasoning_parser=False)
        graph = StateGraph(GraphState)
        graph.add_node("model", self._call_model)
        graph.add_node("tools", self._call_tools)
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", self._next, {"tools": "tools", END: END})
        graph.add_edge("tools", "model")
        self._graph = graph.compile()

    # -- the graph ------------------------------------------------------------------------------------------------

    async def _call_model(self, state: GraphState, config: RunnableConfig) -> dict[str, Any]:
        rollout: Rollout = config["configurable"]["rollout"]
        reply = await rollout.model.ainvoke(state["messages"])
        rollout.usage = add_usage(rollout.usage, _responses_usage(reply.usage_metadata))
        rollout.last_model_response = dict(reply.response_metadata)
        return {"messages": [reply], "steps": 1}

    def _next(self, state: GraphState) -> str:
        last = state["messages"][-1]
        wants_tools = isinstance(last, AIMessage) and bool(last.tool_calls or last.invalid_tool_calls)
        return "tools" if wants_tools and state["steps"] < self.config.max_steps else END

    async def _call_tools(self, state: GraphState, config: RunnableConfig) -> dict[str, Any]:
        rollout: Rollout = config["configurable"]["rollout"]
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)
        results = [
            ToolMessage(await self.call_tool(call["name"], call["args"], rollout.cookies), tool_call_id=call["id"])
            for call in last.tool_calls
        ]
        results += [
            ToolMessage(
                _error(f"Invalid tool call arguments for {call['name']!r}: {call['error']}"), tool_call_id=call["id"]
            )
            for call in last.invalid_tool_calls
        ]
        return {"messages": results}

    async def call_tool(self, name: str, arguments: dict[str, Any], cookies: dict[str, str]) -> str:
        """Run one tool call on the resources server; every failure becomes text the model can read."""
        if name in RESERVED_ROUTES or not name.replace("_", "").replace("-", "").replace(".", "").isalnum():
            return _error(f"Unknown tool {name!r}.")
        resources = self.config.resources_server.name
        try:
            answer = await self.server_client.post(resources, f"/{name}", json=arguments, cookies=cookies)
        except TransportError as e:
            return _error(f"Tool {name!r} could not be reached: {e}")
        cookies.update(cookies_from(answer))
        text = await answer.text()
        if answer.status == 404:
            return _error(f"Unknown tool {name!r}.")
        if answer.status >= 400:
            return _error(f"Tool {name!r} failed (HTTP {answer.status}): {text[:2000]}")
        return text

    # -- Gym's edges ----------------------------------------------------------------------------------------------

    async def run_graph(
        self, params: dict[str, Any], cookies: dict[str, str], rollout_id: str | None = None
    ) -> dict[str, Any]:
        """One graph run for a set of Responses create params; returns the final Responses object as a dict, whose
        ``output`` holds every item after the input. ``cookies`` is updated in place."""
        chat = self._converter.responses_to_chat_completion_create_params(params).model_dump(
            mode="json", exclude_unset=True
        )
        base_url = self.resolve_model_base_url(self.config.model_server.name, rollout_id)
        llm = ChatOpenAI(
            model=chat.get("model") or self.config.model_name,
            base_url=base_url,
            api_key=access.registered_token(base_url) or "none",  # type: ignore[arg-type]
            temperature=chat.get("temperature"),
            top_p=chat.get("top_p"),
            max_tokens=chat.get("max_tokens"),  # type: ignore[call-arg]
        )
        model = llm.bind_tools(chat["tools"]) if chat.get("tools") else llm
        rollout = Rollout(model=model, cookies=cookies)
        messages = convert_to_messages(chat["messages"])
        run_config = RunnableConfig(configurable={"rollout": rollout}, recursion_limit=2 * self.config.max_steps + 2)
        final = await self._graph.ainvoke(GraphState(messages=messages, steps=0), config=run_config)
        new_messages = convert_to_openai_messages(final["messages"][len(messages) :])
        output = [
            item.model_dump(mode="json", exclude_none=True) if hasattr(item, "model_dump") else item
            for item in self._converter.chat_completions_messages_to_responses_items(new_messages)
        ]
        return {
            "id": rollout.last_model_response.get("id") or f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": int(time.time()),
            "model": rollout.last_model_response.get("model_name") or llm.model_name,
            "status": "completed",
            "output": output,
            "tools": params.get("tools") or [],
            "tool_choice": params.get("tool_choice") or "auto",
            "parallel_tool_calls": params.get("parallel_tool_calls", True),
            "usage": rollout.usage,
        }

    async def responses(
        self, request: Request, response: Response, body: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse:
        cookies = dict(request.cookies)
        rollout_id = request.path_params.get("rollout_id")
        final = await self.run_graph(body.model_dump(mode="json", exclude_unset=True), cookies, rollout_id)
        self.pass_on_new_cookies(request, response, cookies)
        return NeMoGymResponse.model_validate(final)

    async def run(self, request: Request, body: BaseRunRequest) -> Response:
        row = body.model_dump(mode="json", exclude_unset=True)
        cookies = dict(request.cookies)
        resources = self.config.resources_server.name
        await self.seed_rollout(resources, row, cookies)

        final = await self.run_graph(row["responses_create_params"], cookies, self.rollout_id_from_run(body))
        return await self.verify_rollout(resources, row, final, cookies)

    @forwards_aggregate_metrics
    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Metric logic lives with the environment: ask the resources server."""
        return await self.resources_server_metrics(self.config.resources_server.name, body)


def _responses_usage(usage: Any) -> dict[str, Any] | None:
    """LangChain's ``usage_metadata`` in Responses terms."""
    if not usage:
        return None
    return {
        "input_tokens": usage.get("input_tokens", 0),
        "output_tokens": usage.get("output_tokens", 0),
        "total_tokens": usage.get("total_tokens", 0),
        "input_tokens_details": {"cached_tokens": (usage.get("input_token_details") or {}).get("cache_read", 0)},
        "output_tokens_details": {"reasoning_tokens": (usage.get("output_token_details") or {}).get("reasoning", 0)},
    }


def _error(message: str) -> str:
    return orjson.dumps({"error": message}).decode()


if __name__ == "__main__":
    LangGraphAgent.run_webserver()
