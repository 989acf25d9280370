"""Turning dataset rows into the exact list of rollouts to run.

Every input row becomes ``num_repeats`` rollout rows, each stamped with

* ``agent_ref``: the agent that serves it (the row's own, else ``--agent``);
* ``_ng_task_index``: a stable identity of the task — the row's own if given, else the position of the first row with
  the same content (rows are compared as canonical JSON, so key order and whitespace do not matter);
* ``_ng_rollout_index``: 0..n-1 among the rollouts of one task.

The rows are written to ``<stem>_materialized_inputs.jsonl`` before any rollout starts; every line is checked first
(valid JSON, valid ``responses_create_params``, an agent), and every problem is reported as ``file:line: reason``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from nemo_gym.config.datasets import AGENT_REF_KEY
from nemo_gym.errors import ConfigError
from nemo_gym.jsonl import iter_jsonl
from nemo_gym.rollouts.outputs import materialized_inputs_path as materialized_inputs_path  # re-exported
from nemo_gym.row_fields import ATTEMPT_INDEX_KEY as ATTEMPT_INDEX_KEY  # re-exported for the collector
from nemo_gym.row_fields import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY

if TYPE_CHECKING:
    from collections.abc import Callable

    from nemo_gym.datasets.validation import CheckedParams

MAX_REPORTED_PROBLEMS = 20


@dataclass
class MaterializeOptions:
    input_path: Path
    output_path: Path
    agent_name: str | None = None
    limit: int | None = None
    num_repeats: int | dict[str, int] = 1
    responses_create_params: dict[str, Any] = field(default_factory=dict)
    """Shallow-merged over each row's ``responses_create_params`` (e.g. temperature)."""
    num_repeats_add_seed: bool = False
    known_agents: list[str] | None = None
    resume_fingerprint: str | None = None
    """The fingerprint of the run ``--resume`` continues: different rows are refused before any file is replaced
    (and so before any server starts)."""
    checked_params: CheckedParams | None = None
    """Verdicts on the input's create params reached before the run started (see ``forked_check.py``): used for the
    lines they cover when they hold for this input and its overrides, so those rows are not validated twice."""


@dataclass
class Materialized:
    path: Path
    num_rows: int
    num_tasks: int
    rollouts_per_agent: dict[str, int]
    fingerprint: str
    """Hash of the materialized rows: resume refuses to continue a run whose inputs changed."""


def resume_refused(output_path: Path) -> ConfigError:
    return ConfigError(
        f"cannot resume {output_path}: the materialized inputs differ from the run being resumed (input data, "
        "limit, repeats or parameter overrides changed). Use a new --output, or delete the old files"
    )


def _repeats_for(options: MaterializeOptions, agent: str) -> int:
    if isinstance(options.num_repeats, int):
        return options.num_repeats
    if agent in options.num_repeats:
        return int(options.num_repeats[agent])
    return int(options.num_repeats.get("_default", 1))


def _check(options: MaterializeOptions) -> None:
    if options.limit is not None and options.limit < 1:
        raise ConfigError(f"limit must be at least 1 (or unset for all rows), got {options.limit}")
    repeats = options.num_repeats.values() if isinstance(options.num_repeats, dict) else [options.num_repeats]
    if any(int(n) < 1 for n in repeats):
        raise ConfigError(f"num_repeats must be at least 1, got {options.num_repeats}")
    if isinstance(options.num_repeats, dict) and options.known_agents is not None:
        unknown = sorted(set(options.num_repeats) - set(options.known_agents) - {"_default"})
        if unknown:
            raise ConfigError(f"num_repeats names agents that are not defined: {', '.join(unknown)}")


def _agent_of(row: dict[str, Any], options: MaterializeOptions) -> str | None:
    ref = row.get(AGENT_REF_KEY)
    if isinstance(ref, dict) and isinstance(ref.get("name"), str):
        return ref["name"]
    if isinstance(ref, str):
        return ref
    if options.agent_name is not None:
        return options.agent_name
    if options.known_agents is not None and len(options.known_agents) == 1:
        return options.known_agents[0]  # one agent in the config: there is nothing to choose
    return None


def _params_checker(options: MaterializeOptions) -> Callable[[int, Any], str | None]:
    """``(line number, create params) -> problem or None``, from the verdicts reached ahead where they hold."""
    from nemo_gym.datasets.validation import create_params_problem  # the Responses models: ~45 ms to import

    overrides = options.responses_create_params
    known = options.checked_params.problems_for(options.input_path, overrides) if options.checked_params else []

    def params_problem(number: int, params: Any) -> str | None:
        if number <= len(known):
            return known[number - 1]
        return create_params_problem(params, overrides)

    return params_problem


def _row_problems(
    number: int, row: dict[str, Any], options: MaterializeOptions, params_problem: Callable[[int, Any], str | None]
) -> list[tuple[int, str]]:
    """What is wrong with one input row, as ``(line, problem)`` pairs (none for a row that can run)."""
    problems = []
    problem = params_problem(number, row.get("responses_create_params"))
    if problem is not None:
        problems.append((number, problem))
    agent = _agent_of(row, options)
    if agent is None:
        known = f" (agents in the config: {', '.join(sorted(options.known_agents))})" if options.known_agents else ""
        problems.append((number, f"no agent_ref in the row; pass --agent NAME (or +agent_name=NAME){known}"))
    elif options.known_agents is not None and agent not in options.known_agents:
        known = ", ".join(sorted(options.known_agents)) or "none"
        problems.append((number, f"agent {agent!r} is not defined in the config (agents: {known})"))
    return problems


