"""mcqa: one test (or more) per extraction rule, the reward rule, metrics and the HTTP routes."""

from __future__ import annotations

import json
from pathlib import Path
from unittest.mock import MagicMock

import pytest
from fastapi.testclient import TestClient

from nemo_gym.config_types import AggregateMetricsRequest
from nemo_gym.server_utils import ServerClient
from nemo_gym.testing import assistant_response
from resources_servers.mcqa.app import (
    MCQAResourcesServer,
    MCQAResourcesServerConfig,
    MCQAVerifyRequest,
    allowed_options,
)
from resources_servers.mcqa.extraction import extract_letter, normalize_letters

OPTIONS = [
    {"A": "Karyotyping"},
    {"B": "Polymerase chain reaction"},
    {"C": "Western blot"},
    {"D": "Gel electrophoresis"},
]
ALLOWED = allowed_options(OPTIONS)


def make_server(grading_mode: str | None = None) -> MCQAResourcesServer:
    config = MCQAResourcesServerConfig(host="127.0.0.1", port=0, entrypoint="", name="mcqa", grading_mode=grading_mode)
    return MCQAResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))


def request(*texts: str, **row) -> MCQAVerifyRequest:
    body = {"responses_create_params": {"input": "question"}, "options": OPTIONS, "expected_answer": "B"} | row
    return MCQAVerifyRequest.model_validate(body | {"response": assistant_response(*texts)})


async def reward_of(*texts: str, **row) -> tuple[float, str | None]:
    result = await make_server().verify(request(*texts, **row))
    return result.reward, result.extracted_answer


# -- strict_single_letter_boxed ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["\\boxed{B}", "so \\boxed{ (B) }", "\\boxed{\\text{B}}", "\\boxed{B: Polymerase chain reaction}", "\\boxed{B)}",
     "\\boxed{B.}", "\\boxed{B - PCR}", "first \\boxed{A}, no wait: \\boxed{B}", "\\boxed{b}"],
)  # fmt: skip
async def test_strict_boxed_accepts_a_lone_letter_or_a_label(text):
    assert await reward_of(text) == (1.0, "B")


@pytest.mark.parametrize(
    "text",
    ["The answer is B.", "\\boxed{Polymerase chain reaction}", "\\boxed{B and C}", "\\boxed{E}", "\\boxed{}",
     "\\boxed{B", "\\boxed{BC}"],
)  # fmt: skip
async def test_strict_boxed_rejects_everything_else(text):
    reward, letter = await reward_of(text)
    assert reward == 0.0 and letter is None


async def test_wrong_letter_scores_zero_but_is_reported():
    assert await reward_of("\\boxed{C}") == (0.0, "C")


async def test_empty_answer_and_no_message():
    assert await reward_of("") == (0.0, None)
    assert await reward_of() == (0.0, None)


async def test_gold_letter_is_case_insensitive():
    assert await reward_of("\\boxed{B}", expected_answer=" b ") == (1.0, "B")


# -- lenient_boxed -----------------------------------------------------------------------------------------------------


async def test_lenient_boxed_accepts_the_text_of_exactly_one_option():
    assert await reward_of("\\boxed{polymerase chain reaction}", grading_mode="lenient_boxed") == (1.0, "B")
    assert await reward_of("\\boxed{B}", grading_mode="lenient_boxed") == (1.0, "B")
    assert await reward_of("\\boxed{I'd use Western blot}", grading_mode="lenient_boxed") == (0.0, "C")


async def test_lenient_boxed_rejects_two_options_or_none():
    assert await reward_of("\\boxed{Karyotyping or Western blot}", grading_mode="lenient_boxed") == (0.0, None)
    assert await reward_of("\\boxed{sequencing}", grading_mode="lenient_boxed") == (0.0, None)


# -- lenient_answer_colon ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["Reasoning...\nAnswer: B", "Answer: (B)", "answer: b", "Answer: B. PCR amplifies DNA.", "Answer: A\nAnswer: B",
     "Answer: Polymerase chain reaction"],
)  # fmt: skip
async def test_answer_colon(text):
    assert await reward_of(text, grading_mode="lenient_answer_colon") == (1.0, "B")


async def test_answer_colon_needs_the_colon_line():
    assert await reward_of("I pick B", grading_mode="lenient_answer_colon") == (0.0, None)
    assert await reward_of("Answer: PCR-ish method", grading_mode="lenient_answer_colon") == (0.0, None)


# -- lenient_answer_colon_md -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["**Answer:** B", "## Answer: (B)", "*Answer*: **B**", "> Answer: B", "**Answer: B) Polymerase chain reaction**",
     "Answer: A\nOn reflection:\n**Answer:** B", "**Final Answer:** option (B)"],
)  # fmt: skip
async def test_answer_colon_markdown(text):
    assert await reward_of(text, grading_mode="lenient_answer_colon_md") == (1.0, "B")


async def test_answer_colon_markdown_rejects_a_list_of_different_letters():
    assert await reward_of("**Answer:** A, B", grading_mode="lenient_answer_colon_md") == (0.0, None)
    assert await reward_of("**Answer:** B or C", grading_mode="lenient_answer_colon_md") == (0.0, None)
    assert await reward_of("**Answer:** B (B)", grading_mode="lenient_answer_colon_md") == (1.0, "B")


# -- allowed letters, scripts, per-row patterns, server override -------------------------------------------------------


