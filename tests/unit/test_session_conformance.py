"""``check_resources_session_contract`` passes a real resources server and names the step a broken one gets wrong."""

from __future__ import annotations

from unittest.mock import MagicMock

import pytest
from fastapi import FastAPI, HTTPException

from nemo_gym.base_resources_server import (
    ResourcesCloseSessionRequest,
    ResourcesCloseSessionResponse,
    ResourcesSeedSessionRequest,
    ResourcesSeedSessionResponse,
)
from nemo_gym.episode_types import EpisodeId, TaskId
from nemo_gym.server_utils import ServerClient
from nemo_gym.testing.session_conformance import check_resources_session_contract
from resources_servers.example_single_tool_call.app import (
    ExampleSingleToolCallResourcesServer,
    ExampleSingleToolCallResourcesServerConfig,
)

SEED = ResourcesSeedSessionRequest(
    resources_session_id="contract-session",
    episode_id=EpisodeId(rollout_id="rollout", attempt=0),
    task_id=TaskId(taskset="example", task_id="0"),
    task_data={},
)


def _weather(
    server_class: type[ExampleSingleToolCallResourcesServer] = ExampleSingleToolCallResourcesServer,
) -> FastAPI:
    config = ExampleSingleToolCallResourcesServerConfig(host="0.0.0.0", port=8080, entrypoint="", name="weather")
    return server_class(config=config, server_client=MagicMock(spec=ServerClient)).setup_webserver()


def test_a_real_resources_server_keeps_the_contract() -> None:
    check_resources_session_contract(_weather(), SEED, keeps_state=True)


def test_it_catches_a_server_whose_close_fails_for_an_unknown_session() -> None:
    class ForgetfulClose(ExampleSingleToolCallResourcesServer):
        async def close_resources_session(self, body: ResourcesCloseSessionRequest) -> ResourcesCloseSessionResponse:
            if body.resources_session_id.endswith("never-seeded"):
                raise KeyError(body.resources_session_id)  # a server that only knows sessions it seeded
            return ResourcesCloseSessionResponse(resources_session_id=body.resources_session_id)

    with pytest.raises(AssertionError, match="close of a session that was never seeded: /close_session answered 500"):
        check_resources_session_contract(_weather(ForgetfulClose), SEED, keeps_state=True)


def _dict_server(*, refuse_repeat: bool = False, forget_closed: bool = False, close_status: int = 200) -> FastAPI:
    """A hand-written server that breaks exactly one rule."""
    app = FastAPI()
    open_ids: set[str] = set()
    closed: set[str] = set()

    @app.post("/seed_session")
    async def seed(body: ResourcesSeedSessionRequest) -> ResourcesSeedSessionResponse:
        if body.resources_session_id in closed and not forget_closed:
            raise HTTPException(409, "closed")
        if body.resources_session_id in open_ids and refuse_repeat:
            raise HTTPException(409, "already seeded")
        open_ids.add(body.resources_session_id)
        return ResourcesSeedSessionResponse(resources_session_id=body.resources_session_id)

    @app.post("/close_session")
    async def close(body: ResourcesCloseSessionRequest) -> ResourcesCloseSessionResponse:
        if body.resources_session_id in closed and close_status != 200:
            raise HTTPException(close_status, "already closed")
        open_ids.discard(body.resources_session_id)
        closed.add(body.resources_session_id)
        return ResourcesCloseSessionResponse(resources_session_id=body.resources_session_id)

    return app


def test_the_hand_written_server_passes_when_it_breaks_nothing() -> None:
    check_resources_session_contract(_dict_server(), SEED, keeps_state=True)


@pytest.mark.parametrize(
    ("broken", "step"),
    [
        ({"refuse_repeat": True}, "repeated seed of the same id and episode"),
        ({"close_status": 404}, "repeated close"),
        ({"forget_closed": True}, "seed after its close"),
    ],
)
def test_it_names_the_rule_a_server_breaks(broken: dict, step: str) -> None:
    with pytest.raises(AssertionError, match=step):
        check_resources_session_contract(_dict_server(**broken), SEED, keeps_state=True)


def test_a_stateless_server_is_not_asked_to_refuse_late_seeds() -> None:
    check_resources_session_contract(_dict_server(forget_closed=True), SEED, keeps_state=False)


def test_the_testing_package_keeps_its_helpers() -> None:
    """``nemo_gym.testing`` became a package; its users import the same names from it."""
    import nemo_gym.testing as testing

    for name in ("FakeUpstream", "serve_in_thread", "asgi_clients", "scripted_rollout", "eval_run"):
        assert hasattr(testing, name), name
