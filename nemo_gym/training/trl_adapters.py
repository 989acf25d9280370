"""Our environments inside TRL's ``GRPOTrainer``: reward functions backed by ``/verify``, and a rollout function that
runs whole agent episodes.

* :class:`VerifyReward` (single-turn environments): TRL generates, the resources server's ``/verify`` scores. Each
  dataset row keeps the gym row it came from (``row`` column, see :func:`rows_to_dataset`), so the verifier sees the
  same fields as in ``gym eval run``.
* :class:`AgentRollouts` (any environment, tools and several turns included): for each prompt, one ``POST /run`` on
  an agent server, whose model server is the policy being trained (``nemo_gym/training/policy_server.py``). From the
  token ids on the response's output items it builds what TRL's ``rollout_func`` contract asks for: the first turn's
  prompt ids, the completion ids (every later token), their log-probs, ``env_mask`` (1 where the model generated the
  token, 0 for tool outputs and template markup in between) and the ``reward`` the verifier gave, which
  :func:`rollout_reward` hands to TRL as the reward. Every rollout's token-id chain is checked first
  (``nemo_gym/training/drift.py``).

Both are plain callables, so they also work outside TRL.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nemo_gym.errors import TokenDriftError, TrainingError
from nemo_gym.rollouts.collector import RolloutFailure, run_rollout
from nemo_gym.training.drift import Turn, find_drift, turns_of
from nemo_gym.transport import http_client

__all__ = ["AgentRollouts", "RolloutTokens", "VerifyReward", "rollout_reward", "rollout_tokens", "rows_to_dataset"]

T = TypeVar("T")


class _Loop:
    """One event loop on a daemon thread: TRL calls us synchronously, our clients are async and pooled per loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="trl-adapters", daemon=True).start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()


_LOOP: _Loop | None = None


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    global _LOOP
    if _LOOP is None:
        _LOOP = _Loop()
    return _LOOP.run(coroutine)


def prompt_key(prompt: Any) -> str:
    """How a prompt is found again: TRL hands the rollout function only the prompts."""
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


def rows_to_dataset(rows: Sequence[dict[str, Any]]) -> Any:
    """A ``datasets.Dataset`` of gym rows: ``prompt`` (the row's input messages, for TRL) and ``row`` (the gym row as
    JSON, for the verifier)."""
    from datasets import Dataset  # type: ignore[import-untyped]

    return Dataset.from_list([{"prompt": rows_to_prompt(r), "row": json.dumps(r, ensure_ascii=False)} for r in rows])


