"""Realistic rollout rows for the health-check benchmark: what ``gym eval run`` writes with capture on.

Each row is a multi-turn tool-use rollout: the request (system, user, a tool), the final response (reasoning, three
``get_weather`` calls with their outputs, the answer, usage), reward and verifier fields, the merged model-call capture
(``ng_model_call_capture``: per-call metadata and token counts) and the canonical ``ng_trajectory``: one agent
invocation, a turn per model call naming its call, each captured call with its request and response bodies, and the
tool calls. About one rollout in 50 has a problem a check names (a hollow last turn, or a failed last call), so both
the clean path and the findings path are timed.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import orjson

WORDS = ("weather cold warm rain city forecast wind humidity tomorrow sunny cloud the a is in of and to call tool "
         "answer temperature degrees north south report check user asks model").split()  # fmt: skip
MODEL = {"type": "responses_api_models", "name": "policy_model"}
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALLS = 4
"""Model calls per rollout: three tool calls, then the answer."""


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _message(text: str, number: int) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": f"msg_{number}", "role": "assistant", "status": "completed", "content": content}


def make_row(k: int, rng: random.Random, salt: int = 0) -> dict[str, Any]:
    """Rollout ``k``: task ``k // 4``, repeat ``k % 4``; ``salt`` changes which rollouts pass (another run)."""
    task, repeat, city = k // 4, k % 4, f"City{k // 4}"
    rollout_id, started = f"{task}-{repeat}", 1.8e9 + k
    hollow, failed = k % 50 == 7, k % 50 == 31
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant. Use the get_weather tool to look up the weather."},
        {"role": "user", "content": f"What is the weather in {city} right now?"},
    ]
    output: list[dict[str, Any]] = [
        {"type": "reasoning", "id": f"rs_{k}", "summary": [{"type": "summary_text", "text": _text(rng, 15)}]}
    ]
    turns, calls, tool_calls, capture = [], [], [], []
    for c in range(CALLS):
        last = c == CALLS - 1
        response_id, call_id = f"resp_{k}_{c}", f"mc_{k}_{c}"
        if last:
            items = [_message("" if hollow else _text(rng, 30), k)]
        else:
            arguments = json.dumps({"city": city, "day": c})
            items = [{"type": "function_call", "call_id": f"call_{k}_{c}", "name": "get_weather",
                      "id": f"fc_{k}_{c}", "arguments": arguments, "status": "completed"}]  # fmt: skip
        status = 500 if failed and last else 200
        tokens_in, tokens_out = 300 + 60 * c, 20 + 10 * c
        body = {"id": response_id, "object": "response", "model": "bench", "status": "completed", "output": items,
                "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out}}  # fmt: skip
        metadata = {"response_id": response_id, "model_ref": MODEL, "model": "bench", "dialect": "responses",
                    "status_code": status, "response_status": "completed", "finish_reason": None,
                    "error_category": "server_error" if status >= 500 else None, "latency_ttft_ms": 120.5}  # fmt: skip
        counts = {"prompt_tokens": tokens_in, "completion_tokens": tokens_out, "reasoning_tokens": 0,
                  "total_tokens": tokens_in + tokens_out, "cached_tokens": 0}  # fmt: skip
        calls.append({"model_call_id": call_id, "started_at": started + c, "completed_at": started + c + 0.5,
                      "duration_ms": 500.0, "request": {"model": "bench", "input": list(history), "tools": [TOOL]},
                      "response": body if status < 400 else None, "response_metadata": metadata,
                      "token_stats": counts})  # fmt: skip
        capture.append({"model_call_id": call_id, "response_id": response_id, "call_index": c, "model_ref": MODEL,
                        "status_code": status, "tokens_in": tokens_in, "tokens_out": tokens_out,
                        "started_at": started + c, "completed_at": started + c + 0.5})  # fmt: skip
        turns.append({"invocation_id": "root", "task_id": str(task), "rollout_id": rollout_id, "turn_no": c + 1,
                      "timestamp": started + c + 0.5, "question": None, "answer": items, "reasoning_content": None,
                      "resolved": None, "step_count": c + 1,
                      "model_calls": [{"model_call_id": None, "model_ref": MODEL, "response_id": response_id}]})  # fmt: skip
        output.extend(items)
        history.extend(items)
        if not last:
            result = {"type": "function_call_output", "call_id": f"call_{k}_{c}",
                      "output": json.dumps({"city": city, "weather_description": _text(rng, 10)})}  # fmt: skip
            output.append(result)
            history.append(result)
            tool_calls.append({"kind": "tool_call", "invocation_id": "root", "tool_call_id": f"call_{k}_{c}",
                               "tool_name": "get_weather", "started_at": started + c + 0.5,
                               "completed_at": started + c + 0.6, "status": "completed",
                               "output": result["output"]})  # fmt: skip
    prompt = sum(300 + 60 * c for c in range(CALLS))
    completion = sum(20 + 10 * c for c in range(CALLS))
    return {
        "responses_create_params": {"input": history[:2], "tools": [TOOL], "temperature": 0.2},
        "response": {
            "id": f"resp_{k}",
            "object": "response",
            "model": "bench",
            "status": "completed",
            "output": output,
            "usage": {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion},
        },  # fmt: skip
        "reward": float(((k + salt) * 2654435761) % 7 < 4),
        "extracted_city": city,
        "agent_ref": {"type": "responses_api_agents", "name": "weather_simple_agent"},
        "_ng_task_index": task,
        "_ng_rollout_index": repeat,
        "ng_trajectory": {
            "schema_version": "1.0",
            "task_id": str(task),
            "rollout_id": rollout_id,
            "invocations": [
                {
                    "kind": "agent_invocation",
                    "invocation_id": "root",
                    "status": "completed",
                    "model_calls": [],
                    "conversation": [],
                }
            ],
            "turns": turns,
            "model_calls": calls,
            "tool_calls": tool_calls,
            "gaps": [],
        },  # fmt: skip
        "ng_model_call_capture": {"rollout_id": rollout_id, "metrics": {"num_calls": CALLS}, "calls": capture},
    }


def write_rollouts(path: Path, rows: int, seed: int = 11, salt: int = 0) -> int:
    """Write ``rows`` rollouts to ``path``; returns its size in bytes."""
    rng = random.Random(seed)
    with path.open("wb") as out:
        for k in range(rows):
            out.write(orjson.dumps(make_row(k, rng, salt)) + b"\n")
    return path.stat().st_size
