"""Does a resources server keep the session contract environment servers rely on? (NeMo Gym 0.7's
``testing.session_conformance``.)

An environment server seeds a resources session under an id it chose and may send the same seed twice (a retry), or
close a session twice, or close one whose seed never arrived, and a seed may arrive after its close. The contract:
a repeated seed for the same id and episode answers the same session; every close succeeds; a seed after a close is
refused, so no state outlives its episode. :func:`check_resources_session_contract` plays that sequence against the
server's real app (routes and middleware, in process), so a route shadowed by another registration fails it too.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from nemo_gym.resources_sessions import (
    ResourcesCloseSessionRequest,
    ResourcesCloseSessionResponse,
    ResourcesSeedSessionRequest,
    ResourcesSeedSessionResponse,
)

__all__ = ["check_resources_session_contract"]


def check_resources_session_contract(app: FastAPI, seed: ResourcesSeedSessionRequest, *, keeps_state: bool) -> None:
    """Play seed, repeated seed, close, repeated close, close of a never-seeded id and late seeds against ``app``;
    an ``AssertionError`` names the first step the server got wrong.

    ``seed`` must name a session id the app has not seen. ``keeps_state=False`` is for a server with nothing to
    recreate: its late seeds are not checked.
    """
    from fastapi.testclient import TestClient

    client = TestClient(app, raise_server_exceptions=False)

    def post(step: str, path: str, body: Any) -> Any:
        answer = client.post(path, json=body.model_dump(mode="json"))
        assert answer.status_code == 200, f"{step}: {path} answered {answer.status_code}: {answer.text[:500]}"
        return answer.json()

    def close_request(session_id: str) -> ResourcesCloseSessionRequest:
        return ResourcesCloseSessionRequest(resources_session_id=session_id, episode_id=seed.episode_id)

    wanted = seed.resources_session_id
    for step in ("first seed", "repeated seed of the same id and episode"):
        seeded = ResourcesSeedSessionResponse.model_validate(post(step, "/seed_session", seed))
        assert seeded.resources_session_id == wanted, f"{step}: answered session {seeded.resources_session_id!r}"

    for step in ("close", "repeated close"):
        closed = ResourcesCloseSessionResponse.model_validate(post(step, "/close_session", close_request(wanted)))
        assert closed.resources_session_id == wanted, f"{step}: answered session {closed.resources_session_id!r}"

    unseen = f"{wanted}-never-seeded"
    post("close of a session that was never seeded", "/close_session", close_request(unseen))

    if not keeps_state:
        return
    late_seeds = [
        (seed, "seed after its close"),
        (seed.model_copy(update={"resources_session_id": unseen}), "seed after a close that came first"),
    ]
    for late, step in late_seeds:
        answer = client.post("/seed_session", json=late.model_dump(mode="json"))
        assert answer.status_code >= 400, (
            f"{step}: {late.resources_session_id!r} was seeded again ({answer.status_code}); "
            "a closed session must stay closed"
        )
