"""``gym train grpo``: GRPO on one of our environments, on a laptop CPU, end to end.

The policy (by default the embedded SmolLM2-135M, read from the GGUF the embedded model ships) is loaded once and
served from a thread of this process as the config's ``policy_model`` (``policy_server.serve_policy``, on the port the
composer reserved for it), while the launcher starts the environment's resources server and agent as usual. TRL's
``GRPOTrainer`` then trains on whole agent episodes (``trl_adapters.AgentRollouts``): every step's rollouts run
through our servers against the weights the previous step left, and the rewards are our verifiers'.

Outputs, under ``--output-dir``: ``metrics.jsonl`` (one line per step), ``reward_curve.png`` and ``checkpoint/``, a
transformers checkpoint that ``hf_policy_model`` serves (``model_path``), so ``gym eval run`` scores it like any model.
"""

from __future__ import annotations

import json
import pathlib
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nemo_gym.errors import ConfigError, TrainingError
from nemo_gym.jsonl import iter_jsonl

__all__ = ["GRPOSettings", "GRPOSummary", "base_checkpoint", "plot_reward_curve", "policy_socket", "train_grpo"]

POLICY_INSTANCE = "policy_model"


@dataclass
class GRPOSettings:
    overrides: list[str]
    """The composed environment (``+config_paths=[...]`` and the user's own overrides)."""
    output_dir: pathlib.Path
    input_path: pathlib.Path | None = None
    """Training rows; empty: the agent's dataset of type ``split``."""
    split: str = "train"
    limit: int | None = None
    model_path: str | None = None
    """A checkpoint directory or GGUF file; empty: the embedded SmolLM2-135M GGUF."""
    steps: int = 30
    num_generations: int = 4
    prompts_per_step: int = 2
    learning_rate: float = 5e-5
    beta: float = 0.01
    temperature: float = 0.9
    max_output_tokens: int = 48
    seed: int = 0
    torch_threads: int | None = None
    external: list[str] = field(default_factory=lambda: [POLICY_INSTANCE])


@dataclass
class GRPOSummary:
    checkpoint: pathlib.Path
    metrics_path: pathlib.Path
    curve_path: pathlib.Path | None
    history: list[dict[str, float]]


def policy_socket() -> socket.socket:
    """The listening socket the composer reserved for ``policy_model``, for the in-process server to serve on.

    A duplicate: the launcher closes every reservation once its children have taken theirs over, and this one it
    never hands to a child.
    """
    from nemo_gym.config.ports import get_reservation

    reservation = get_reservation(POLICY_INSTANCE)
    if reservation is None:
        raise TrainingError(f"no port was reserved for {POLICY_INSTANCE!r}: compose the config with reserve_ports")
    return reservation.socket.dup()


def _require_train_extra() -> None:
    try:
        import matplotlib  # noqa: F401
        import torch  # noqa: F401
        import trl  # noqa: F401
    except ImportError as e:
        raise TrainingError(
            f"gym train grpo needs the 'train' extra (torch, transformers, trl, matplotlib): "
            f"pip install -e '.[train]' (missing: {e.name})"
        ) from e


def base_checkpoint(model_path: str | None, cache_dir: pathlib.Path) -> pathlib.Path:
    """A transformers checkpoint directory for ``model_path``: the directory itself, or a GGUF converted once into
    ``cache_dir`` (TRL loads its reference model from a directory, and a directory loads in a second)."""
    from nemo_gym.embedded_model import find_default_gguf
    from nemo_gym.training.policy import load_policy_model

    source = pathlib.Path(model_path) if model_path else find_default_gguf()
    if source.is_dir():
        return source
    target = cache_dir / "train" / source.stem
    if not (target / "config.json").is_file():
        model, tokenizer = load_policy_model(str(source))
        model.save_pretrained(target)
        tokenizer.save_pretrained(target)
    return target


def training_rows(settings: GRPOSettings, config: Any) -> tuple[str, list[dict[str, Any]]]:
    """The agent to train through and its rows: ``--input``, else the agent's dataset of type ``split``."""
    from nemo_gym.config.tree import plain_dict

    data = plain_dict(config)
    agents = [
        (name, inner)
        for name, block in data.items()
        if isinstance(block, dict) and isinstance(block.get("responses_api_agents"), dict)
        for inner in block["responses_api_agents"].values()
    ]
    if not agents:
        raise ConfigError("gym train grpo: the environment defines no agent (responses_api_agents) to run rollouts")
    agent, inner = agents[0]
    path = settings.input_path
    if path is None:
        datasets = [d for d in inner.get("datasets") or [] if d.get("type") == settings.split]
        if not datasets:
            raise ConfigError(
                f"gym train grpo: agent {agent!r} has no dataset of type {settings.split!r}; "
                "pass --input ROWS.jsonl or --split example"
            )
        path = pathlib.Path(datasets[0]["jsonl_fpath"])
    return agent, [row for _, row in iter_jsonl(path, settings.limit)]


