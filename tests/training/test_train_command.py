"""``gym train grpo``'s user errors are one line and exit 1; its outputs' helpers work without a training run."""

from __future__ import annotations

import json
import pathlib

import pytest

from nemo_gym.cli.main import main
from nemo_gym.errors import ConfigError
from nemo_gym.training.grpo import GRPOSettings, plot_reward_curve, training_rows


def test_unknown_environment_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "grpo", "--environment", "no_such_env"]) == 1
    err = capsys.readouterr().err.strip()
    assert "--environment 'no_such_env'" in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_no_environment_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "grpo"]) == 1
    assert "--environment NAME" in capsys.readouterr().err


def test_training_rows_come_from_the_agents_dataset_of_the_split(tmp_path: pathlib.Path) -> None:
    rows = tmp_path / "train.jsonl"
    rows.write_text(json.dumps({"responses_create_params": {"input": "hi"}}) + "\n")
    config = {"agent": {"responses_api_agents": {"simple_agent": {"datasets": [
        {"name": "t", "type": "train", "jsonl_fpath": str(rows)}]}}}}  # fmt: skip
    agent, found = training_rows(GRPOSettings(overrides=[], output_dir=tmp_path), config)
    assert agent == "agent" and found == [{"responses_create_params": {"input": "hi"}}]
    with pytest.raises(ConfigError, match="no dataset of type 'validation'"):
        training_rows(GRPOSettings(overrides=[], output_dir=tmp_path, split="validation"), config)


def test_reward_curve_is_a_png(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    history = [{"step": float(i), "reward": i / 10} for i in range(1, 8)]
    path = plot_reward_curve(history, tmp_path / "curve.png", "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