def _text_response(text: str) -> dict[str, Any]:
    """A Responses API response holding one assistant message: what a model server would have answered."""
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "created_at": 0.0,
        "model": "policy",
        "object": "response",
        "output": [
            {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


class VerifyReward:
    """A TRL reward function: each completion, as the response to its row, scored by ``POST <resources>/verify``."""

    def __init__(self, resources_url: str, name: str = "verify") -> None:
        self.resources_url = resources_url.rstrip("/")
        self.__name__ = name  # TRL logs each reward function under its name

    def __call__(self, prompts: list[Any], completions: list[Any], row: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        return _run(self._verify_all([json.loads(r) for r in row], texts))

    async def _verify_all(self, rows: list[dict[str, Any]], texts: list[str]) -> list[float]:
        return list(await asyncio.gather(*(self._verify(r, t) for r, t in zip(rows, texts, strict=True))))

    async def _verify(self, row: dict[str, Any], text: str) -> float:
        body = {**row, "response": _text_response(text)}
        response = await http_client.request("POST", f"{self.resources_url}/verify", json=body, url_path="/verify")
        http_client.raise_for_status(response, "resources server", "/verify")
        return float((await http_client.response_json(response))["reward"])


@dataclass
class RolloutTokens:
    """One rollout as a trainer sees it (TRL's ``rollout_func`` fields)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    env_mask: list[int]
    reward: float
    turns: list[Turn] = field(default_factory=list)


def rollout_tokens(result: dict[str, Any], name: str = "rollout") -> RolloutTokens:
    """The tokens of one ``/run`` answer; a broken token-id chain is a :class:`TokenDriftError` naming turn and
    offset, and a response without token ids a :class:`TrainingError`."""
    turns = turns_of(result["response"]["output"])
    if not turns:
        raise TrainingError(
            f"{name}: the response carries no token ids; serve the policy with hf_policy_model (or a model server "
            "with return_token_id_information: true)"
        )
    drift = find_drift(turns)
    if drift is not None:
        raise TokenDriftError(drift.message(name))
    prompt = turns[0].prompt_ids
    completion: list[int] = []
    logprobs: list[float] = []
    mask: list[int] = []
    for turn in turns:
        inserted = turn.prompt_ids[len(prompt) + len(completion) :]  # tool outputs and markup since the last turn
        completion += inserted + turn.generation_ids
        logprobs += [0.0] * len(inserted) + turn.log_probs
        mask += [0] * len(inserted) + [1] * len(turn.generation_ids)
    return RolloutTokens(prompt, completion, logprobs, mask, float(result["reward"]), turns)


def rollout_reward(prompts: list[Any], completions: list[Any], reward: list[float], **_: Any) -> list[float | None]:
    """The TRL reward function that goes with :class:`AgentRollouts`: the verifier's reward, already in each rollout."""
    return [float(r) for r in reward]


class AgentRollouts:
    """A TRL ``rollout_func``: one agent episode (``POST <agent>/run``) per prompt, policy served by our model server.

    ``rows`` are the gym rows the training prompts came from (found again by their input messages); ``params`` are
    merged into each row's ``responses_create_params`` (temperature, max_output_tokens). ``drift_violations`` counts
    rollouts whose token-id chain broke; each one also raises, so a user never trains on such a rollout unawares.
    """

    def __init__(
        self, agent_url: str, agent_name: str, rows: Sequence[dict[str, Any]], params: dict[str, Any] | None = None
    ) -> None:
        self.agent_url = agent_url.rstrip("/")
        self.agent_name = agent_name
        self.params = dict(params or {})
        self.rows = {prompt_key(rows_to_prompt(row)): row for row in rows}
        self.drift_violations = 0
        self.rollouts = 0

    def __call__(self, prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        rows = []
        for prompt in prompts:
            row = self.rows.get(prompt_key(prompt))
            if row is None:
                raise TrainingError(f"no gym row has the prompt {prompt_key(prompt)[:200]}")
            params = {**row["responses_create_params"], **self.params}
            rows.append({**row, "responses_create_params": params})
        results = _run(self._run_all(rows))
        tokens = []
        for index, result in enumerate(results):
            if isinstance(result, RolloutFailure):
                raise TrainingError(f"rollout {self.rollouts + index}: {result.failure_class}: {result.message}")
            try:
                tokens.append(rollout_tokens(result, f"rollout {self.rollouts + index}"))
            except TokenDriftError:
                self.drift_violations += 1
                raise
        self.rollouts += len(results)
        return {
            "prompt_ids": [t.prompt_ids for t in tokens],
            "completion_ids": [t.completion_ids for t in tokens],
            "logprobs": [t.logprobs for t in tokens],
            "env_mask": [t.env_mask for t in tokens],
            "reward": [t.reward for t in tokens],
        }

    async def _run_all(self, rows: list[dict[str, Any]]) -> list[dict[str, Any] | RolloutFailure]:
        return list(await asyncio.gather(*(run_rollout(self.agent_url, self.agent_name, row) for row in rows)))


def rows_to_prompt(row: dict[str, Any]) -> Any:
    """A row's input messages, as :func:`rows_to_dataset` puts them in the ``prompt`` column."""
    messages = row["responses_create_params"]["input"]
    return [{"role": "user", "content": messages}] if isinstance(messages, str) else messages