def plot_reward_curve(history: list[dict[str, float]], path: pathlib.Path, title: str) -> pathlib.Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    rewards = [h.get("reward", 0.0) for h in history]
    figure, axis = plt.subplots(figsize=(6, 3.5), dpi=100)
    axis.plot(steps, rewards, marker="o", markersize=3, linewidth=1, label="mean reward per step")
    if len(rewards) >= 5:
        window = 5
        smooth = [sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
                  for i in range(len(rewards))]  # fmt: skip
        axis.plot(steps, smooth, linewidth=2, label=f"moving mean ({window} steps)")
    axis.set_xlabel("GRPO step")
    axis.set_ylabel("reward")
    axis.set_ylim(-0.05, 1.05)
    axis.set_title(title)
    axis.legend(loc="upper left")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def train_grpo(settings: GRPOSettings, on_step: Callable[[dict[str, float]], None] | None = None) -> GRPOSummary:
    """Run GRPO through the environment's servers; see the module docstring."""
    _require_train_extra()
    import torch
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from nemo_gym.config.compose import ComposeOptions, compose
    from nemo_gym.launcher import running_servers
    from nemo_gym.rollouts.run import agent_urls
    from nemo_gym.training.policy import HFPolicy
    from nemo_gym.training.policy_server import serve_policy
    from nemo_gym.training.trl_adapters import AgentRollouts, rollout_reward, rows_to_dataset

    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    policy_block = "{responses_api_models:{hf_policy_model:{entrypoint:app.py}}}"
    overrides = [*settings.overrides, f"++{POLICY_INSTANCE}={policy_block}"]
    composed = compose(ComposeOptions(overrides=overrides, reserve_ports=True, require_server_instances=True))
    agent, rows = training_rows(settings, composed.config)
    if not rows:
        raise ConfigError("gym train grpo: no training rows")
    output = settings.output_dir
    output.mkdir(parents=True, exist_ok=True)
    base = base_checkpoint(settings.model_path, pathlib.Path(str(composed.config.get("cache_dir") or "cache")))
    policy = HFPolicy.load(str(base))
    sock = policy_socket()
    metrics_path = output / "metrics.jsonl"
    metrics_path.write_text("")
    history: list[dict[str, float]] = []

    class Record(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
            if not logs or "reward" not in logs:
                return
            entry = {"step": float(state.global_step)} | {
                k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
            history.append(entry)
            with metrics_path.open("a") as sink:
                sink.write(json.dumps(entry) + "\n")
            if on_step is not None:
                on_step(entry)

    config = GRPOConfig(
        output_dir=str(output / "trainer"),
        max_steps=settings.steps,
        per_device_train_batch_size=settings.num_generations * settings.prompts_per_step,
        num_generations=settings.num_generations,
        max_completion_length=settings.max_output_tokens,
        learning_rate=settings.learning_rate,
        beta=settings.beta,
        temperature=settings.temperature,
        seed=settings.seed,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        disable_tqdm=True,
    )
    with serve_policy(policy, POLICY_INSTANCE, sock):
        with running_servers(config=composed, external=settings.external) as launcher:
            rollouts = AgentRollouts(
                agent_urls(launcher.composed)[agent],
                agent,
                rows,
                {"temperature": settings.temperature, "max_output_tokens": settings.max_output_tokens},
            )
            trainer = GRPOTrainer(
                model=policy.model,
                processing_class=policy.tokenizer,
                reward_funcs=rollout_reward,
                args=config,
                train_dataset=rows_to_dataset(rows),
                rollout_func=rollouts,
                callbacks=[Record()],
            )
            trainer.remove_callback(PrinterCallback)  # the progress bar and metrics.jsonl say it, once
            trainer.train()
    checkpoint = output / "checkpoint"
    policy.model.save_pretrained(checkpoint)
    policy.tokenizer.save_pretrained(checkpoint)
    curve = plot_reward_curve(history, output / "reward_curve.png", "GRPO reward") if history else None
    return GRPOSummary(checkpoint, metrics_path, curve, history)
