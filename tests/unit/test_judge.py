"""nemo_gym.judge: a judge that cannot be asked is a JudgeError and a ``judge_failed`` row, never a reward of 0."""

from __future__ import annotations

import asyncio
import json
import pickle
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any
from unittest.mock import AsyncMock, MagicMock

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from omegaconf import OmegaConf
from pydantic import BaseModel

from nemo_gym.config.server_models import BaseServerConfig
from nemo_gym.errors import NeMoGymError, TransportError
from nemo_gym.judge import JudgeError, call_judge, judge_failsafe, reraise_judge_errors
from nemo_gym.server_utils import ServerClient
from nemo_gym.testing import FakeUpstream
from nemo_gym.transport import http_client
from nemo_gym.transport.http_client import ServerRequestError


class Verdict(BaseModel):
    verdict: str


class VerifyRequest(BaseModel):
    response: dict[str, Any]
    uuid: str = ""


@pytest.fixture
def judge() -> Iterator[FakeUpstream]:
    replies: dict[str, tuple[int, Any]] = {"/v1/responses": (200, {"verdict": "same"})}
    upstream = FakeUpstream(lambda path, body: replies.get(path, (404, {"error": path})))
    upstream.replies = replies  # type: ignore[attr-defined]
    upstream.start()
    yield upstream
    upstream.stop()


@pytest.fixture
async def client(judge: FakeUpstream) -> AsyncIterator[ServerClient]:
    config = OmegaConf.create(
        {"judge": {"responses_api_models": {"openai_model": {"host": "127.0.0.1", "port": judge.port}}}}
    )
    yield ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=config)
    await http_client.close_session()


async def ask(client: Any) -> Verdict:
    return await call_judge(
        client, server_name="judge", url_path="/v1/responses", json={"input": "q"}, response_model=Verdict
    )


async def test_call_judge_posts_to_the_named_server_and_parses_the_reply(
    client: ServerClient, judge: FakeUpstream
) -> None:
    assert await ask(client) == Verdict(verdict="same")
    assert judge.bodies("/v1/responses") == [{"input": "q"}]


async def test_an_http_error_is_reported_as_one_not_as_a_validation_error(
    client: ServerClient, judge: FakeUpstream
) -> None:
    judge.replies["/v1/responses"] = (401, {"error": "bad api key"})  # type: ignore[attr-defined]
    with pytest.raises(JudgeError) as info:
        await ask(client)
    error = info.value
    assert str(error).startswith("StatusError: POST /v1/responses to server 'judge'")  # a ServerRequestError
    assert "HTTP 401" in str(error) and "bad api key" in str(error)
    assert (error.status, error.url_path) == (401, "/v1/responses")
    assert isinstance(error.__cause__, ServerRequestError)


async def test_a_reply_of_the_wrong_shape_is_a_judge_failure(client: ServerClient, judge: FakeUpstream) -> None:
    judge.replies["/v1/responses"] = (200, {"id": "resp_1"})  # type: ignore[attr-defined]
    with pytest.raises(JudgeError, match=r"(?s)^ValidationError: .*verdict.*Field required"):
        await ask(client)


async def test_an_unreachable_judge_is_a_judge_failure() -> None:
    unreachable = MagicMock(post=AsyncMock(side_effect=ConnectionError("connection refused")))
    with pytest.raises(JudgeError, match="^ConnectionError: connection refused$"):
        await ask(unreachable)


def test_judge_error_sits_on_the_transport_branch_and_survives_pickling() -> None:
    assert issubclass(JudgeError, TransportError) and issubclass(JudgeError, NeMoGymError)
    copy = pickle.loads(pickle.dumps(JudgeError("HTTP 500", server="judge", url_path="/v1/responses", status=500)))
    assert (str(copy), copy.server, copy.url_path, copy.status) == ("HTTP 500", "judge", "/v1/responses", 500)


async def test_reraise_judge_errors_relabels_everything_but_cancellation() -> None:
    async def value() -> int:
        return 7

    async def fails() -> None:
        raise TimeoutError("no answer in 30 s")

    original = JudgeError("already a judge error")

    async def judge_fails() -> None:
        raise original

    async def cancelled() -> None:
        raise asyncio.CancelledError

    assert await reraise_judge_errors(value()) == 7
    with pytest.raises(JudgeError, match="^TimeoutError: no answer in 30 s$"):
        await reraise_judge_errors(fails())
    with pytest.raises(JudgeError) as info:
        await reraise_judge_errors(judge_fails())
    assert info.value is original
    with pytest.raises(asyncio.CancelledError):
        await reraise_judge_errors(cancelled())


@pytest.mark.parametrize("by_keyword", [True, False])
async def test_failsafe_turns_a_judge_error_into_a_failure_row(by_keyword: bool) -> None:
    async def verify(body: VerifyRequest) -> dict[str, Any]:
        raise JudgeError("ServerRequestError: HTTP 503")

    request = VerifyRequest(response={"output_text": "42"}, uuid="row-3")
    wrapped = judge_failsafe(verify)
    reply = await (wrapped(body=request) if by_keyword else wrapped(request))
    assert isinstance(reply, JSONResponse) and reply.status_code == 200
    row = json.loads(bytes(reply.body))
    assert row == {
        "response": {"output_text": "42"},  # kept, so the judge alone can be asked again later
        "uuid": "row-3",
        "reward": 0.0,
        "_ng_failure_class": "judge_failed",
        "_ng_failure_judge_error": "ServerRequestError: HTTP 503",
        "_ng_failure_message": "ServerRequestError: HTTP 503",
        # NeMo Gym 0.7's typed failure on the verify response: the reward is masked out of training
        "mask_sample": True,
        "failure_kind": "judge_failed",
        "failure_reason": "ServerRequestError: HTTP 503",
        "instance_config": {"mask_sample": True},  # where a trainer reading the row's instance config looks
    }


async def test_failsafe_passes_results_and_other_errors_through() -> None:
    async def verify(body: VerifyRequest) -> dict[str, float]:
        if body.uuid == "bug":
            raise KeyError("expected_answer")
        return {"reward": 1.0}

    wrapped = judge_failsafe(verify)
    assert await wrapped(VerifyRequest(response={})) == {"reward": 1.0}
    with pytest.raises(KeyError):  # a verifier bug stays a bug
        await wrapped(VerifyRequest(response={}, uuid="bug"))

    async def no_body() -> None:
        raise JudgeError("x")

    with pytest.raises(RuntimeError, match="no request body"):
        await judge_failsafe(no_body)()


def test_failsafe_keeps_the_signature_fastapi_reads() -> None:
    async def verify(body: VerifyRequest) -> dict[str, Any]:
        if body.uuid == "judge down":
            raise JudgeError("ConnectionError: refused")
        return {"reward": 1.0, "uuid": body.uuid}

    app = FastAPI()
    app.post("/verify")(judge_failsafe(verify))
    with TestClient(app) as test_client:
        assert test_client.post("/verify", json={"response": {}, "uuid": "a"}).json() == {"reward": 1.0, "uuid": "a"}
        reply = test_client.post("/verify", json={"response": {}, "uuid": "judge down"})
        assert test_client.post("/verify", json={"uuid": "no response"}).status_code == 422
    assert reply.status_code == 200 and reply.json()["_ng_failure_class"] == "judge_failed"


def test_importing_the_judge_module_loads_no_http_client() -> None:
    probe = "import sys, nemo_gym.judge; print('aiohttp' in sys.modules, 'openai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]
