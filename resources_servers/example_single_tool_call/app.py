"""example_single_tool_call: one tool, ``get_weather(city)``, and a verifier that rewards calling it.

The smallest complete environment: it shows how a tool becomes a route, and how ``verify`` reads the trajectory.
Reward 1.0 when the model called ``get_weather`` and then gave a final answer, else 0.0.
"""

from __future__ import annotations

from typing import ClassVar

from fastapi import FastAPI
from pydantic import BaseModel

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.openai_utils import NeMoGymResponseFunctionToolCall


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
        return GetWeatherResponse(city=body.city, weather_description=f"The weather in {body.city} is cold.")

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        items = body.response.output
        called = any(isinstance(item, NeMoGymResponseFunctionToolCall) and item.name == "get_weather" for item in items)
        answered = any(item.type == "message" for item in items)
        return BaseVerifyResponse(**body.model_dump(), reward=1.0 if called and answered else 0.0)


if __name__ == "__main__":
    ExampleSingleToolCallResourcesServer.run_webserver()
