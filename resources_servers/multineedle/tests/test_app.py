"""multineedle: answer parsing, the fraction-of-needles reward, and the haystack generator's guarantees."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest
from fastapi.testclient import TestClient

from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.server_utils import ServerClient
from resources_servers.multineedle import generate_data
from resources_servers.multineedle.app import (
    MultineedleResourcesServer,
    MultineedleResourcesServerConfig,
    MultineedleVerifyRequest,
    last_json_object,
    parse_answer,
)

DATA = Path(__file__).parents[1] / "data" / "example.jsonl"
ROW = generate_data.build_row(2)  # three needles
KEYS = [needle["key"] for needle in ROW["needles"]]
VALUES = [needle["value"] for needle in ROW["needles"]]


def make_server(**config: Any) -> MultineedleResourcesServer:
    settings = {"host": "127.0.0.1", "port": 0, "entrypoint": "", "name": "", "domain": "long_context"} | config
    return MultineedleResourcesServer(
        config=MultineedleResourcesServerConfig(**settings), server_client=MagicMock(spec=ServerClient)
    )


def message(text: str, index: int = 0) -> dict[str, Any]:
    return {"type": "message", "id": f"m{index}", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def response(*items: dict[str, Any]) -> NeMoGymResponse:
    return NeMoGymResponse.model_validate({"id": "r", "created_at": 0, "model": "m", "output": list(items)})


async def verify(*items: dict[str, Any], row: dict[str, Any] = ROW, **config: Any) -> dict[str, Any]:
    request = MultineedleVerifyRequest.model_validate(row | {"response": response(*items).model_dump()})
    return (await make_server(**config).verify(request)).model_dump()


def answer_json(values: list[Any], keys: list[str] = KEYS) -> str:
    return json.dumps(dict(zip(keys, values, strict=True)))


# --- the reward rule -------------------------------------------------------------------------------------------------


async def test_all_needles_found_is_reward_one():
    result = await verify(message(answer_json(VALUES)))
    assert (result["reward"], result["all_found"], result["answer_format"], result["num_found"]) == (
        1.0,
        True,
        "json",
        3,
    )


async def test_the_reward_is_the_fraction_of_needles_found():
    result = await verify(message(answer_json([VALUES[0], "XX-0000", VALUES[2]])))
    assert result["reward"] == pytest.approx(2 / 3) and not result["all_found"]
    assert [r["found"] for r in result["needle_results"]] == [True, False, True]
    assert result["needle_results"][1]["predicted"] == "XX-0000"


async def test_wrong_or_missing_values_score_zero():
    assert (await verify(message(answer_json(["AA-1111", "BB-2222", "CC-3333"]))))["reward"] == 0.0
    assert (await verify(message(json.dumps({"some-other-key": VALUES[0]}))))["reward"] == 0.0


async def test_values_must_match_exactly_unless_configured_otherwise():
    lowered = message(answer_json([value.lower() for value in VALUES]))
    assert (await verify(lowered))["reward"] == 0.0
    assert (await verify(lowered, case_sensitive_values=False))["reward"] == 1.0
    padded = message(answer_json([f"  {value} " for value in VALUES]))  # surrounding spaces are trimmed
    assert (await verify(padded))["reward"] == 1.0


async def test_keys_match_case_insensitively_and_extra_keys_are_ignored():
    text = json.dumps({key.upper(): value for key, value in zip(KEYS, VALUES, strict=True)} | {"decoy": "ZZ-9999"})
    assert (await verify(message(text)))["reward"] == 1.0


async def test_json_in_a_code_fence_among_prose_and_the_last_object_wins():
    draft = answer_json(["AA-1111", "BB-2222", "CC-3333"])
    text = f"First guess: {draft}\nOn reflection:\n```json\n{answer_json(VALUES)}\n```\nThat is all."
    assert (await verify(message(text)))["reward"] == 1.0


async def test_only_the_last_assistant_message_is_graded():
    result = await verify(message(answer_json(VALUES), 0), message("Sorry, I cannot tell.", 1))
    assert (result["reward"], result["answer_format"]) == (0.0, "none")


async def test_key_value_lines_are_the_fallback_format():
    text = "Here is what I found:\n" + "\n".join(f"- {key}: {value}" for key, value in zip(KEYS, VALUES, strict=True))
    result = await verify(message(text))
    assert (result["reward"], result["answer_format"]) == (1.0, "lines")


async def test_malformed_json_is_read_line_by_line():
    text = "{\n" + "".join(f'  "{key}": "{value}",\n' for key, value in zip(KEYS, VALUES, strict=True)) + "}"
    result = await verify(message(text))
    assert (result["reward"], result["answer_format"]) == (1.0, "lines")


async def test_numbers_count_as_their_text_and_containers_do_not():
    row = ROW | {"needles": [{"key": "amber-otter", "value": "4821"}, {"key": "misty-heron", "value": "AB-1234"}]}
    text = json.dumps({"amber-otter": 4821, "misty-heron": ["AB-1234"]})
    result = await verify(message(text), row=row)
    assert result["reward"] == 0.5 and result["needle_results"][1]["predicted"] is None


async def test_no_message_at_all_scores_zero():
    reasoning = {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": answer_json(VALUES)}]}
    call = {"type": "function_call", "call_id": "c", "name": "answer", "arguments": answer_json(VALUES)}
    result = await verify(reasoning, call)
    assert (result["reward"], result["answer_format"]) == (0.0, "none")


def test_a_row_without_needles_is_rejected():
    http = TestClient(make_server().setup_webserver())
    body = ROW | {"needles": [], "response": response(message("{}")).model_dump(mode="json")}
    assert http.post("/verify", json=body).status_code == 422


def test_last_json_object_skips_non_objects_and_keeps_nesting():
    assert last_json_object('[1, 2] {"a": {"b": 1}} {broken') == {"a": {"b": 1}}
    assert last_json_object("no json here") is None
    assert parse_answer("") == ({}, "none")


# --- the generator ---------------------------------------------------------------------------------------------------


def _document(row: dict[str, Any]) -> str:
    return re.search(r"<document>\n(.*)\n</document>", row["responses_create_params"]["input"][0]["content"], re.S)[1]


@pytest.mark.parametrize("seed", [1, 7, 42])
def test_every_needle_is_stated_once_where_recorded_and_asked_for(seed):
    row = generate_data.build_row(seed, num_sentences=80, num_needles=3, num_decoys=2)
    document, prompt = _document(row), row["responses_create_params"]["input"][0]["content"]
    sentences = re.split(r"(?<=\.) ", document.replace("\n\n", " "))
    assert len(sentences) == 80 + 3 + 2
    for needle in row["needles"]:
        assert document.count(needle["value"]) == 1 and needle["key"] in prompt.split("</document>")[1]
        assert (
            needle["key"] in sentences[needle["sentence_index"]]
            and needle["value"] in sentences[needle["sentence_index"]]
        )
    assert len(re.findall(r"\b[A-Z]{2}-\d{4}\b", document)) == 5  # three needles and two decoys


def test_generation_is_deterministic_per_seed():
    assert generate_data.build_row(9) == generate_data.build_row(9)
    assert generate_data.build_row(9) != generate_data.build_row(10)
    with pytest.raises(ValueError):
        generate_data.build_row(1, num_needles=0)


def test_example_data_is_what_the_generator_writes(tmp_path):
    generate_data.main(["--output", str(tmp_path / "example.jsonl")])
    assert (tmp_path / "example.jsonl").read_text() == DATA.read_text()
    assert len(DATA.read_text().splitlines()) == 5
