"""``VerifyReward``: TRL's reward function backed by a real resources server's ``/verify`` (string_match)."""

from __future__ import annotations

import json
import pathlib

import pytest

from nemo_gym.launcher import running_servers
from nemo_gym.training.trl_adapters import VerifyReward, rows_to_dataset

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_completions_are_scored_by_the_verifier(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("datasets")
    rows = [{"responses_create_params": {"input": "Capital of France?"}, "expected_answer": "Paris"}] * 2
    dataset = rows_to_dataset(rows)
    assert dataset[0]["prompt"] == [{"role": "user", "content": "Capital of France?"}]
    overrides = [
        f"+config_paths=[{ROOT / 'resources_servers/string_match/configs/string_match.yaml'}]",
        f"++results_dir={tmp_path / 'results'}",
        "++head_server.port=0",
        "++shared_venv=true",
        "++policy_model={responses_api_models:{scripted_model:{entrypoint:app.py}}}",
    ]
    with running_servers(overrides) as launcher:
        url = next(s.url for s in launcher.servers if s.name == "string_match")
        reward = VerifyReward(url)
        completions = [[{"role": "assistant", "content": "It is Paris.\nFinal answer: Paris"}],
                       [{"role": "assistant", "content": "Final answer: Lyon"}]]  # fmt: skip
        scores = reward(dataset["prompt"], completions, row=dataset["row"])
    assert scores == [1.0, 0.0]
    assert reward.__name__ == "verify"
    assert json.loads(dataset["row"][0])["expected_answer"] == "Paris"
