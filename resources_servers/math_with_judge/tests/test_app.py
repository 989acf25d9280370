"""math_with_judge: the reward rule (math-verify), the deadline, the judge and its failures, metrics and routes.

Each test builds the server directly (its worker pool starts on first use in the test's event loop) and closes it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from unittest.mock import AsyncMock, MagicMock

import aiohttp
import psutil
import pytest
from fastapi.testclient import TestClient

from nemo_gym.config_types import AggregateMetricsRequest
from nemo_gym.server_utils import ServerClient
from nemo_gym.testing import assistant_response
from nemo_gym.transport.http_client import ServerRequestError
from resources_servers.math_with_judge.app import (
    MathWithJudgeResourcesServer,
    MathWithJudgeResourcesServerConfig,
    MathWithJudgeVerifyRequest,
)
from resources_servers.math_with_judge.judge import EQUAL_LABEL, NOT_EQUAL_LABEL, verdict_is_equal
from resources_servers.math_with_judge.math_check import check_answer, gold_as_boxed

pytestmark = pytest.mark.timeout(180)
EXAMPLE = Path(__file__).parents[1] / "data" / "example.jsonl"


def make_server(**config: Any) -> MathWithJudgeResourcesServer:
    if config.get("should_use_judge"):
        config.setdefault("judge_model_server", {"type": "responses_api_models", "name": "judge"})
    settings = MathWithJudgeResourcesServerConfig(
        host="127.0.0.1", port=0, entrypoint="", name="math", verifier_processes=1, **config
    )
    return MathWithJudgeResourcesServer(config=settings, server_client=MagicMock(spec=ServerClient))


@pytest.fixture
async def server():
    server = make_server()
    yield server
    await server.close()


def request(*texts: str, expected: str | int = "32", **row: Any) -> MathWithJudgeVerifyRequest:
    body = {"responses_create_params": {"input": "q"}, "expected_answer": expected, "question": "What is 2^5?"} | row
    return MathWithJudgeVerifyRequest.model_validate(body | {"response": assistant_response(*texts)})


# -- reward rule ------------------------------------------------------------------------------------------------------


async def test_correct_boxed_answer(server):
    result = await server.verify(request("2^5 = 32, so the answer is \\boxed{32}."))
    assert (result.reward, result.library_reward, result.extracted_answer) == (1.0, 1.0, "32")
    assert result.timed_out is False and result.judge_evaluations is None


async def test_wrong_answer(server):
    result = await server.verify(request("I think \\boxed{31}."))
    assert (result.reward, result.extracted_answer) == (0.0, "31")


@pytest.mark.parametrize("text", ["I don't know.", "", "   ", "\\boxed{}", "The answer is \\boxed{"])
async def test_malformed_or_missing_answer_scores_zero(server, text):
    result = await server.verify(request(text))
    assert result.reward == 0.0 and result.extracted_answer is None


async def test_no_assistant_message_at_all(server):
    result = await server.verify(request())
    assert result.reward == 0.0 and result.extracted_answer is None


@pytest.mark.parametrize(
    ("expected", "text"),
    [("\\frac{1}{2}", "\\boxed{0.5}"), ("0.5", "\\boxed{\\frac{1}{2}}"), ("1/2", "\\boxed{\\dfrac12}"),
     ("\\(\\frac{1}{3}\\)", "$\\boxed{\\frac{2}{6}}$"), ("3\\sqrt{2}", "\\boxed{\\sqrt{18}}"), ("x^2+2x+1", "\\boxed{(x+1)^2}"),
     ("108", "The area is \\boxed{108\\text{ cm}^2}"), ("$5$", "x = \\boxed{5}"), (32, "\\boxed{32}")],
)  # fmt: skip
async def test_equivalent_forms_match(server, expected, text):
    result = await server.verify(request(text, expected=expected))
    assert result.reward == 1.0, result.extracted_answer


@pytest.mark.parametrize(("expected", "text"), [("\\frac{1}{2}", "\\boxed{0.51}"), ("x^2+1", "\\boxed{x^2-1}")])
async def test_close_but_different_values_do_not_match(server, expected, text):
    assert (await server.verify(request(text, expected=expected))).reward == 0.0


async def test_several_boxes_are_one_set_answer(server):
    """math-verify reads all boxes together: right for "find all solutions", and hedging between values fails."""
    assert (await server.verify(request("maybe \\boxed{30}... no: \\boxed{32}"))).reward == 0.0
    assert (await server.verify(request("x = \\boxed{2} or x = \\boxed{-3}", expected="-3, 2"))).reward == 1.0


def test_gold_wrappers_are_stripped_before_boxing():
    assert gold_as_boxed("\\(\\frac{1}{6}\\)") == "\\boxed{\\frac{1}{6}}"
    assert gold_as_boxed(" $42$ ") == "\\boxed{42}"
    assert gold_as_boxed("\\[x+1\\]") == "\\boxed{x+1}"
    assert gold_as_boxed("$") == "\\boxed{$}"


def test_check_answer_in_process():
    assert check_answer("0.25", "\\boxed{\\frac14}") == {"score": 1.0, "extracted_answer": "\\frac{1}{4}"}
    assert check_answer("7", "no numbers here") == {"score": 0.0, "extracted_answer": None}


def gone(pids: list[int], within_s: float = 60.0) -> bool:
    """True once none of ``pids`` runs any more (a killed child is a zombie until its parent reaps it). ``within_s``
    is a hang guard: the loop returns as soon as they are gone, however busy the machine."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.05)
    return False


