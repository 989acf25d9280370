"""string_match: each extraction mode, each normalisation rule, malformed replies, and the answer metrics."""

from __future__ import annotations

import json
from pathlib import Path
from unittest.mock import MagicMock

import pytest
from fastapi.testclient import TestClient

from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.server_utils import ServerClient
from resources_servers.string_match.app import (
    StringMatchResourcesServer,
    StringMatchResourcesServerConfig,
    StringMatchVerifyRequest,
    string_match_metrics,
)
from resources_servers.string_match.matching import (
    NEAR_NUMERIC_SCORE,
    basic_normalize,
    canonical_answer,
    extract_answer,
    last_boxed,
    parse_quantity,
    score_answer,
)

DATA = Path(__file__).parents[1] / "data" / "example.jsonl"


def make_server(**settings) -> StringMatchResourcesServer:
    config = StringMatchResourcesServerConfig(host="127.0.0.1", port=8080, entrypoint="", name="", **settings)
    return StringMatchResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))


def _response(*texts: str) -> NeMoGymResponse:
    output = [
        {"type": "message", "id": f"m{i}", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": text, "annotations": []}]}
        for i, text in enumerate(texts)
    ]  # fmt: skip
    return NeMoGymResponse.model_validate(
        {"id": "resp_1", "created_at": 0, "model": "m", "object": "response", "output": output,
         "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
    )  # fmt: skip


def _request(expected, *texts: str, **fields) -> StringMatchVerifyRequest:
    return StringMatchVerifyRequest.model_validate(
        {"responses_create_params": {"input": "q"}, "response": _response(*texts).model_dump(),
         "expected_answer": expected, **fields}
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# Extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("So the answer is \\boxed{42}.", "42"),
        ("first \\boxed{1}, then \\boxed{2}", "2"),  # the last box wins
        ("\\boxed{\\text{Paris}}", "Paris"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces stay balanced
        ("\\boxed{a\\{b\\}}", "a\\{b\\}"),  # escaped braces are literal
        ("\\fbox{7}", "7"),
        ("\\boxed{12", None),  # unbalanced
        ("\\boxed{1} and later \\boxed{2", None),  # the last box is unbalanced: no answer, not an older one
        ("\\boxed{}", None),
        ("\\boxed{  }", None),
        ("no box here", None),
    ],
)
def test_boxed_mode(text, expected):
    assert extract_answer(text, "boxed") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Let me think.\nFinal answer: 42.", "42"),  # trailing period removed
        ("Answer: 3\nwait, no.\nAnswer: 4", "4"),  # last labelled line
        ("**Final Answer:** Paris", "Paris"),  # markdown emphasis around the label
        ("**Final answer**: Lyon", "Lyon"),
        ("The answer is: 9", "9"),
        ("Final answer:\n\n  17", "17"),  # answer on the next non-empty line
        ("Final answer: \\boxed{8}.", "8"),
        ("I computed \\boxed{5} in the end", "5"),  # falls back to the last box
        ("FINAL ANSWER：６", "６"),  # full-width colon
        ("just some words", None),
        ("", None),
    ],
)
def test_final_answer_mode(text, expected):
    assert extract_answer(text, "final_answer") == expected


def test_last_line_and_full_response_modes():
    assert extract_answer("thinking...\n  Iron  \n\n", "last_line") == "Iron"
    assert extract_answer(" \n \n", "last_line") is None
    assert extract_answer("  California\n", "full_response") == "California"
    assert extract_answer("   ", "full_response") is None
    with pytest.raises(ValueError, match="unknown extraction mode"):
        extract_answer("x", "telepathy")  # type: ignore[arg-type]


def test_last_boxed_ignores_unrelated_commands():
    assert last_boxed("\\boxedx") is None


# --------------------------------------------------------------------------------------------------------------------
# Normalisation rules (one case or more per rule)


