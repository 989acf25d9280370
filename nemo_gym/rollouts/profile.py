"""``gym eval profile``: per-task reward profiles of a run, from its files alone.

The materialized inputs say which rollouts a run was meant to produce (``num_repeats`` per task); the rollouts file
says which it did. Both are aligned by (task, rollout). A profile line per task gives its pass rate (mean reward),
pass@k, statistics of every numeric field and each rollout's reward — what a curriculum or a dataset filter needs
("which tasks are always solved, which never"). Misaligned files are errors rather than quietly wrong profiles: a key
twice in either file, a rollout the inputs never asked for, or (unless ``allow_partial``) a missing rollout.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nemo_gym.config.datasets import AGENT_REF_KEY
from nemo_gym.errors import ConfigError
from nemo_gym.jsonl import JsonlWriter, iter_jsonl, write_json_atomic
from nemo_gym.metrics import aggregate_verify_responses, numeric_fields, pass_at_k, summarize_rows
from nemo_gym.rollouts.aggregate import agent_name_of, sort_grouped, strip_row
from nemo_gym.rollouts.collector import FAILURE_CLASS_KEY
from nemo_gym.rollouts.materialize import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY
from nemo_gym.rollouts.shards import Key, row_key_at

PROMPT_CHARS = 200
FIELD_JSON_CHARS = 500
"""A sample field whose JSON is longer than this is shortened: the profile describes tasks, it does not copy them."""
SUCCESS_THRESHOLD = 1.0
"""pass@k counts a rollout as solved when its reward reaches this."""
MAX_LISTED = 5


def reward_profiling_path(rollouts_path: Path) -> Path:
    return rollouts_path.with_name(f"{rollouts_path.stem}_reward_profiling.jsonl")


def agent_metrics_path(rollouts_path: Path) -> Path:
    return rollouts_path.with_name(f"{rollouts_path.stem}_agent_metrics.json")


def first_user_text(params: Any) -> str | None:
    """The text of the first user message of ``responses_create_params.input`` (a string input is that text)."""
    if not isinstance(params, dict):
        return None
    items = params.get("input")
    if isinstance(items, str):
        return items
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or item.get("role") != "user":
            continue
        content = item.get("content")
        if isinstance(content, str):
            return content
        texts = [p.get("text", "") for p in content or [] if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "\n".join(texts)
    return None


def shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def sample_summary(row: dict[str, Any]) -> dict[str, Any]:
    """What a task is, in brief: its prompt and its other public fields (long values shortened)."""
    prompt = first_user_text(row.get("responses_create_params"))
    summary: dict[str, Any] = {"prompt": shorten(prompt, PROMPT_CHARS) if prompt is not None else None}
    for key, value in row.items():
        if key.startswith("_") or key in ("responses_create_params", AGENT_REF_KEY):
            continue
        encoded = orjson.dumps(value)
        summary[key] = value if len(encoded) <= FIELD_JSON_CHARS else shorten(encoded.decode(), FIELD_JSON_CHARS)
    return summary


def pass_at_ks(rewards: list[float]) -> dict[str, float]:
    """pass@k of one task for k = 1, 2, 4, … and k = n (every rollout)."""
    n = len(rewards)
    solved = sum(r >= SUCCESS_THRESHOLD for r in rewards)
    ks = sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | ({n} if n else set()))
    return {f"pass@{k}": pass_at_k(n, solved, k) for k in ks}


@dataclass
class _Task:
    agent: str
    sample: dict[str, Any]
    expected: set[int] = field(default_factory=set)
    rollouts: dict[int, dict[str, Any]] = field(default_factory=dict)
    """rollout index -> stripped rollout row."""


@dataclass
class ProfileResult:
    profiling_path: Path
    agent_metrics_path: Path
    tasks: list[dict[str, Any]]
    """The profile lines, in task order."""
    expected_rollouts: int
    completed_rollouts: int
    complete_tasks: int
    partial_tasks: int
    missing_tasks: int
    missing_keys: list[Key]
    agent_metrics: list[dict[str, Any]]


def _read_inputs(path: Path) -> dict[int, _Task]:
    tasks: dict[int, _Task] = {}
    seen: dict[Key, int] = {}
    for line, row in iter_jsonl(path):
        key = row_key_at(row, f"{path}:{line}")
        if key in seen:
            raise ConfigError(
                f"{path}:{line}: (task {key[0]}, rollout {key[1]}) already appears at line {seen[key]}; the "
                "materialized inputs of one run have each key once"
            )
        seen[key] = line
        task = tasks.get(key[0])
        if task is None:
            task = tasks[key[0]] = _Task(agent_name_of(row), sample_summary(row))
        task.expected.add(key[1])
    if not tasks:
        raise ConfigError(f"{path} holds no rows")
    return tasks


def _read_rollouts(path: Path, tasks: dict[int, _Task]) -> int:
    """Attach every rollout to its task; returns the number of failure records skipped."""
    seen: dict[Key, int] = {}
    unknown: list[str] = []
    failures = 0
    for line, row in iter_jsonl(path):
        if row.get(FAILURE_CLASS_KEY):
            failures += 1
            continue
        key = row_key_at(row, f"{path}:{line}")
        if key in seen:
            raise ConfigError(f"{path}:{line}: (task {key[0]}, rollout {key[1]}) already appears at line {seen[key]}")
        seen[key] = line
        task = tasks.get(key[0])
        if task is None or key[1] not in task.expected:
            unknown.append(f"{path}:{line} (task {key[0]}, rollout {key[1]})")
            continue
        if not isinstance(row.get("reward"), (int, float)) or isinstance(row.get("reward"), bool):
            raise ConfigError(f"{path}:{line}: the rollout has no numeric reward")
        task.rollouts[key[1]] = strip_row(row)
    if unknown:
        listed = "; ".join(unknown[:MAX_LISTED]) + (
            f"; … {len(unknown) - MAX_LISTED} more" if len(unknown) > MAX_LISTED else ""
        )
        raise ConfigError(
            f"{len(unknown)} rollout(s) are not in the materialized inputs: {listed}. Profile a rollouts file with "
            "the inputs of the same run"
        )
    return failures


def _profile_line(index: int, task: _Task) -> dict[str, Any]:
    rows = [task.rollouts[r] for r in sorted(task.rollouts)]
    rewards = [float(row["reward"]) for row in rows]
    missing = sorted(task.expected - set(task.rollouts))
    line: dict[str, Any] = {
        TASK_INDEX_KEY: index,
        AGENT_REF_KEY: {"type": "responses_api_agents", "name": task.agent},
        "sample": task.sample,
        "num_rollouts": len(rows),
        "expected_num_rollouts": len(task.expected),
        "missing_num_rollouts": len(missing),
        "completion_pct": 100.0 * len(rows) / len(task.expected),
        "pass_rate": statistics.fmean(rewards) if rewards else None,
    }
    if missing:
        line["missing_rollout_indices"] = missing
    line |= pass_at_ks(rewards) | summarize_rows(rows)
    line["rollout_infos"] = [
        {"rollout_id": f"{index}:{row[ROLLOUT_INDEX_KEY]}", ROLLOUT_INDEX_KEY: row[ROLLOUT_INDEX_KEY]}
        | numeric_fields(row)
        for row in rows
    ]
    return line


def profile_rewards(inputs_path: Path, rollouts_path: Path, allow_partial: bool = False) -> ProfileResult:
    """Align inputs and rollouts, then write ``<rollouts stem>_reward_profiling.jsonl`` and ``_agent_metrics.json``."""
    tasks = _read_inputs(inputs_path)
    _read_rollouts(rollouts_path, tasks)
    missing_keys = [(t, r) for t, task in sorted(tasks.items()) for r in sorted(task.expected - set(task.rollouts))]
    expected = sum(len(task.expected) for task in tasks.values())
    if missing_keys and not allow_partial:
        listed = ", ".join(f"(task {t}, rollout {r})" for t, r in missing_keys[:MAX_LISTED])
        more = f", … {len(missing_keys) - MAX_LISTED} more" if len(missing_keys) > MAX_LISTED else ""
        raise ConfigError(
            f"{len(missing_keys)} of {expected} rollouts are missing from {rollouts_path}: {listed}{more}. Finish the "
            "run (`gym eval run ... --resume`), or pass --allow-partial to profile what is there"
        )
    lines = [_profile_line(index, task) for index, task in sorted(tasks.items())]
    profiling = reward_profiling_path(rollouts_path)
    temporary = profiling.with_name(f".{profiling.name}.tmp")
    with JsonlWriter(temporary, append=False) as writer:
        for line in lines:
            writer.write(line)
    temporary.replace(profiling)

    agent_metrics = _agent_metrics(tasks)
    metrics_path = agent_metrics_path(rollouts_path)
    write_json_atomic(metrics_path, agent_metrics)
    return ProfileResult(
        profiling_path=profiling,
        agent_metrics_path=metrics_path,
        tasks=lines,
        expected_rollouts=expected,
        completed_rollouts=expected - len(missing_keys),
        complete_tasks=sum(not (t.expected - set(t.rollouts)) for t in tasks.values()),
        partial_tasks=sum(bool(t.rollouts) and bool(t.expected - set(t.rollouts)) for t in tasks.values()),
        missing_tasks=sum(not t.rollouts for t in tasks.values()),
        missing_keys=missing_keys,
        agent_metrics=agent_metrics,
    )


def _agent_metrics(tasks: dict[int, _Task]) -> list[dict[str, Any]]:
    """Per agent: the default metrics over its rollouts, and how complete its part of the run is."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    expected: dict[str, int] = {}
    for task in tasks.values():
        grouped.setdefault(task.agent, []).extend(task.rollouts.values())
        expected[task.agent] = expected.get(task.agent, 0) + len(task.expected)
    entries = []
    for agent, rows in sorted(sort_grouped(grouped).items()):
        metrics = aggregate_verify_responses(rows) if rows else None
        entries.append(
            {
                AGENT_REF_KEY: {"type": "responses_api_agents", "name": agent},
                "agent_metrics": metrics.agent_metrics if metrics else {},
                "key_metrics": metrics.key_metrics if metrics else {},
                "expected_num_rollouts": expected[agent],
                "num_rollouts": len(rows),
            }
        )
    return entries


