"""The token-id chain check, the splice that keeps the chain, and reading a sampled reply back: no model needed."""

from __future__ import annotations

import pytest

from nemo_gym.chat_protocol import normalize_tools, parse_reply
from nemo_gym.errors import TokenDriftError
from nemo_gym.training.drift import Turn, check_token_chain, find_drift, turns_of
from nemo_gym.training.policy import splice_history
from nemo_gym.training.trl_adapters import rollout_tokens

TOOLS = normalize_tools([{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}])


def test_a_chain_that_extends_each_turn_passes() -> None:
    turns = [Turn([1, 2], [3, 4], [-0.1, -0.2]), Turn([1, 2, 3, 4, 9, 9], [5], [-0.3])]
    assert find_drift(turns) is None
    check_token_chain(turns)


def test_a_drifting_chain_is_an_error_naming_turn_and_offset() -> None:
    turns = [Turn([1, 2], [3, 4], [-0.1, -0.2]), Turn([1, 2, 3, 7, 9], [5], [-0.3])]
    drift = find_drift(turns)
    assert drift is not None and (drift.turn, drift.offset, drift.expected, drift.found) == (1, 3, 4, 7)
    with pytest.raises(TokenDriftError, match=r"rollout 7: token-id drift at turn 1, offset 3"):
        check_token_chain(turns, "rollout 7")


def test_rollout_tokens_refuses_a_drifting_rollout() -> None:
    output = [
        {
            "type": "function_call",
            "prompt_token_ids": [1, 2],
            "generation_token_ids": [3],
            "generation_log_probs": [-1],
        },
        {
            "type": "message",
            "prompt_token_ids": [1, 2, 8, 5],
            "generation_token_ids": [6],
            "generation_log_probs": [-1],
        },
    ]
    with pytest.raises(TokenDriftError, match="turn 1, offset 2"):
        rollout_tokens({"response": {"output": output}, "reward": 1.0})


def test_rollout_tokens_masks_what_the_model_did_not_write() -> None:
    output = [
        {"type": "function_call", "prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-1]},
        {"type": "function_call_output", "output": "x"},
        {"type": "message", "prompt_token_ids": [1, 2, 3, 8, 9], "generation_token_ids": [6, 7],
         "generation_log_probs": [-2, -3]},
    ]  # fmt: skip
    tokens = rollout_tokens({"response": {"output": output}, "reward": 0.5})
    assert len(turns_of(output)) == 2
    assert tokens.prompt_ids == [1, 2]
    assert tokens.completion_ids == [3, 8, 9, 6, 7]
    assert tokens.env_mask == [1, 0, 0, 1, 1]
    assert tokens.logprobs == [-1, 0, 0, -2, -3]
    assert tokens.reward == 0.5


def test_splice_keeps_the_generated_ids_and_takes_only_what_follows() -> None:
    end = 2
    # Re-rendered: system turn, user turn, the assistant turn re-tokenized differently (40 41), then a tool turn.
    full = [10, 11, end, 20, 21, end, 40, 41, end, 50, 51, end, 60]
    history = [10, 11, end, 20, 21, end, 30, 31, 32, end]  # what the model was prompted with and wrote
    spliced, start = splice_history(full, history, turn_end_count=3, end_id=end)
    assert spliced == history + [50, 51, end, 60] and start == len(history)
    spliced, _ = splice_history(full, history[:-1], turn_end_count=3, end_id=end)  # cut short: the turn is closed
    assert spliced[: len(history)] == history


def test_parse_reply_reads_calls_and_messages() -> None:
    assert parse_reply('functions.get_weather:\n{"city": "Paris"}', TOOLS) == (
        None,
        [("get_weather", '{"city": "Paris"}')],
    )
    assert parse_reply("message:\nIt is cold.", TOOLS) == ("It is cold.", [])
    assert parse_reply('functions.get_weather:\n{"city": "Par', TOOLS)[1] == []  # broken arguments stay text
    assert parse_reply("Just text.", []) == ("Just text.", [])