@pytest.mark.parametrize(
    ("answer", "expected", "score"),
    [
        ("Paris", "paris", 1.0),  # case
        ("PARIS", "Paris", 1.0),
        ("  Paris  ", "Paris", 1.0),  # whitespace
        ("new   york city", "New York City", 1.0),  # inner whitespace collapsed
        ('"Paris"', "Paris", 1.0),  # outer quotes
        ("\u201cParis\u201d", "Paris", 1.0),  # curly quotes
        ("'Paris.'", "Paris", 1.0),  # quotes and punctuation together
        ('"Paris', "Paris", 0.0),  # unmatched quote is not stripped
        ("Paris!", "Paris", 1.0),  # trailing punctuation
        ("Paris?!", "Paris", 1.0),
        ("\uff12\uff14", "24", 1.0),  # NFKC: full-width digits
        ("\ufb01sh", "fish", 1.0),  # NFKC: ligature
        ("1,440", "1440", 1.0),  # thousands separators
        ("1 000 000", "1000000", 1.0),
        ("1440.0", "1,440", 1.0),  # float normalisation
        ("1e3", "1000", 1.0),
        ("-5", "\u22125", 1.0),  # unicode minus
        ("\\text{Mars}", "Mars", 1.0),  # LaTeX wrappers
        ("$\\mathrm{Fe}$", "fe", 1.0),
        ("\\frac{3}{4}", "0.75", 1.0),  # fractions
        ("\\dfrac{1}{2}", "1/2", 1.0),
        ("90^\\circ", "90\u00b0", 1.0),
        ("2 \\times 3", "2 * 3", 1.0),
        ("50\\%", "50%", 1.0),
        ("red, green and blue", "red green blue", 1.0),  # list separators
        ("red; green; blue", "red, green, blue", 1.0),
        ("blue, green, red", "red, green, blue", 0.0),  # order matters
        ("Texas", "TX", 1.0),  # US state names
        ("Springfield, Illinois", "Springfield, IL", 1.0),
        ("George Washington", "George WA", 0.0),  # only whole answers or items are states
        ("12 cm", "12", 1.0),  # a unit on one side
        ("12", "12 cm", 1.0),
        ("12 cm", "12 km", 0.0),  # different units
        ("2 million", "2,000,000", 1.0),  # scale words
        ("$1,200", "1200", 1.0),
        ("3.14", "3.14159", NEAR_NUMERIC_SCORE),  # near-numeric
        ("1001", "1000", NEAR_NUMERIC_SCORE),
        ("1020", "1000", 0.0),  # 2 % off: wrong
        ("0.001", "0", 0.0),  # no relative error around zero
        ("-1000", "1000", 0.0),
        ("1 + 2", "3", 0.0),  # an expression is not a number
        ("3 4", "34", 0.0),
        ("Lyon", "Paris", 0.0),  # plain wrong
        ("", "Paris", 0.0),
        (".", "", 0.0),  # an empty normalised answer never matches
    ],
)
def test_case_insensitive_rules(answer, expected, score):
    assert score_answer(answer, expected) == score


def test_case_sensitive_mode_is_exact_after_stripping():
    assert score_answer("  A ", "A", case_sensitive=True) == 1.0
    assert score_answer("a", "A", case_sensitive=True) == 0.0
    assert score_answer("1,000", "1000", case_sensitive=True) == 0.0
    assert score_answer(None, "A", case_sensitive=True) == 0.0


def test_helpers():
    assert basic_normalize('  "Caf\u00e9."  ') == "caf\u00e9"
    assert parse_quantity("12 km/h") == (12.0, "km/h")
    assert parse_quantity("1/0") is None and parse_quantity("inf") is None and parse_quantity("abc") is None
    assert canonical_answer("1,000") == canonical_answer("1000.0") == canonical_answer("\\text{1000}")
    assert canonical_answer("Springfield, Illinois") == canonical_answer("springfield IL")
    assert canonical_answer(None) is None


# --------------------------------------------------------------------------------------------------------------------
# The server


async def test_verify_correct_wrong_and_echoed_fields():
    server = make_server()
    good = await server.verify(_request("Mars", "It is red.", "Final answer: Mars", problem_id=7))
    assert (good.reward, good.extracted_answer, good.expected_answer) == (1.0, "Mars", "Mars")
    assert good.model_dump()["problem_id"] == 7  # task fields are echoed
    wrong = await server.verify(_request("Mars", "Final answer: Venus"))
    assert (wrong.reward, wrong.extracted_answer) == (0.0, "Venus")


