"""reasoning_gym: answer extraction, the task's own (partial-credit) scores, malformed rows and answers, metrics,
routes, and the data generator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from nemo_gym.config_types import AggregateMetricsRequest
from nemo_gym.server_utils import ServerClient
from nemo_gym.testing import assistant_response
from resources_servers.reasoning_gym import generate_data
from resources_servers.reasoning_gym.app import (
    ReasoningGymResourcesServer,
    ReasoningGymResourcesServerConfig,
    ReasoningGymVerifyRequest,
    extract_answer,
)

pytestmark = pytest.mark.timeout(180)
EXAMPLE = Path(__file__).parents[1] / "data" / "example.jsonl"
ROWS = {row["metadata"]["source_dataset"]: row for row in map(json.loads, EXAMPLE.read_text().splitlines())}


def make_server(**config: Any) -> ReasoningGymResourcesServer:
    settings = ReasoningGymResourcesServerConfig(host="127.0.0.1", port=0, entrypoint="", name="rg", **config)
    return ReasoningGymResourcesServer(config=settings, server_client=MagicMock(spec=ServerClient))


@pytest.fixture
async def server():
    server = make_server()
    yield server
    await server.close()


def request(task: str, *texts: str, **changes: Any) -> ReasoningGymVerifyRequest:
    return ReasoningGymVerifyRequest.model_validate(ROWS[task] | changes | {"response": assistant_response(*texts)})


# -- extraction -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("thinking... <answer>188</answer>", "188"), ("<answer>1</answer> then <answer> 2 </answer>", "2"),
     ("<answer>\nmulti\nline\n</answer>", "multi\nline"), ("so \\boxed{188}", "188"),
     ("<answer>7</answer> and \\boxed{8}", "7"), ("  just 188  ", "just 188"), ("<answer>unclosed", "<answer>unclosed")],
)  # fmt: skip
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


# -- reward rule ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", sorted(ROWS))
async def test_each_example_scores_one_with_its_reference_answer(server, task):
    result = await server.verify(request(task, f"Let me work it out.\n<answer>{ROWS[task]['answer']}</answer>"))
    assert (result.reward, result.score, result.task_name) == (1.0, 1.0, task)
    assert result.extracted_answer == ROWS[task]["answer"] and result.scorer_error is None


async def test_wrong_answer_scores_zero(server):
    result = await server.verify(request("leg_counting", "<answer>187</answer>"))
    assert (result.reward, result.extracted_answer) == (0.0, "187")


async def test_partial_credit_is_the_reward(server):
    near = await server.verify(request("spell_backward", "<answer>ytilaidol</answer>"))  # one letter short
    assert 0.0 < near.reward < 1.0 and near.reward == near.score
    half = await server.verify(request("knights_knaves", "<answer>Liam is a pioneer, and Ella is a pioneer.</answer>"))
    assert 0.0 < half.reward < 1.0


async def test_boxed_and_bare_answers_are_accepted(server):
    assert (await server.verify(request("basic_arithmetic", "The result is \\boxed{-1043}."))).reward == 1.0
    assert (await server.verify(request("basic_arithmetic", "-1043"))).reward == 1.0


@pytest.mark.parametrize("texts", [(), ("",), ("   \n",)])
async def test_no_answer_scores_zero_without_calling_the_scorer(server, texts):
    result = await server.verify(request("leg_counting", *texts))
    assert (result.reward, result.extracted_answer, result.scorer_error) == (0.0, None, None)


async def test_a_scorer_that_raises_scores_zero_and_says_why(server):
    row = {"question": "Find the prime factorization of 12.", "answer": "2 × 2 × 3",
           "metadata": {"source_dataset": "prime_factorization", "number": 12, "factors": [2, 2, 3]}}  # fmt: skip
    body = row | {"responses_create_params": {"input": "q"}, "response": assistant_response("<answer>twelve</answer>")}
    result = await server.verify(ReasoningGymVerifyRequest.model_validate(body))
    assert result.reward == 0.0 and "ValueError" in result.scorer_error
    good = body | {"response": assistant_response("<answer>2 × 2 × 3</answer>")}
    assert (await server.verify(ReasoningGymVerifyRequest.model_validate(good))).reward == 1.0


async def test_an_unknown_task_is_reported(server):
    result = await server.verify(request("leg_counting", "<answer>1</answer>", metadata={"source_dataset": "nope"}))
    assert result.reward == 0.0 and "not registered" in result.scorer_error


@pytest.mark.parametrize("metadata", [{}, {"source_dataset": ""}, {"source_dataset": 3}])
def test_a_row_must_name_its_task(metadata):
    with pytest.raises(ValidationError, match="source_dataset"):
        request("leg_counting", "x", metadata=metadata)


async def test_verify_echoes_the_row(server):
    result = (
        await server.verify(request("gcd" if "gcd" in ROWS else "leg_counting", "<answer>1</answer>"))
    ).model_dump()
    assert result["metadata"]["source_dataset"] and result["question"] and "answer" in result


# -- metrics, routes --------------------------------------------------------------------------------------------------


async def test_aggregate_metrics_per_task(server):
    rows = [
        {"_ng_task_index": 0, "reward": 1.0, "task_name": "gcd", "extracted_answer": "3"},
        {"_ng_task_index": 0, "reward": 0.0, "task_name": "gcd", "extracted_answer": "4"},
        {"_ng_task_index": 1, "reward": 0.5, "task_name": "word_sorting", "extracted_answer": "b, a"},
        {"_ng_task_index": 1, "reward": 0.5, "task_name": "word_sorting", "extracted_answer": None},
    ]
    metrics = (await server.aggregate_metrics(AggregateMetricsRequest(verify_responses=rows))).agent_metrics
    assert metrics["mean/reward"] == pytest.approx(0.5)
    assert metrics["task_name/gcd/mean_reward"] == pytest.approx(0.5)
    assert metrics["task_name/word_sorting/share"] == pytest.approx(0.5)
    assert metrics["no_answer"] == pytest.approx(0.25)


def test_routes_with_lifespan():
    server = make_server()
    with TestClient(server.setup_webserver()) as client:
        assert client.get("/reverify_mode").json() == "stateless"
        body = ROWS["leg_counting"] | {"response": assistant_response("<answer>188</answer>").model_dump(mode="json")}
        reply = client.post("/verify", json=body)
        assert reply.status_code == 200 and reply.json()["reward"] == 1.0
        missing = body | {"metadata": {"animals": {}}}
        assert client.post("/verify", json=missing).status_code == 422


# -- data generator ---------------------------------------------------------------------------------------------------


def test_generate_data_writes_self_contained_scorable_rows(tmp_path, caplog):
    assert generate_data.main(["--tasks", "gcd,spell_backward", "--train-size", "3", "--validation-size", "2",
                               "--seed", "11", "--output-dir", str(tmp_path)]) == 0  # fmt: skip
    train = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    validation = [json.loads(line) for line in (tmp_path / "validation.jsonl").read_text().splitlines()]
    assert len(train) == 6 and len(validation) == 4
    assert [r["metadata"]["source_dataset"] for r in train[:2]] == ["gcd", "spell_backward"]  # interleaved
    for row in train + validation:
        ReasoningGymVerifyRequest.model_validate(row | {"response": assistant_response("x").model_dump()})
        assert row["question"] in row["responses_create_params"]["input"][0]["content"]
    assert "scores" not in caplog.text  # every reference answer scored 1.0 after the JSON round trip
    again = tmp_path / "again"
    generate_data.main(["--tasks", "gcd,spell_backward", "--train-size", "3", "--validation-size", "0",
                        "--seed", "11", "--output-dir", str(again)])  # fmt: skip
    assert (again / "train.jsonl").read_text() == (tmp_path / "train.jsonl").read_text()  # deterministic
    assert not (again / "validation.jsonl").exists()


def test_generate_data_rejects_unknown_tasks(tmp_path):
    with pytest.raises(SystemExit):
        generate_data.main(["--tasks", "no_such_task", "--output-dir", str(tmp_path)])
