"""example_single_tool_call: one tool, ``get_weather(city)``, and a verifier that rewards answering with its result.

The smallest complete environment: it shows how a tool becomes a route, and how ``verify`` reads the trajectory.
Reward 1.0 when the model called ``get_weather``, got its result, and its final answer states the weather that result
gave (the word ``cold``) in prose: code blocks and inline code do not count, since a small model that pastes code has
not answered. Else 0.0. It does not check which city the tool was asked about (every city is cold here).
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from fastapi import FastAPI
from pydantic import BaseModel

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.openai_utils import NeMoGymResponseFunctionToolCall, NeMoGymResponseOutputMessage

WEATHER = "cold"
"""What ``get_weather`` says of every city."""
DESCRIPTION = re.compile(r"The weather in .+ is (?P<weather>\w+)\.")
"""``weather_description`` as ``get_weather`` writes it; the verifier reads the weather back from it."""
CODE = re.compile(r"```.*?(```|\Z)|`[^`\n]*`", re.DOTALL)
"""Fenced code blocks (an unclosed one runs to the end, as a cut-off answer does) and inline code spans."""


class ExampleSingleToolCallResourcesServerConfig(BaseResourcesServerConfig):
    # Verify reads only the transcript (which tools were called), so a stored rollout can be verified again.
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.STATELESS


class GetWeatherRequest(BaseModel):
    city: str


class GetWeatherResponse(BaseModel):
    city: str
    weather_description: str


class ExampleSingleToolCallResourcesServer(SimpleResourcesServer):
    config: ExampleSingleToolCallResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/get_weather")(self.get_weather)
        return app

    async def get_weather(self, body: GetWeatherRequest) -> GetWeatherResponse:
        return GetWeatherResponse(city=body.city, weather_description=f"The weather in {body.city} is {WEATHER}.")

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        """1.0 when the last answer, in prose, names the weather that a ``get_weather`` result in the transcript gave."""
        answer = final_answer(body.response.output)
        prose = CODE.sub(" ", answer).lower()
        answered = any(re.search(rf"\b{re.escape(w)}\b", prose) for w in reported_weather(body.response.output))
        return BaseVerifyResponse(**body.model_dump(), reward=1.0 if answered else 0.0)


def reported_weather(items: list[Any]) -> set[str]:
    """The weather words of the ``get_weather`` results in a transcript (the outputs answering its calls)."""
    calls = {
        item.call_id
        for item in items
        if isinstance(item, NeMoGymResponseFunctionToolCall) and item.name == "get_weather"
    }
    found: set[str] = set()
    for item in items:
        if getattr(item, "type", None) != "function_call_output" or getattr(item, "call_id", None) not in calls:
            continue
        try:
            description = json.loads(item.output)["weather_description"]
        except (TypeError, ValueError, KeyError):
            continue  # not a result of this server's tool (an error text, say)
        match = DESCRIPTION.fullmatch(str(description))
        if match:
            found.add(match["weather"].lower())
    return found


def final_answer(items: list[Any]) -> str:
    """The text of the last assistant message, or "" when the transcript does not end with one."""
    last = items[-1] if items else None
    if not isinstance(last, NeMoGymResponseOutputMessage):
        return ""
    return "".join(getattr(part, "text", "") or "" for part in last.content)


if __name__ == "__main__":
    ExampleSingleToolCallResourcesServer.run_webserver()