# -- deadline ---------------------------------------------------------------------------------------------------------


async def test_a_pathological_answer_times_out_and_its_worker_is_replaced():
    # Short enough to keep the test quick, yet hundreds of times what the ordinary calls here need on a busy machine.
    server = make_server(verify_timeout_s=3.0)
    try:
        await server.verify(request("\\boxed{32}"))  # start the pool
        pool = server._verifiers.get()
        before = pool.pids
        result = await server.verify(request("\\boxed{9^{9^{9^{9^{9}}}}}", expected="10"))
        assert result.reward == 0.0 and result.timed_out is True and "timed out" in result.verifier_error
        assert gone(before)  # killed, not left running in the background
        follow_up = await server.verify(request("\\boxed{32}"))  # the replacement serves the next call
        assert follow_up.reward == 1.0 and pool.replaced == 1
        assert set(pool.pids).isdisjoint(before)
    finally:
        pids = server._verifiers.get().pids
        await server.close()
    assert gone(pids)


# -- judge ------------------------------------------------------------------------------------------------------------


class FakeReply:
    """Enough of an aiohttp response for ``raise_for_status`` and ``response_json``."""

    def __init__(self, body: Any, status: int = 200) -> None:
        self.status = status
        self._body = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.url = aiohttp.client.URL("http://127.0.0.1:1/v1/responses")
        self.method = "POST"
        self.reason = "OK" if status == 200 else "Error"

    async def read(self) -> bytes:
        return self._body


def judge_says(*verdicts: str) -> AsyncMock:
    replies = [FakeReply(assistant_response(f"Reasoning... {v}").model_dump(mode="json")) for v in verdicts]
    return AsyncMock(side_effect=replies)


def test_verdict_parsing():
    assert verdict_is_equal(f"They match. {EQUAL_LABEL}")
    assert not verdict_is_equal(f"{NOT_EQUAL_LABEL}")
    assert not verdict_is_equal(f"{NOT_EQUAL_LABEL} ... {EQUAL_LABEL}")
    assert verdict_is_equal(f"{EQUAL_LABEL} although one might say {NOT_EQUAL_LABEL}")
    assert not verdict_is_equal("no label at all")


async def test_judge_is_not_asked_when_off_or_when_math_verify_agrees():
    off = make_server()
    judged = make_server(should_use_judge=True)
    judged.server_client.post = judge_says(EQUAL_LABEL)
    try:
        assert (await off.verify(request("thirty-two"))).reward == 0.0
        off.server_client.post.assert_not_called()
        assert (await judged.verify(request("\\boxed{32}"))).reward == 1.0
        judged.server_client.post.assert_not_called()
    finally:
        await off.close()
        await judged.close()


async def test_judge_rescues_an_answer_math_verify_cannot_read():
    server = make_server(should_use_judge=True, judge_responses_create_params={"input": [], "temperature": 0.0})
    server.server_client.post = judge_says(EQUAL_LABEL, EQUAL_LABEL)
    try:
        result = await server.verify(request("The answer is thirty-two."))
    finally:
        await server.close()
    assert (result.reward, result.library_reward, result.judge_reward) == (1.0, 0.0, 1.0)
    assert [e["order"] for e in result.judge_evaluations] == ["gold_first", "answer_first"]
    first, second = (call.kwargs["json"] for call in server.server_client.post.call_args_list)
    assert first["temperature"] == 0.0 and "thirty-two" in first["input"][0]["content"]
    assert server.server_client.post.call_args_list[0].args == ("judge", "/v1/responses")
    gold_at, answer_at = (first["input"][0]["content"].find(s) for s in ("Answer A:\n32", "thirty-two"))
    assert 0 <= gold_at < answer_at  # gold first, then the answer-first call swaps them
    assert second["input"][0]["content"].find("Answer A:\n32") == -1


async def test_judge_needs_both_orders_to_agree():
    server = make_server(should_use_judge=True)
    server.server_client.post = judge_says(EQUAL_LABEL, NOT_EQUAL_LABEL)
    try:
        result = await server.verify(request("\\boxed{31}"))
    finally:
        await server.close()
    assert (result.reward, result.judge_reward, len(result.judge_evaluations)) == (0.0, 0.0, 2)