async def test_only_offered_letters_count():
    options = [{"A": "yes"}, {"B": "no"}, {"C": None}]
    assert allowed_options(options) == {"A": "yes", "B": "no"}
    assert await reward_of("\\boxed{C}", options=options, expected_answer="C") == (0.0, None)
    assert await reward_of("\\boxed{D}", options=options) == (0.0, None)


@pytest.mark.parametrize("letter", ["ب", "খ", "Ｂ"])
async def test_arabic_bengali_and_full_width_letters(letter):
    assert normalize_letters(letter) == "B"
    assert await reward_of(f"Answer: {letter}", grading_mode="lenient_answer_colon") == (1.0, "B")
    assert await reward_of(f"\\boxed{{{letter}}}") == (1.0, "B")


async def test_row_patterns_come_first_and_the_last_match_wins():
    meta = {"output_regex": "Final choice:\\s*\\(?([A-D])\\)?"}
    text = "Final choice: A\nHmm.\nFinal choice: (b)\n\\boxed{C}"
    assert await reward_of(text, template_metadata=meta) == (1.0, "B")


async def test_row_patterns_fall_back_to_the_mode_and_accept_option_text():
    meta = {"output_regex": ["Final choice:\\s*(.+)", "never matches (Z)"]}
    assert await reward_of("\\boxed{B}", template_metadata=meta) == (1.0, "B")
    assert await reward_of("Final choice: Polymerase chain reaction", template_metadata=meta) == (1.0, "B")
    assert await reward_of("\\boxed{B}", template_metadata={"output_regex": "(unclosed"}) == (1.0, "B")


async def test_server_grading_mode_overrides_the_row():
    server = make_server(grading_mode="lenient_answer_colon")
    result = await server.verify(request("Answer: B", grading_mode="strict_single_letter_boxed"))
    assert (result.reward, result.grading_mode) == (1.0, "lenient_answer_colon")


async def test_only_assistant_text_is_read():
    reasoning = {"type": "reasoning", "id": "r1", "summary": [{"type": "summary_text", "text": "\\boxed{B}"}]}
    result = await make_server().verify(
        MCQAVerifyRequest.model_validate(
            {"responses_create_params": {"input": "q"}, "options": OPTIONS, "expected_answer": "B",
             "response": assistant_response("\\boxed{C}", extra_output=[reasoning])}
        )
    )  # fmt: skip
    assert (result.reward, result.extracted_answer) == (0.0, "C")


def test_extract_letter_directly():
    assert extract_letter("\\boxed{D}", ALLOWED, "strict_single_letter_boxed") == "D"
    assert extract_letter("   ", ALLOWED, "lenient_answer_colon") is None


# -- the response echoes the row; metrics; routes ----------------------------------------------------------------------


async def test_verify_echoes_row_fields():
    result = await make_server().verify(request("\\boxed{B}", uuid="q-17", subject="biology"))
    dumped = result.model_dump()
    assert dumped["uuid"] == "q-17" and dumped["subject"] == "biology" and dumped["expected_answer"] == "B"


async def test_aggregate_metrics_pass_majority_and_no_answer():
    rows = [
        {"_ng_task_index": 0, "reward": 1.0, "extracted_answer": "B"},
        {"_ng_task_index": 0, "reward": 0.0, "extracted_answer": "C"},
        {"_ng_task_index": 0, "reward": 1.0, "extracted_answer": "B"},
        {"_ng_task_index": 0, "reward": 0.0, "extracted_answer": None},
        {"_ng_task_index": 1, "reward": 0.0, "extracted_answer": "A"},
        {"_ng_task_index": 1, "reward": 0.0, "extracted_answer": "A"},
        {"_ng_task_index": 1, "reward": 1.0, "extracted_answer": "D"},
        {"_ng_task_index": 1, "reward": 0.0, "extracted_answer": None},
    ]
    metrics = await make_server().aggregate_metrics(AggregateMetricsRequest(verify_responses=rows))
    agent = metrics.agent_metrics
    assert agent["mean/reward"] == pytest.approx(3 / 8)
    assert agent["pass@1"] == pytest.approx(3 / 8)
    assert agent["pass@4"] == pytest.approx(1.0)
    assert agent["majority@4"] == pytest.approx(0.5)  # task 0 votes B (right), task 1 votes A (wrong)
    assert agent["majority@1"] == pytest.approx(0.5)
    assert agent["no_answer"] == pytest.approx(2 / 8)
    assert "majority@4" in metrics.key_metrics


def test_routes_and_reverify_mode():
    client = TestClient(make_server().setup_webserver())
    assert client.get("/reverify_mode").json() == "stateless"
    row = json.loads((Path(__file__).parents[1] / "data" / "example.jsonl").read_text().splitlines()[0])
    answer = client.post("/verify", json=row | {"response": assistant_response("\\boxed{B}").model_dump()})
    assert answer.status_code == 200 and answer.json()["reward"] == 1.0
    assert client.post("/verify", json={"responses_create_params": {"input": "q"}}).status_code == 422


def test_example_rows_are_valid_and_self_consistent():
    lines = (Path(__file__).parents[1] / "data" / "example.jsonl").read_text().splitlines()
    assert len(lines) == 5
    for line in lines:
        row = json.loads(line)
        request = MCQAVerifyRequest.model_validate(row | {"response": assistant_response("").model_dump()})
        assert request.expected_answer in allowed_options(request.options)
