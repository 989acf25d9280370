"""``gym train grpo``: GRPO on an environment, on CPU, with the embedded SmolLM2-135M (``nemo_gym/training/grpo.py``)."""

from __future__ import annotations

import pathlib
import time

from nemo_gym.cli.command import Command, Invocation
from nemo_gym.cli.flags import CONFIG_FLAGS, Flag
from nemo_gym.cli.output import console, err_console
from nemo_gym.errors import ConfigError

TRAIN_FLAGS = (
    *CONFIG_FLAGS[:2],
    Flag(("--input", "-i"), "training rows (JSONL); default: the agent's dataset of type --split", metavar="PATH"),
    Flag(("--split",), "without --input: the agent's dataset of this type (default: train)", metavar="TYPE"),
    Flag(("--limit",), "only the first N rows", value_type=int, minimum=1, metavar="N"),
    Flag(("--model-path",), "checkpoint dir or GGUF to start from (default: the embedded SmolLM2-135M)",
         metavar="PATH"),
    Flag(("--output-dir", "-o"), "where metrics.jsonl, reward_curve.png and checkpoint/ go "
         "(default: results/train/<environment>-<time>)", metavar="DIR"),
    Flag(("--steps",), "GRPO steps (default 30)", value_type=int, minimum=1, metavar="N"),
    Flag(("--num-generations",), "rollouts per prompt, the GRPO group (default 4)", value_type=int, minimum=2,
         metavar="N"),
    Flag(("--prompts-per-step",), "prompts per step (default 2)", value_type=int, minimum=1, metavar="N"),
    Flag(("--learning-rate",), "default 5e-5", value_type=float, minimum=0, metavar="LR"),
    Flag(("--beta",), "KL penalty to the starting model (default 0.01; 0 skips the reference model)",
         value_type=float, minimum=0, metavar="BETA"),
    Flag(("--temperature",), "sampling temperature of the rollouts (default 0.9)", value_type=float, minimum=0,
         metavar="T"),
    Flag(("--max-output-tokens",), "tokens per model turn (default 48)", value_type=int, minimum=1, metavar="N"),
    Flag(("--seed",), "default 0", value_type=int, metavar="N"),
)  # fmt: skip


def grpo(invocation: Invocation) -> int:
    from nemo_gym.training.grpo import GRPOSettings, train_grpo

    environments = invocation.get("environment") or []
    if not environments and not invocation.get("config"):
        raise ConfigError("gym train grpo: name the environment to train on with --environment NAME (or --config)")
    name = environments[0] if environments else pathlib.Path(invocation.get("config")[0]).stem
    output = invocation.get("output_dir") or f"results/train/{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    defaults = GRPOSettings(overrides=[], output_dir=pathlib.Path(output))
    settings = GRPOSettings(
        overrides=list(invocation.overrides),
        output_dir=pathlib.Path(output),
        input_path=pathlib.Path(invocation.get("input")) if invocation.get("input") else None,
        split=invocation.get("split") or defaults.split,
        limit=invocation.get("limit"),
        model_path=invocation.get("model_path"),
        **{
            key: value
            for key in ("steps", "num_generations", "prompts_per_step", "learning_rate", "beta", "temperature",
                        "max_output_tokens", "seed")
            if (value := invocation.get(key)) is not None
        },
    )  # fmt: skip
    from tqdm import tqdm

    bar = tqdm(total=settings.steps, desc=f"GRPO {name}", unit="step", file=err_console.file)

    def on_step(entry: dict[str, float]) -> None:
        bar.update(int(entry["step"]) - bar.n)
        bar.set_postfix(reward=f"{entry.get('reward', 0.0):.3f}", kl=f"{entry.get('kl', 0.0):.4f}")

    try:
        summary = train_grpo(settings, on_step)
    finally:
        bar.close()
    console.print(f"checkpoint: {summary.checkpoint}", markup=False)
    console.print(f"metrics:    {summary.metrics_path}", markup=False)
    if summary.curve_path is not None:
        console.print(f"curve:      {summary.curve_path}", markup=False)
    console.print(
        "score it:   gym eval run --environment NAME --model-type hf_policy_model "
        f"+policy_model.responses_api_models.hf_policy_model.model_path={summary.checkpoint.resolve()} ...",
        markup=False,
    )
    return 0


COMMANDS = (
    Command(
        "train",
        "grpo",
        "GRPO on an environment on CPU (embedded SmolLM2-135M): metrics, reward curve, checkpoint",
        grpo,
        TRAIN_FLAGS,
        examples=("example: gym train grpo --environment my_env --steps 20",),
    ),
)
