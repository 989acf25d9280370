"""Exported datasets are what TRL's trainers read: the SFT export loads in ``SFTTrainer``, the DPO export in
``DPOTrainer``, and one optimizer step runs on each (CPU, a tiny randomly initialised Llama).

The tokenizer is the embedded model's (SmolLM2, read from its GGUF by transformers) with TRL's ChatML template that
renders tools, tool calls and tool results (Qwen2.5's, whose special tokens are SmolLM2's own); SmolLM2's shipped
template drops tool calls, so with it a tool-calling rollout would train on empty assistant turns.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from nemo_gym.training.export import export_rollouts
from nemo_gym.training.export_config import ExportOptions
from tests.training.conftest import REPEATS, TASKS, WeatherRuns

pytest.importorskip("trl", reason="the train extra (torch, transformers, trl) is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    import trl
    from transformers import AutoTokenizer

    from nemo_gym.embedded_model import find_default_gguf  # the package's own __init__ needs llama-cpp-python

    gguf = find_default_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    return tokenizer


def tiny_model(tokenizer: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def common_args(output_dir: Path) -> dict[str, Any]:
    return {
        "output_dir": str(output_dir), "max_steps": 1, "per_device_train_batch_size": 2, "learning_rate": 1e-2,
        "report_to": [], "save_strategy": "no", "logging_steps": 1, "use_cpu": True, "max_length": 512,
        "dataloader_num_workers": 0, "seed": 0, "bf16": False,
    }  # fmt: skip


def train_one_step(trainer: Any) -> None:
    """Run the trainer and check that it took one step that changed the weights."""
    import torch

    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 1
    changed = [name for name, p in trainer.model.named_parameters() if not torch.equal(before[name], p.detach())]
    assert changed, "one training step changed no weight"


def test_sft_export_trains_one_step_in_sfttrainer(weather_runs: WeatherRuns, tokenizer: Any, tmp_path: Path) -> None:
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    output = tmp_path / "sft.jsonl"
    inputs = (weather_runs.with_tool, weather_runs.without_tool)
    stats = export_rollouts(ExportOptions(inputs=inputs, output=output, format="sft", show_progress=False))
    assert stats.rows_written == TASKS * REPEATS and stats.filtered == {"below_min_reward": TASKS * REPEATS}

    dataset = load_dataset("json", data_files=str(output), split="train", cache_dir=str(tmp_path / "hf"))
    trainer = SFTTrainer(
        model=tiny_model(tokenizer), args=SFTConfig(**common_args(tmp_path / "sft")), train_dataset=dataset,
        processing_class=tokenizer,
    )  # fmt: skip
    text = tokenizer.decode(trainer.train_dataset[0]["input_ids"])
    schemas = text.split("<tools>\n")[1].split("\n</tools>")[0]  # rendered by the template into the system turn
    assert '"name": "get_weather"' in schemas and '"city"' in schemas, text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>" in text and "It is cold there." in text
    train_one_step(trainer)


def test_dpo_export_trains_one_step_in_dpotrainer(weather_runs: WeatherRuns, tokenizer: Any, tmp_path: Path) -> None:
    from datasets import load_dataset
    from trl import DPOConfig, DPOTrainer

    output = tmp_path / "dpo.jsonl"
    inputs = (weather_runs.without_tool, weather_runs.with_tool)
    stats = export_rollouts(ExportOptions(inputs=inputs, output=output, format="dpo", show_progress=False))
    assert stats.tasks == TASKS and stats.rows_written == TASKS  # best-worst: one pair per task

    dataset = load_dataset("json", data_files=str(output), split="train", cache_dir=str(tmp_path / "hf"))
    assert set(dataset["chosen_reward"]) == {1.0} and set(dataset["rejected_reward"]) == {0.0}
    model = tiny_model(tokenizer)
    trainer = DPOTrainer(
        model=model,
        ref_model=copy.deepcopy(model),
        args=DPOConfig(**common_args(tmp_path / "dpo")),
        train_dataset=dataset,
        processing_class=tokenizer,
    )  # fmt: skip  (a model built here has no path for TRL to load the reference from)
    row = trainer.train_dataset[0]
    assert "get_weather" in tokenizer.decode(row["prompt_ids"])  # the tools, in the shared prompt
    assert "<tool_call>" in tokenizer.decode(row["chosen_ids"])
    assert "<tool_call>" not in tokenizer.decode(row["rejected_ids"])
    train_one_step(trainer)