async def test_verify_joins_messages_and_uses_row_or_config_mode():
    server = make_server()
    joined = await server.verify(_request("Paris", "Par", "is", extraction_mode="full_response"))
    assert (joined.extracted_answer, joined.reward) == ("Par\nis", 0.0)  # one message per line, never glued
    boxed = await server.verify(_request(12, "Answer: 11", "\\boxed{12}", extraction_mode="boxed"))
    assert (boxed.reward, boxed.expected_answer) == (1.0, "12")  # numeric gold answers are compared as text
    configured = make_server(extraction_mode="last_line", case_sensitive=True)
    result = await configured.verify(_request("Iron", "thinking", "Iron"))
    assert result.reward == 1.0 and (await configured.verify(_request("Iron", "iron"))).reward == 0.0
    row_wins = await configured.verify(_request("Iron", "iron", case_sensitive=False))
    assert row_wins.reward == 1.0


@pytest.mark.parametrize(
    "texts",
    [(), ("",), ("I am not sure.",), ("\\boxed{42",)],
    ids=["empty output", "empty text", "no answer", "unbalanced braces"],
)
async def test_malformed_replies_score_zero_without_an_answer(texts):
    result = await make_server().verify(_request("42", *texts))
    assert (result.reward, result.extracted_answer) == (0.0, None)


def test_routes():
    client = TestClient(make_server().setup_webserver())
    assert client.get("/reverify_mode").json() == "stateless"
    body = _request("Mars", "\\boxed{mars}").model_dump(mode="json")
    answer = client.post("/verify", json=body)
    assert answer.status_code == 200 and answer.json()["reward"] == 1.0
    assert answer.json()["extracted_answer"] == "mars"
    assert client.post("/verify", json={**body, "extraction_mode": "psychic"}).status_code == 422
    missing = {k: v for k, v in body.items() if k != "expected_answer"}
    assert client.post("/verify", json=missing).status_code == 422


def _rows(task: int, answers: list[str | None], expected: str) -> list[dict]:
    return [
        {"_ng_task_index": task, "_ng_rollout_index": i, "extracted_answer": a, "reward": score_answer(a, expected)}
        for i, a in enumerate(answers)
    ]


def test_metrics_pass_majority_and_no_answer():
    rows = _rows(0, ["7", "7.0", "8", None], "7") + _rows(1, ["1,000", "3", "3", "3"], "1000")
    metrics = string_match_metrics(rows).agent_metrics
    assert metrics["no_answer"] == 1 / 8
    assert metrics["pass@1"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert metrics["pass@4"] == 1.0
    assert metrics["majority@1"] == 1.0  # both first answers are right
    assert metrics["majority@4"] == 0.5  # task 0: "7" and "7.0" vote together; task 1: "3" wins
    assert not any(key.startswith(("mean/_", "mean/extracted")) for key in metrics)
    assert string_match_metrics([]).agent_metrics.get("no_answer") is None


def test_aggregate_metrics_route_adds_key_metrics():
    client = TestClient(make_server().setup_webserver())
    rows = _rows(0, ["7", "7", None, "7"], "7")
    answer = client.post("/aggregate_metrics", json={"verify_responses": rows})
    assert answer.status_code == 200
    metrics = answer.json()
    assert metrics["agent_metrics"]["mean/reward"] == 0.75
    assert metrics["key_metrics"]["majority@4"] == 1.0 and metrics["key_metrics"]["no_answer"] == 0.25
    assert len(metrics["group_level_metrics"]) == 1


async def test_example_rows_are_answerable():
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    assert len(rows) == 5
    replies = ["\\boxed{Mars}", "So 24 * 60.\nFinal answer: 1440", "Fe is\nIron", "California.", "\\boxed{A}"]
    server = make_server()
    for row, reply in zip(rows, replies, strict=True):
        result = await server.verify(StringMatchVerifyRequest.model_validate(row | {"response": _response(reply)}))
        assert result.reward == 1.0, (row["expected_answer"], reply)
