"""workplace_assistant: an office assistant with 25 stateful tools (email, calendar, analytics, tasks, customers).

Trains multi-step tool use on realistic office requests: look things up, then make exactly the right changes. Each
rollout gets its own world: ``/seed_session`` copies the shipped base world (``data/world/*.csv``, synthetic, made by
``generate_data.py``) plus the row's ``initial_state`` records, and the tools (one route each, see ``tools.py``) read
and change that copy. Worlds live in an LRU store bounded by ``max_sessions``; ``/verify`` drops the session's world.

Reward, by state equivalence: the model's function calls (every ``function_call`` in the trajectory, in order) are
replayed on a fresh world, the row's ``ground_truth`` calls on another, and the reward is 1.0 iff the two end states
are equal (emails, events, tasks, customers, plots; ids ignored, free text compared without case and extra spaces).
Read-only calls therefore cost nothing, any missing, wrong or extra change fails, and calls that errored (unknown
tool, bad arguments, unknown id) change nothing in either replay. The live session state is not used for the reward,
so verification is repeatable on a stored rollout.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field, PrivateAttr, ValidationError

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.server_utils import SESSION_ID_KEY
from nemo_gym.session_store import DEFAULT_MAX_SESSIONS, SessionStore
from nemo_gym.verifiers.tool_calls import ParsedCall, function_calls, parse_call
from resources_servers.workplace_assistant.tools import TOOLS, Tool, ToolError, call_tool
from resources_servers.workplace_assistant.world import InitialState, World, base_world, differing_tables


class WorkplaceAssistantResourcesServerConfig(BaseResourcesServerConfig):
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.STATELESS

    max_sessions: int = Field(default=DEFAULT_MAX_SESSIONS, ge=1)
    """Most worlds held at once; the least recently used one is evicted beyond this."""


class WorkplaceSeedSessionRequest(BaseSeedSessionRequest):
    initial_state: InitialState = Field(default_factory=InitialState)


class GroundTruthCall(BaseModel):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    """An object, or its JSON text (as models emit it)."""


class WorkplaceVerifyRequest(BaseVerifyRequest):
    ground_truth: list[GroundTruthCall]
    initial_state: InitialState = Field(default_factory=InitialState)
    category: str | None = None
    """Which part of the office the task is about (email, calendar, ...), for per-category metrics."""


class WorkplaceVerifyResponse(WorkplaceVerifyRequest):
    reward: float
    differing_tables: list[str]
    """Tables whose end states differ from the ground truth's (empty when reward is 1)."""
    num_predicted_calls: int
    num_failed_calls: int
    """Predicted calls that changed nothing because they failed (unknown tool, bad arguments, unknown id, ...)."""
    num_ground_truth_failures: int
    """Should be 0: a ground-truth call that fails on a fresh world is a data error."""


def replay(world: World, calls: list[ParsedCall]) -> int:
    """Run ``calls`` in order on ``world`` (changing it); returns how many failed and so changed nothing."""
    failures = 0
    for call in calls:
        if call.name not in TOOLS or call.arguments is None:
            failures += 1
            continue
        try:
            call_tool(world, call.name, call.arguments)
        except (ToolError, ValidationError):
            failures += 1
    return failures


class WorkplaceAssistantResourcesServer(SimpleResourcesServer):
    config: WorkplaceAssistantResourcesServerConfig
    _worlds: SessionStore[World] = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        self._worlds = SessionStore(self.config.max_sessions)

    @property
    def worlds(self) -> SessionStore[World]:
        """Session id -> that rollout's world."""
        return self._worlds

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        for spec in TOOLS.values():
            app.post(f"/{spec.name}", name=spec.name, description=spec.description)(self._route(spec))
        return app

    def _route(self, spec: Tool) -> Callable[..., Any]:
        """A handler whose body is the tool's own argument model, so FastAPI validates it (422 on bad arguments)."""

        async def handler(request: Request, body: BaseModel) -> Any:
            world = self.worlds.get(request.session[SESSION_ID_KEY])
            if world is None:
                raise HTTPException(status_code=400, detail="No world for this session: call /seed_session first.")
            try:
                return spec.run(world, body)
            except ToolError as e:
                return {"error": str(e)}

        handler.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [
                inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request),
                inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=spec.arguments),
            ]
        )
        return handler

    async def seed_session(self, request: Request, body: WorkplaceSeedSessionRequest) -> BaseSeedSessionResponse:
        # Seeding starts a rollout, so it replaces whatever an earlier use of this cookie left behind.
        try:
            world = base_world().with_additions(body.initial_state)
        except ValueError as e:
            raise HTTPException(status_code=422, detail=str(e)) from None
        self.worlds.set(request.session[SESSION_ID_KEY], world)
        return BaseSeedSessionResponse()

    async def verify(self, request: Request, body: WorkplaceVerifyRequest) -> WorkplaceVerifyResponse:
        self.worlds.pop(request.session[SESSION_ID_KEY])
        try:
            start = base_world().with_additions(body.initial_state)
        except ValueError as e:
            raise HTTPException(status_code=422, detail=str(e)) from None
        predicted_calls = function_calls(body.response)
        predicted, expected = start.copy(), start.copy()
        failed = replay(predicted, predicted_calls)
        ground_truth_failures = replay(expected, [parse_call(call.model_dump()) for call in body.ground_truth])
        differing = differing_tables(predicted, expected)
        return WorkplaceVerifyResponse(
            **body.model_dump(),
            reward=0.0 if differing else 1.0,
            differing_tables=differing,
            num_predicted_calls=len(predicted_calls),
            num_failed_calls=failed,
            num_ground_truth_failures=ground_truth_failures,
        )


if __name__ == "__main__":
    WorkplaceAssistantResourcesServer.run_webserver()