def _problem_report(path: Path, problems: list[tuple[int, str]], stopped: bool) -> str:
    """One line: each distinct problem once, as ``file:line: problem``, with the other lines it occurs on."""
    lines_of: dict[str, list[int]] = {}
    for number, message in problems:
        lines_of.setdefault(message, []).append(number)
    parts = []
    for message, numbers in lines_of.items():
        also = ""
        if len(numbers) > 1:
            shown = ", ".join(str(n) for n in numbers[1:6])
            also = f" (also line{'s' if len(numbers) > 2 else ''} {shown}{', …' if len(numbers) > 6 else ''})"
        parts.append(f"{path}:{numbers[0]}: {message}{also}")
    if stopped:
        parts.append(f"… (stopped after {MAX_REPORTED_PROBLEMS} problems)")
    return f"{len(problems)} problem(s) in {path}: " + " | ".join(parts)


class _Rollouts:
    """Turns input rows, in order, into their rollout rows: task identity and rollout numbering across the file."""

    def __init__(self, options: MaterializeOptions) -> None:
        self.options = options
        self.task_ids: dict[bytes, int] = {}
        self.next_rollout: dict[int, int] = {}

    def of(self, row: dict[str, Any], agent: str) -> Iterator[dict[str, Any]]:
        options = self.options
        row = dict(row)
        row[AGENT_REF_KEY] = {"type": "responses_api_agents", "name": agent}
        row["responses_create_params"] = row["responses_create_params"] | options.responses_create_params
        if TASK_INDEX_KEY in row:
            task = int(row[TASK_INDEX_KEY])
        else:
            identity = hashlib.blake2b(orjson.dumps(row, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()
            task = self.task_ids.setdefault(identity, len(self.task_ids))
        for _ in range(_repeats_for(options, agent)):
            rollout = self.next_rollout.get(task, 0)
            self.next_rollout[task] = rollout + 1
            # Rollouts of a row share its nested values (nothing below changes them): a shallow copy each, except
            # the create params that _add_seed edits.
            copy = row | {TASK_INDEX_KEY: task, ROLLOUT_INDEX_KEY: rollout}
            if options.num_repeats_add_seed:
                copy["responses_create_params"] = dict(row["responses_create_params"])
                _add_seed(copy, rollout)
            yield copy


def iter_materialized(options: MaterializeOptions) -> Iterator[dict[str, Any]]:
    """The rollout rows of a checked input, in order."""
    rollouts = _Rollouts(options)
    for _, row in iter_jsonl(options.input_path, options.limit):
        agent = _agent_of(row, options)
        assert agent is not None, "rows without an agent are rejected before rows are materialized"
        yield from rollouts.of(row, agent)


def _add_seed(row: dict[str, Any], seed: int) -> None:
    """Put ``seed`` into ``metadata.extra_body`` (a JSON string, as the Responses API keeps metadata values strings)."""
    params = row["responses_create_params"]
    metadata = dict(params.get("metadata") or {})
    extra = orjson.loads(metadata.get("extra_body") or "{}")
    extra["seed"] = seed
    metadata["extra_body"] = orjson.dumps(extra).decode()
    params["metadata"] = metadata


def materialize(options: MaterializeOptions) -> Materialized:
    """Check every input row, then write the materialized rows; returns counts and a fingerprint.

    One pass over the input: rows are checked and written to a temporary file together, and the file takes its place
    only when every row passed (a problem is reported with all the others, and the temporary file removed).
    """
    _check(options)
    params_problem = _params_checker(options)  # the collector imports this module too: models loaded only here
    path = materialized_inputs_path(options.output_path)
    digest = hashlib.blake2b(digest_size=16)
    per_agent: dict[str, int] = {}
    tasks: set[int] = set()
    count = 0
    problems: list[tuple[int, str]] = []
    stopped = False
    rollouts = _Rollouts(options)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.parent.mkdir(parents=True, exist_ok=True)
    try:
        with temporary.open("wb") as out:  # buffered: the file is whole once it is renamed, not before
            for number, row in iter_jsonl(options.input_path, options.limit):
                found = _row_problems(number, row, options, params_problem)
                if found or problems:
                    problems.extend(found)
                    if len(problems) >= MAX_REPORTED_PROBLEMS:
                        stopped = True
                        break
                    continue
                agent = _agent_of(row, options)
                assert agent is not None, "a row without an agent is a problem above"
                for rollout in rollouts.of(row, agent):
                    out.write(orjson.dumps(rollout, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY))
                    digest.update(orjson.dumps(rollout, option=orjson.OPT_SORT_KEYS))
                    per_agent[agent] = per_agent.get(agent, 0) + 1
                    tasks.add(rollout[TASK_INDEX_KEY])
                    count += 1
        if problems:
            raise ConfigError(_problem_report(options.input_path, problems, stopped))
        fingerprint = digest.hexdigest()
        if options.resume_fingerprint is not None and options.resume_fingerprint != fingerprint:
            raise resume_refused(options.output_path)  # the resumed run's own materialized inputs stay as they were
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    temporary.replace(path)
    return Materialized(path, count, len(tasks), per_agent, fingerprint)


def rollout_key(row: dict[str, Any]) -> tuple[int, int]:
    return int(row[TASK_INDEX_KEY]), int(row[ROLLOUT_INDEX_KEY])