async def test_a_first_not_equal_verdict_settles_it_and_one_order_can_be_configured():
    stops = make_server(should_use_judge=True)
    stops.server_client.post = judge_says(NOT_EQUAL_LABEL)
    single = make_server(should_use_judge=True, judge_check_both_orders=False)
    single.server_client.post = judge_says(EQUAL_LABEL)
    try:
        assert (await stops.verify(request("\\boxed{31}"))).reward == 0.0
        assert stops.server_client.post.await_count == 1
        assert (await single.verify(request("\\boxed{31}"))).reward == 1.0
        assert single.server_client.post.await_count == 1
    finally:
        await stops.close()
        await single.close()


async def test_an_unreadable_judge_answer_is_a_verdict_not_a_failure():
    server = make_server(should_use_judge=True)
    server.server_client.post = judge_says("I cannot decide.")
    try:
        result = await server.verify(request("\\boxed{31}"))
    finally:
        await server.close()
    assert result.reward == 0.0 and "_ng_failure_class" not in result.model_dump()


@pytest.mark.parametrize(
    "failure",
    [ServerRequestError("connection refused", server="judge"), aiohttp.ClientConnectionError("reset"),
     FakeReply({"error": "overloaded"}, status=503), FakeReply(b"<html>not json</html>"), FakeReply({"id": 3})],
)  # fmt: skip
async def test_judge_transport_failures_become_judge_failed_rows(failure):
    server = make_server(should_use_judge=True)
    if isinstance(failure, FakeReply):
        server.server_client.post = AsyncMock(return_value=failure)
    else:
        server.server_client.post = AsyncMock(side_effect=failure)
    try:
        result = (await server.verify(request("\\boxed{31}", uuid="row-9"))).model_dump()
    finally:
        await server.close()
    assert result["reward"] == 0.0 and result["_ng_failure_class"] == "judge_failed"
    assert result["_ng_failure_message"] and result["uuid"] == "row-9"


def test_a_judge_failure_reaches_the_collector_over_http():
    server = make_server(should_use_judge=True)
    server.server_client.post = AsyncMock(side_effect=ServerRequestError("connection refused", server="judge"))
    body = {"responses_create_params": {"input": "q"}, "expected_answer": "3",
            "response": assistant_response("\\boxed{4}").model_dump(mode="json")}  # fmt: skip
    with TestClient(server.setup_webserver()) as client:
        reply = client.post("/verify", json=body)
    assert reply.status_code == 200
    assert (reply.json()["reward"], reply.json()["_ng_failure_class"]) == (0.0, "judge_failed")


def test_judge_needs_a_model_server():
    with pytest.raises(ValueError, match="judge_model_server"):
        MathWithJudgeResourcesServer(
            config=MathWithJudgeResourcesServerConfig(
                host="127.0.0.1", port=0, entrypoint="", name="m", should_use_judge=True
            ),
            server_client=MagicMock(spec=ServerClient),
        )


# -- metrics, routes, data --------------------------------------------------------------------------------------------


async def test_aggregate_metrics(server):
    rows = [
        {"_ng_task_index": 0, "reward": 1.0, "extracted_answer": "32", "library_reward": 1.0},
        {"_ng_task_index": 0, "reward": 1.0, "extracted_answer": "32", "library_reward": 1.0},
        {"_ng_task_index": 0, "reward": 0.0, "extracted_answer": "31", "library_reward": 0.0},
        {"_ng_task_index": 1, "reward": 0.0, "extracted_answer": None, "library_reward": 0.0},
        {"_ng_task_index": 1, "reward": 0.0, "extracted_answer": "7", "library_reward": 0.0},
        {"_ng_task_index": 1, "reward": 1.0, "extracted_answer": "8", "library_reward": 1.0},
    ]
    metrics = (await server.aggregate_metrics(AggregateMetricsRequest(verify_responses=rows))).agent_metrics
    assert metrics["pass@1"] == pytest.approx(0.5)
    assert metrics["pass@2"] == pytest.approx((1.0 + (1 - 1 / 3)) / 2)  # 1 - C(n-c, 2) / C(n, 2) per task
    assert metrics["majority@2"] == pytest.approx(0.5)  # task 0: 32 (right); task 1: 7 first of the 1-1 tie
    assert metrics["no_answer"] == pytest.approx(1 / 6)
    assert metrics["mean/library_reward"] == pytest.approx(0.5)


def test_routes_with_lifespan_and_example_rows():
    server = make_server()
    rows = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    assert len(rows) == 5
    answers = ["\\boxed{108}", "\\boxed{\\frac{6}{36}}", "x = \\boxed{5}", "\\boxed{\\sqrt{18}}", "\\boxed{0.333333}"]
    with TestClient(server.setup_webserver()) as client:  # the lifespan starts the pool before any request
        assert server._verifiers.get().started
        assert client.get("/reverify_mode").json() == "stateless"
        for row, answer in zip(rows, answers, strict=True):
            body = row | {"response": assistant_response(answer).model_dump(mode="json")}
            reply = client.post("/verify", json=body)
            assert reply.status_code == 200 and reply.json()["reward"] == 1.0, (row["expected_answer"], reply.json())
        assert client.post("/verify", json={"responses_create_params": {"input": "q"}}).status_code == 422
        pids = server._verifiers.get().pids
    assert gone(pids)
