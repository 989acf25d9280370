"""Per-task scripts for the scripted model from an environment's own data, so a load test's rollouts do the
environment's real work (code_gen's answers carry code that its sandbox runs) instead of one fixed reply: the
``data/example_scripts.jsonl`` an environment ships (a ``scripts_file`` already), else its example rollouts replayed
(the model's recorded turns)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_gym.jsonl import JsonlWriter, iter_jsonl

EXAMPLE_ROLLOUTS = "example_rollouts.jsonl"
EXAMPLE_SCRIPTS = "example_scripts.jsonl"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _match(rollout: dict[str, Any]) -> str:
    """The last user message of the rollout's input: what the scripted model finds in its requests."""
    items = (rollout.get("responses_create_params") or {}).get("input")
    if isinstance(items, str):
        return items
    users = [
        _text(item.get("content")) for item in items or [] if isinstance(item, dict) and item.get("role") == "user"
    ]
    return users[-1] if users else ""


def _turns(rollout: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The model's output split into turns: a tool's output ends a turn. Only what the script format holds is kept:
    function calls and assistant messages (ids and statuses are filled in by the scripted model)."""
    turns: list[list[dict[str, Any]]] = [[]]
    for item in (rollout.get("response") or {}).get("output") or []:
        kind = item.get("type")
        if kind == "function_call_output":
            if turns[-1]:
                turns.append([])
        elif kind == "function_call":
            turns[-1].append({"type": "function_call", "name": item["name"], "arguments": item["arguments"]})
        elif kind == "message" and item.get("role") == "assistant":
            text = _text(item.get("content"))
            turns[-1].append(
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
            )
    return [turn for turn in turns if turn]


def write_scripts(data_dirs: list[Path], output: Path) -> int:
    """Write a ``scripts_file`` from the example scripts or rollouts in ``data_dirs``; the number of scripts written."""
    written = 0
    with JsonlWriter(output, append=False) as writer:
        for data_dir in data_dirs:
            if (data_dir / EXAMPLE_SCRIPTS).is_file():
                for _, script in iter_jsonl(data_dir / EXAMPLE_SCRIPTS):
                    writer.write(script)
                    written += 1
                continue
            path = data_dir / EXAMPLE_ROLLOUTS
            if not path.is_file():
                continue
            for _, rollout in iter_jsonl(path):
                match, turns = _match(rollout), _turns(rollout)
                if match and turns:
                    writer.write({"match": match, "script": turns})
                    written += 1
    if not written:
        output.unlink(missing_ok=True)
    return written