def print_profile(result: ProfileResult, console: Console, max_rows: int = 20) -> None:
    """The hardest tasks first (lowest pass rate; tasks with no rollouts last), then the completion summary."""
    ordered = sorted(
        result.tasks,
        key=lambda t: (t["pass_rate"] is None, t["pass_rate"] if t["pass_rate"] is not None else 0, t[TASK_INDEX_KEY]),
    )
    shown = ordered[:max_rows]
    title = f"Pass rate per task (hardest {len(shown)} of {len(ordered)})" if len(ordered) > len(shown) else None
    table = Table(title=title or "Pass rate per task", title_justify="left")
    cells = []
    for task in shown:
        n, rate = task["num_rollouts"], task["pass_rate"]
        cells.append(
            [
                str(task[TASK_INDEX_KEY]),
                task[AGENT_REF_KEY]["name"],
                f"{n}/{task['expected_num_rollouts']}",
                f"{rate:.3f}" if rate is not None else "-",
                f"{task[f'pass@{n}']:.3f}" if n else "-",
            ]
        )
    headers = ("Task", "Agent", "Rollouts", "Pass rate", "pass@n")
    for name in headers:
        table.add_column(name, justify="left" if name == "Agent" else "right", no_wrap=True)
    table.add_column("Prompt", no_wrap=True)
    # On a terminal the numbers keep their width and the prompt is cut to what is left of the window (3 = a cell's
    # padding and border); piped output is never cut to a width, so the prompt keeps its PROMPT_CHARS.
    used = sum(max(len(headers[i]), *(len(row[i]) for row in cells), 1) + 3 for i in range(len(headers))) + 4
    room = max(10, console.width - used) if console.is_terminal else PROMPT_CHARS
    for row, task in zip(cells, shown, strict=True):
        prompt = (task["sample"].get("prompt") or "").replace("\n", " ")
        table.add_row(*(escape(cell) for cell in row), escape(shorten(prompt, room)))
    console.print(table)
    pct = 100.0 * result.completed_rollouts / result.expected_rollouts if result.expected_rollouts else 0.0
    console.print(
        f"Rollouts: {result.completed_rollouts} of {result.expected_rollouts} expected ({pct:.1f}%). "
        f"Tasks: {result.complete_tasks} complete, {result.partial_tasks} partial, {result.missing_tasks} missing."
    )
