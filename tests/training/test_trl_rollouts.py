"""The TRL adapters over real servers: the weather environment's resources server and simple_agent as processes, the
policy server with the real SmolLM2-135M weights (from the GGUF the embedded model ships).

* ``test_rollout_function_returns_a_two_turn_tool_episode``: the policy server as its own process
  (``hf_policy_model``); the rollout function's ids, log-probs, masks and rewards have the right shapes, and the
  token-id chain of each rollout holds.
* ``test_one_grpo_step_changes_the_served_weights``: the policy served from this process (what ``gym train grpo``
  does), one GRPO step through TRL's ``GRPOTrainer`` with the rollout function.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("trl")

from nemo_gym.config.compose import ComposeOptions, compose
from nemo_gym.launcher import running_servers
from nemo_gym.rollouts.run import agent_urls
from nemo_gym.training.grpo import base_checkpoint, policy_socket
from nemo_gym.training.trl_adapters import AgentRollouts, rollout_reward, rows_to_dataset, rows_to_prompt

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model, pytest.mark.timeout(600)]

ROOT = pathlib.Path(__file__).resolve().parents[2]
WEATHER = ROOT / "resources_servers/example_single_tool_call"
AGENT = "example_single_tool_call_simple_agent"


@pytest.fixture(scope="module")
def base() -> pathlib.Path:
    return base_checkpoint(None, ROOT / "cache")


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    lines = (WEATHER / "data/example.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines[:1]]


def _overrides(tmp: pathlib.Path, policy: str) -> list[str]:
    return [
        f"+config_paths=[{WEATHER / 'configs/example_single_tool_call.yaml'}]",
        f"++policy_model={policy}",
        f"++results_dir={tmp / 'results'}",
        "++head_server.port=0",
        "++shared_venv=true",
    ]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory, base: pathlib.Path) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("standalone")
    policy = f"{{responses_api_models:{{hf_policy_model:{{entrypoint:app.py,model_path:'{base}',torch_threads:1}}}}}}"
    with running_servers(_overrides(tmp, policy), startup_timeout_s=300) as launcher:
        yield agent_urls(launcher.composed)[AGENT]


def test_rollout_function_returns_a_two_turn_tool_episode(standalone: str, rows: list[dict[str, Any]]) -> None:
    rollouts = AgentRollouts(standalone, AGENT, rows, {"temperature": 0.0, "max_output_tokens": 40})
    prompt = rows_to_prompt(rows[0])
    out = rollouts([prompt, prompt])  # TRL hands each prompt once per generation of its group

    assert set(out) == {"prompt_ids", "completion_ids", "logprobs", "env_mask", "reward"}
    assert all(len(out[key]) == 2 for key in out)
    for prompt_ids, completion, logprobs, mask, reward in zip(*(out[k] for k in out), strict=True):
        assert prompt_ids and all(isinstance(i, int) for i in prompt_ids)
        assert len(completion) == len(logprobs) == len(mask)
        model_turns = sum(1 for i, m in enumerate(mask) if m == 1 and (i == 0 or mask[i - 1] == 0))
        assert model_turns == 2  # the call, then the answer after the tool's result
        assert 0 in mask  # the tool output and the template's markup between the turns
        assert all(lp <= 0.0 for lp in logprobs) and all(
            lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 0
        )
        assert reward == 1.0
    assert rollouts.drift_violations == 0 and rollouts.rollouts == 2  # the drift check ran on both and passed


def test_one_grpo_step_changes_the_served_weights(
    tmp_path: pathlib.Path, base: pathlib.Path, rows: list[dict[str, Any]]
) -> None:
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from nemo_gym.training.policy import HFPolicy
    from nemo_gym.training.policy_server import serve_policy

    policy = HFPolicy.load(str(base))
    before = {name: p.detach().clone() for name, p in policy.model.named_parameters()}
    block = "{responses_api_models:{hf_policy_model:{entrypoint:app.py}}}"
    composed = compose(ComposeOptions(overrides=_overrides(tmp_path, block), reserve_ports=True))

    def reward_with_tiebreak(prompts: list[Any], completions: list[Any], reward: list[float], **kw: Any) -> list[float]:
        # The verifier's reward, plus a tiny length term so that a group always has an advantage to learn from.
        lengths = [len(kw["completion_ids"][i]) for i in range(len(reward))]
        return [r + 1e-3 * n for r, n in zip(rollout_reward(prompts, completions, reward), lengths, strict=True)]

    config = GRPOConfig(
        output_dir=str(tmp_path / "trainer"), max_steps=1, per_device_train_batch_size=2, num_generations=2,
        max_completion_length=40, learning_rate=1e-4, beta=0.0, temperature=1.0, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, bf16=False, gradient_checkpointing=False, disable_tqdm=True,
    )  # fmt: skip
    with serve_policy(policy, "policy_model", policy_socket()):
        with running_servers(config=composed, external=["policy_model"], startup_timeout_s=300) as launcher:
            rollouts = AgentRollouts(agent_urls(launcher.composed)[AGENT], AGENT, rows, {"max_output_tokens": 40})
            trainer = GRPOTrainer(
                model=policy.model, processing_class=policy.tokenizer, reward_funcs=reward_with_tiebreak,
                args=config, train_dataset=rows_to_dataset(rows), rollout_func=rollouts,
            )  # fmt: skip
            trainer.train()
    assert trainer.model is policy.model  # the server generates from the very object the trainer optimizes
    changed = [n for n, p in policy.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed
    assert rollouts.rollouts == 2 and rollouts.drift_violations == 0
