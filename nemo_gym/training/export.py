"""``gym dataset export``: scored rollout files -> TRL-ready SFT or DPO datasets (JSONL).

**SFT** (``--format sft``): one row per rollout whose reward is at least ``--min-reward``, the whole conversation as
``{"messages": [...], "tools": "<JSON>"}`` (TRL's conversational language-modeling format; :mod:`.conversation`).

**DPO** (``--format dpo``): rollouts are grouped by task (``_ng_task_index``, which ``gym eval run`` stamps on every
repeat of one input row; several files of the same inputs can be given). Within a task, rollouts are ranked by reward
and paired: ``best-worst`` (default) pairs the highest with the lowest reward, one pair per task; ``all`` pairs every
two rollouts whose rewards differ. A pair is kept only when chosen's reward exceeds rejected's by more than zero
(ties are never pairs) and by at least ``--min-margin``. Rows are TRL's conversational preference format:
``{"prompt": [...], "chosen": [...], "rejected": [...], "tools": "<JSON>"}``; a rollout whose prompt differs from
the first rollout of its task (files of different inputs mixed) is a problem row.

Both add the rewards (``reward``; ``chosen_reward``, ``rejected_reward``) and ``task_index`` as plain columns, which
the trainers ignore. ``tools`` is a JSON string, not a list: every row of a dataset must have one Arrow schema, and
the tools' JSON schemas differ from environment to environment (TRL parses the string before the chat template).

**Filters** (counted, not problems): a response cut off at its token limit (``status: incomplete``) is left out
unless ``--keep-incomplete``: the chat template would close it as if the model had finished.

**Problem rows** (malformed JSON, no reward, no response, content a chat dataset cannot hold, a failure record, ...)
are skipped, counted by reason and reported as ``file:line: why``; the CLI then exits 3, as ``gym dataset collate``
does. With ``strict`` the first one stops the export (one line, exit 1) and nothing is written. The output is
written to a temporary file and renamed at the end, so a stopped export never leaves half a dataset; an existing
output is replaced only with ``overwrite``.

DPO keeps only each rollout's task, reward and byte span in memory, and reads the rollouts of the pairs back from
disk, so a large file needs memory for its index, not its rows.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from tqdm import tqdm

from nemo_gym.errors import ConfigError
from nemo_gym.jsonl import check_writable_output
from nemo_gym.rollouts.claim import OutputExistsError
from nemo_gym.row_fields import TASK_INDEX_KEY
from nemo_gym.training.conversation import Conversation, UnusableRollout, rollout_conversation
from nemo_gym.training.export_config import FORMATS, PAIR_MODES, ExportFormat, ExportOptions

INCOMPLETE = "incomplete"
BELOW_MIN_REWARD = "below_min_reward"


class UnusableRowError(ConfigError):
    """A rollout row the export cannot use, with ``strict``: ``file:line: why``."""


@dataclass
class ExportStats:
    """What an export read, kept, left out and why; ``problems`` are the ``file:line: why`` lines."""

    format: ExportFormat
    output: Path
    rows_read: int = 0
    filtered: Counter[str] = field(default_factory=Counter)
    problem_reasons: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    rows_written: int = 0
    kept_reward_sum: float = 0.0
    tasks: int = 0
    tasks_without_pair: Counter[str] = field(default_factory=Counter)
    chosen_reward_sum: float = 0.0
    rejected_reward_sum: float = 0.0

    @property
    def rows_usable(self) -> int:
        return self.rows_read - sum(self.problem_reasons.values())

    @property
    def mean_kept_reward(self) -> float | None:
        """SFT: the mean reward of the conversations written (None before any)."""
        return self.kept_reward_sum / self.rows_written if self.rows_written else None

    def lines(self) -> list[str]:
        """The statistics as the CLI prints them."""
        out = [
            f"read {self.rows_read} row(s): {self.rows_usable} usable, {sum(self.problem_reasons.values())} problem(s)"
        ]
        if self.problem_reasons:
            out.append("  problems: " + _counts(self.problem_reasons))
        if self.filtered:
            out.append("  left out: " + _counts(self.filtered))
        if self.format == "sft":
            mean = f", mean reward {self.mean_kept_reward:.4f}" if self.rows_written else ""
            out.append(f"wrote {self.rows_written} SFT conversation(s){mean} to {self.output}")
        else:
            out.append(f"{self.tasks} task(s), {self.tasks - sum(self.tasks_without_pair.values())} with a pair")
            if self.tasks_without_pair:
                out.append("  tasks without a pair: " + _counts(self.tasks_without_pair))
            if self.rows_written:
                n = self.rows_written
                chosen, rejected = self.chosen_reward_sum / n, self.rejected_reward_sum / n
                out.append(
                    f"  mean reward: chosen {chosen:.4f}, rejected {rejected:.4f}, margin {chosen - rejected:.4f}"
                )
            out.append(f"wrote {self.rows_written} DPO pair(s) to {self.output}")
        return out


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{key} {count}" for key, count in sorted(counter.items()))


def export_rollouts(options: ExportOptions) -> ExportStats:
    """Write the dataset ``options`` asks for; see the module docstring for what goes in and what does not."""
    _check_options(options)
    stats = ExportStats(format=options.format, output=options.output)
    temporary = options.output.with_name(f".{options.output.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("wb") as out:
            rows = _sft_rows(options, stats) if options.format == "sft" else _dpo_rows(options, stats)
            for row in rows:
                out.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
                stats.rows_written += 1
        os.replace(temporary, options.output)
    finally:
        temporary.unlink(missing_ok=True)
    return stats


def _check_options(options: ExportOptions) -> None:
    if options.format not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {options.format!r}")
    if options.pairs not in PAIR_MODES:
        raise ConfigError(f"--pairs must be one of {', '.join(PAIR_MODES)}, got {options.pairs!r}")
    if not options.inputs:
        raise ConfigError("--input is required: the rollouts file(s) written by `gym eval run`")
    for path in options.inputs:
        if not path.exists():
            raise ConfigError(f"--input {path} does not exist (give a rollouts .jsonl written by `gym eval run`)")
        try:
            path.open("rb").close()
        except OSError as e:
            raise ConfigError(f"--input {path}: cannot read it ({e.strerror or e})") from None
        if path.resolve() == options.output.resolve():
            raise ConfigError(f"--output {options.output} is also an --input; choose another output file")
    check_writable_output(options.output)
    if options.output.exists() and not options.overwrite:
        raise OutputExistsError(f"--output {options.output} already exists; pass --overwrite to replace it")


# -- reading ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Row:
    path: Path
    number: int
    offset: int
    length: int
    row: dict[str, Any]

    @property
    def where(self) -> str:
        return f"{self.path}:{self.number}"


def _read(options: ExportOptions, stats: ExportStats) -> Iterator[_Row]:
    """Every JSON object row of the inputs, in order, with a progress bar over their bytes. A line that is not a
    JSON object is a problem row."""
    total = sum(path.stat().st_size for path in options.inputs)
    disable = None if options.show_progress else True  # None: only on a terminal
    with tqdm(total=total, desc="Exporting", unit="B", unit_scale=True, disable=disable, dynamic_ncols=True) as bar:
        for path in options.inputs:
            offset = 0
            with path.open("rb") as f:
                for number, line in enumerate(f, start=1):
                    start, offset = offset, offset + len(line)
                    bar.update(len(line))
                    if not line.strip():
                        continue
                    stats.rows_read += 1
                    try:
                        row = orjson.loads(line)
                    except orjson.JSONDecodeError as e:
                        _problem(options, stats, f"{path}:{number}", "invalid_json", f"not valid JSON ({e})")
                        continue
                    if not isinstance(row, dict):
                        why = f"each line must be a JSON object, got {type(row).__name__}"
                        _problem(options, stats, f"{path}:{number}", "invalid_json", why)
                        continue
                    yield _Row(path, number, start, len(line), row)


def _problem(options: ExportOptions, stats: ExportStats, where: str, reason: str, message: str) -> None:
    if options.strict:
        raise UnusableRowError(f"{where}: {message}")
    stats.problem_reasons[reason] += 1
    stats.problems.append(f"{where}: {message}")


def _usable(options: ExportOptions, stats: ExportStats) -> Iterator[tuple[_Row, Conversation]]:
    """Rows that became conversations and passed the incomplete filter."""
    for row in _read(options, stats):
        try:
            conversation = rollout_conversation(row.row)
        except UnusableRollout as e:
            _problem(options, stats, row.where, e.reason, str(e))
            continue
        if conversation.incomplete and not options.keep_incomplete:
            stats.filtered[INCOMPLETE] += 1
            continue
        yield row, conversation


# -- SFT --------------------------------------------------------------------------------------------------------------


def _sft_rows(options: ExportOptions, stats: ExportStats) -> Iterator[dict[str, Any]]:
    for row, conversation in _usable(options, stats):
        if conversation.reward < options.min_reward:
            stats.filtered[BELOW_MIN_REWARD] += 1
            continue
        stats.kept_reward_sum += conversation.reward
        yield {
            "messages": conversation.messages,
            "tools": _tools_column(conversation),
            "reward": conversation.reward,
            "task_index": row.row.get(TASK_INDEX_KEY),
        }


def _tools_column(conversation: Conversation) -> str | None:
    return None if conversation.tools is None else orjson.dumps(conversation.tools).decode()


# -- DPO --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Candidate:
    """A usable rollout of a task, by reference: its reward and where to read it again."""

    reward: float
    path: Path
    offset: int
    length: int


def _dpo_rows(options: ExportOptions, stats: ExportStats) -> Iterator[dict[str, Any]]:
    tasks: dict[Any, list[_Candidate]] = defaultdict(list)
    first_of_task: dict[Any, tuple[str, str]] = {}  # task -> (prompt key, file:line of its first rollout)
    for row, conversation in _usable(options, stats):
        task = row.row.get(TASK_INDEX_KEY)
        if task is None or isinstance(task, bool) or not isinstance(task, int | str):
            why = f"no '{TASK_INDEX_KEY}': DPO pairs rollouts of one task; export rollouts written by `gym eval run`"
            _problem(options, stats, row.where, "missing_task_index", why)
            continue
        key = conversation.prompt_key()
        first_key, first_where = first_of_task.setdefault(task, (key, row.where))
        if key != first_key:
            why = (
                f"its prompt differs from {first_where}, the first rollout of task {task}: are these rollouts of "
                "different inputs? Export each run of other inputs on its own"
            )
            _problem(options, stats, row.where, "prompt_mismatch", why)
            continue
        tasks[task].append(_Candidate(conversation.reward, row.path, row.offset, row.length))
    stats.tasks = len(tasks)
    for task in sorted(tasks, key=lambda t: (isinstance(t, str), t)):
        pairs = list(_pairs(tasks[task], options))
        if not pairs:
            stats.tasks_without_pair[_why_no_pair(tasks[task])] += 1
            continue
        cache: dict[_Candidate, Conversation] = {}  # with --pairs all, one rollout is in several pairs
        for chosen, rejected in pairs:
            chosen_conversation, rejected_conversation = (_reread(c, cache) for c in (chosen, rejected))
            stats.chosen_reward_sum += chosen.reward
            stats.rejected_reward_sum += rejected.reward
            yield {
                "prompt": chosen_conversation.prompt,
                "chosen": chosen_conversation.completion,
                "rejected": rejected_conversation.completion,
                "tools": _tools_column(chosen_conversation),
                "chosen_reward": chosen.reward,
                "rejected_reward": rejected.reward,
                "task_index": task,
            }


def _pairs(candidates: list[_Candidate], options: ExportOptions) -> Iterator[tuple[_Candidate, _Candidate]]:
    """(chosen, rejected) pairs of one task: ranked by reward, first in the files first among equals."""
    ranked = sorted(candidates, key=lambda c: -c.reward)  # stable: file order among equal rewards

    def wide_enough(chosen: _Candidate, rejected: _Candidate) -> bool:
        margin = chosen.reward - rejected.reward
        return margin > 0 and margin >= options.min_margin

    if options.pairs == "best-worst":
        if len(ranked) >= 2 and wide_enough(ranked[0], ranked[-1]):
            yield ranked[0], ranked[-1]
        return
    for i, chosen in enumerate(ranked):
        for rejected in ranked[i + 1 :]:
            if wide_enough(chosen, rejected):
                yield chosen, rejected


def _why_no_pair(candidates: list[_Candidate]) -> str:
    if len(candidates) < 2:
        return "one_rollout"
    if len({c.reward for c in candidates}) == 1:
        return "all_rewards_equal"
    return "below_min_margin"


def _reread(candidate: _Candidate, cache: dict[_Candidate, Conversation]) -> Conversation:
    """The conversation of a candidate, read again from its span of the file."""
    if candidate not in cache:
        with candidate.path.open("rb") as f:
            f.seek(candidate.offset)
            cache[candidate] = rollout_conversation(orjson.loads(f.read(candidate.length)))
    return cache[candidate]
