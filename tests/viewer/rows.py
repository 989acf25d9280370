"""Rollout rows shaped as `gym eval run` writes them, for the viewer's tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

AGENT = {"type": "responses_api_agents", "name": "weather_simple_agent"}


def rollout(task: int, rollout_index: int, reward: float, answer: str, tool_calls: int = 1) -> dict[str, Any]:
    """A weather rollout: ``tool_calls`` get_weather calls and their outputs, then ``answer`` as the final message."""
    output: list[dict[str, Any]] = [{"type": "reasoning", "id": f"rs_{task}", "summary": [
        {"type": "summary_text", "text": f"The user asks about city {task}; call the tool."}]}]  # fmt: skip
    for k in range(tool_calls):
        call_id = f"call_{task}_{rollout_index}_{k}"
        output.append({"type": "function_call", "call_id": call_id, "name": "get_weather",
                       "arguments": json.dumps({"city": f"City{task}"}), "status": "completed"})  # fmt: skip
        output.append({"type": "function_call_output", "call_id": call_id,
                       "output": json.dumps({"city": f"City{task}", "weather_description": "cold"})})  # fmt: skip
    output.append({"type": "message", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": answer, "annotations": []}]})  # fmt: skip
    return {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "Use the get_weather tool."},
                {"role": "user", "content": f"What is the weather in City{task}?"},
            ]
        },  # fmt: skip
        "response": {
            "id": f"resp_{task}_{rollout_index}",
            "object": "response",
            "output": output,
            "usage": {"input_tokens": 100 + task, "output_tokens": 20 + len(answer)},
        },  # fmt: skip
        "reward": reward,
        "_ng_task_index": task,
        "_ng_rollout_index": rollout_index,
        "agent_ref": AGENT,
        "extracted_city": f"City{task}",
    }


def failure(task: int, failure_class: str, message: str) -> dict[str, Any]:
    return {"_ng_task_index": task, "_ng_rollout_index": 0, "agent_ref": AGENT,
            "_ng_failure_class": failure_class, "_ng_failure_message": message}  # fmt: skip


def write(path: Path, rows: list[dict[str, Any]], mode: str = "w") -> Path:
    with path.open(mode) as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def run_files(folder: Path, name: str, rewards: dict[int, float], failures: int = 0) -> Path:
    """``<name>.jsonl`` with one rollout per task, ``<name>_failures.jsonl`` and ``<name>_aggregate_metrics.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [rollout(task, 0, reward, "It is cold." if reward else "I don't know.", tool_calls=1 + (reward == 0))
            for task, reward in rewards.items()]  # fmt: skip
    path = write(folder / f"{name}.jsonl", rows)
    write(
        folder / f"{name}_failures.jsonl", [failure(100 + k, "timeout", "no answer in 60 s") for k in range(failures)]
    )
    mean = sum(rewards.values()) / max(len(rewards), 1)
    metrics = [{"agent_ref": AGENT, "agent_metrics": {"mean/reward": mean, "pass@1": mean, "num_rollouts": len(rows)},
                "key_metrics": {"mean/reward": mean, "pass@1": mean}, "group_level_metrics": []}]  # fmt: skip
    (folder / f"{name}_aggregate_metrics.json").write_text(json.dumps(metrics))
    return path


def with_turn(row: dict[str, Any], hollow: bool) -> dict[str, Any]:
    """``row`` with an ``ng_trajectory`` of one turn backed by its captured model call; a hollow turn says nothing."""
    task, index = row["_ng_task_index"], row["_ng_rollout_index"]
    usage = row["response"]["usage"]
    call = {
        "model_call_id": f"call-{task}",
        "response": {"output": []},
        "response_metadata": {"response_id": f"resp-{task}", "model_ref": {"type": "responses_api_models",
                              "name": "policy"}, "status_code": 200},
        "token_stats": {"prompt_tokens": usage["input_tokens"], "completion_tokens": usage["output_tokens"]},
    }  # fmt: skip
    answer = [] if hollow else row["response"]["output"][-1:]
    ids = {"task_id": str(task), "rollout_id": f"{task}-{index}"}
    turn = {"invocation_id": "root", **ids, "turn_no": 1, "timestamp": 1.0, "answer": answer, "step_count": 1,
            "model_calls": [{"model_call_id": f"call-{task}"}]}  # fmt: skip
    return row | {"ng_trajectory": {**ids, "turns": [turn], "model_calls": [call]}}
