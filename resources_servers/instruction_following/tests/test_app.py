"""instruction_following's verify: graded text, grading modes, row formats, failures, loose variants, metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest

from nemo_gym.config_types import AggregateMetricsRequest
from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.server_utils import ServerClient
from resources_servers.instruction_following.app import (
    InstructionFollowingResourcesServer,
    InstructionFollowingResourcesServerConfig,
    InstructionFollowingVerifyRequest,
)

IDS = ["punctuation:no_comma", "detectable_format:title", "length_constraints:number_words"]
KWARGS: list[dict[str, Any] | None] = [None, {}, {"num_words": 10, "relation": "at most"}]


def make_server(**settings: Any) -> InstructionFollowingResourcesServer:
    config = InstructionFollowingResourcesServerConfig(host="127.0.0.1", port=0, entrypoint="", name="if", **settings)
    return InstructionFollowingResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))


def message(text: str) -> dict[str, Any]:
    return {"type": "message", "id": "m", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def row(*items: dict[str, Any], ids=IDS, kwargs=KWARGS, **metadata: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Write a title and a line."}]},
        "response": NeMoGymResponse(id="r", created_at=0, model="m", output=list(items)).model_dump(),
        "verifier_metadata": {"instruction_id_list": ids, "kwargs": kwargs, **metadata},
    }


async def verify(body: dict[str, Any], server=None):
    return await (server or make_server()).verify(InstructionFollowingVerifyRequest.model_validate(body))


async def test_all_instructions_followed_scores_one_with_per_instruction_results():
    result = await verify(row(message("<<Spring>>\nBirds sing at dawn.")))
    assert (result.reward, result.follow_all_instructions, result.fraction_followed) == (1.0, True, 1.0)
    assert [r.instruction_id for r in result.instruction_results] == IDS
    assert result.follow_instruction_list == [True, True, True] and result.num_instructions == 3
    assert result.instruction_results[2].detail == "5 words; needs at most 10"


async def test_binary_and_fraction_modes_from_config_and_row():
    one_miss = message("<<Spring>>\nBirds, bees and trees.")
    assert (await verify(row(one_miss))).reward == 0.0
    assert (await verify(row(one_miss), make_server(grading_mode="fraction"))).reward == pytest.approx(2 / 3)
    assert (await verify(row(one_miss, grading_mode="fraction"))).reward == pytest.approx(2 / 3)
    assert (await verify(row(one_miss, grading_mode="binary"), make_server(grading_mode="fraction"))).reward == 0.0


async def test_only_the_final_assistant_message_is_graded():
    call = {"type": "function_call", "call_id": "c", "name": "t", "arguments": "{}"}
    draft, final = message("Draft, with commas, and no title."), message("<<Final>>\nShort line.")
    assert (await verify(row(draft, call, final))).reward == 1.0
    assert (await verify(row(final, call, draft))).reward == 0.0


async def test_no_reply_at_all_scores_zero():
    result = await verify(row())
    assert result.reward == 0.0 and result.follow_instruction_list == [True, False, True]


async def test_unknown_ids_and_bad_kwargs_count_as_not_followed():
    result = await verify(
        row(
            message("<<T>> ok"),
            ids=["no:such", "length_constraints:number_words", "punctuation:no_comma"],
            kwargs=[{}, {"num_words": "many", "relation": "at most"}, {"extra": 1}],
        )  # fmt: skip
    )
    assert result.reward == 0.0 and result.follow_instruction_list == [False, False, False]
    assert result.instruction_results[0].detail == "unknown instruction id"
    assert result.instruction_results[1].detail.startswith("invalid kwargs")


async def test_legacy_rows_with_top_level_fields_and_short_kwargs():
    legacy = row(message("<<T>>\nfine"))
    metadata = legacy.pop("verifier_metadata")
    legacy |= {"instruction_id_list": metadata["instruction_id_list"][:2], "kwargs": [None], "id": 17}
    result = await verify(legacy)
    assert result.reward == 1.0 and result.verifier_metadata.instruction_id_list == IDS[:2]
    assert result.model_dump()["id"] == 17


def test_malformed_rows_are_rejected():
    with pytest.raises(ValueError):
        InstructionFollowingVerifyRequest.model_validate(row(message("x"), ids=[], kwargs=[]))
    with pytest.raises(ValueError):
        InstructionFollowingVerifyRequest.model_validate(row(message("x"), ids=IDS[:1], kwargs=[{}, {}]))


async def test_loose_grading_is_reported_but_not_rewarded():
    text = "Sure, here it is:\n<<Title>>\nThe note."
    result = await verify(row(message(text), ids=["punctuation:no_comma"], kwargs=[{}]))
    assert (result.reward, result.follow_all_instructions_loose) == (0.0, True)
    assert result.instruction_results[0].followed_loose


async def test_aggregate_metrics_add_instruction_level_accuracy():
    first = (await verify(row(message("<<Spring>>\nBirds sing.")))).model_dump()
    second = (await verify(row(message("No title, sorry.")))).model_dump()
    rows = [first | {"_ng_task_index": 0}, second | {"_ng_task_index": 1}]
    metrics = await make_server().aggregate_metrics(AggregateMetricsRequest(verify_responses=rows))
    assert metrics.agent_metrics["instruction_level_accuracy"] == pytest.approx(4 / 6)
    assert metrics.agent_metrics["instruction/detectable_format:title/followed"] == 0.5
    assert metrics.agent_metrics["mean/follow_all_instructions"] == 0.5
    assert "instruction_level_accuracy" in metrics.key_metrics


GOLD_REPLIES = {
    "ladder": "<<Ladder Request>>\nHi Tomas! Could I borrow your ladder on Saturday morning? I want to clean the "
    "gutters and will bring it back by lunch.\n\nP.S. I can return the favour with fresh bread.",
    "tides": "the moon pulls on the sea with its gravity.\n***\nthat pull makes the water bulge, so the sea rises "
    "on one side of the earth.\n***\nas the earth spins, each beach passes through the bulges, so we get high and "
    "low tides.",
    "cookie_dough": "My answer is no. Raw flour and raw eggs can carry germs, so bake the dough first.",
    "marathon": "Here is a plan:\n* Build your *weekly mileage* slowly.\n* Do one long run every week.\n"
    "* Practise **race-day fuelling** on long runs.\n* Rest well before the race.\nAny other questions?",
    "autumn_fr": "\"Nous marchons dans la forêt sous les feuilles rousses. L'air sent la mousse et les champignons. "
    'Le soleil bas dore les troncs des chênes."',
}


async def test_every_example_row_accepts_a_compliant_reply():
    lines = (Path(__file__).parents[1] / "data" / "example.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 5
    for example in rows:
        reply = GOLD_REPLIES[example["verifier_metadata"]["id"]]
        result = await verify(example | {"response": row(message(reply))["response"]})
        assert result.reward == 1.0, [r.detail for r in result.instruction_results if not r.followed]
