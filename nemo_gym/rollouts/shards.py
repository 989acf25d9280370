"""``gym eval aggregate``: merge rollout shards and compute their metrics from the files alone.

A sharded run (several ``gym eval run --disable-aggregation`` jobs over parts of one dataset) leaves several rollout
files. This module expands the shard globs, reads every row once, refuses a (task, rollout) that appears twice (a
shard counted twice would silently skew every metric), writes one merged file ordered by (task, rollout), and
computes the aggregate metrics with the default statistics. Servers are needed only when asked for (``--servers``),
so an environment's own metric code can run.

Rows are never all held in memory: the index keeps where each row lives (file, byte offset, length) and the merged
file is written by re-reading the rows in key order. Only the small stripped rows used for metrics stay in memory.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym.errors import ConfigError
from nemo_gym.jsonl import iter_jsonl_spans
from nemo_gym.rollouts.aggregate import (
    agent_name_of,
    aggregate_metrics_path,
    compute_metrics,
    sort_grouped,
    strip_row,
    write_metrics,
)
from nemo_gym.rollouts.collector import FAILURE_CLASS_KEY
from nemo_gym.rollouts.counted_failures import counted_as_zero
from nemo_gym.rollouts.materialize import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY
from nemo_gym.rollouts.outputs import failures_path

SIDECAR_SUFFIXES = (
    "_failures.jsonl",
    "_materialized_inputs.jsonl",
    "_reward_profiling.jsonl",
)
"""Files a run writes beside its rollouts; a glob such as ``shard*.jsonl`` matches them too, but they hold no
rollouts, so they are skipped unless named literally."""

Key = tuple[int, int]


def row_key_at(row: dict[str, Any], where: str) -> Key:
    """The (task, rollout) key of a row, or a ConfigError naming ``where`` (``file:line``) when it has none."""
    try:
        return int(row[TASK_INDEX_KEY]), int(row[ROLLOUT_INDEX_KEY])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(
            f"{where}: a rollout row needs integer {TASK_INDEX_KEY} and {ROLLOUT_INDEX_KEY} (rows written by "
            "`gym eval run` have them)"
        ) from None


def split_globs(spec: str | Sequence[str]) -> list[str]:
    parts = spec.split(",") if isinstance(spec, str) else [str(p) for p in spec]
    return [p.strip() for p in parts if p.strip()]


@dataclass
class ShardSelection:
    paths: list[Path]
    skipped: list[Path] = field(default_factory=list)
    """Matched by a glob but left out: sidecar files and the output itself."""


def expand_globs(spec: str | Sequence[str], exclude: Sequence[Path] = ()) -> ShardSelection:
    """Files matching comma-separated globs, sorted and de-duplicated; a pattern matching no file is an error."""
    patterns = split_globs(spec)
    if not patterns:
        raise ConfigError("--input-glob is empty: give one or more globs, e.g. 'results/shard_*.jsonl'")
    excluded = {p.resolve() for p in exclude}
    found: dict[Path, Path] = {}
    skipped: dict[Path, Path] = {}
    unmatched = []
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        matches = [Path(m) for m in glob.glob(expanded, recursive=True) if os.path.isfile(m)]
        if not matches:
            unmatched.append(pattern)
        for match in matches:
            resolved = match.resolve()
            literal = not glob.has_magic(expanded)
            if resolved in excluded or (not literal and match.name.endswith(SIDECAR_SUFFIXES)):
                skipped.setdefault(resolved, match)
            else:
                found.setdefault(resolved, match)
    if unmatched:
        raise ConfigError(f"no file matches {', '.join(repr(p) for p in unmatched)} (--input-glob)")
    if not found:
        raise ConfigError(f"the globs {spec!r} match only sidecar or output files, no rollout shards")
    return ShardSelection(sorted(found.values()), sorted(set(skipped.values()) - set(found.values())))


class RowIndex:
    """Where every (task, rollout) row lives, so rows can be re-read in key order without holding them."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)
        self.spans: dict[Key, tuple[int, int, int, int]] = {}
        """key -> (file index, line number, byte offset, byte length)."""

    def add(self, file_index: int, line: int, offset: int, length: int, row: dict[str, Any]) -> Key:
        key = row_key_at(row, f"{self.paths[file_index]}:{line}")
        previous = self.spans.get(key)
        if previous is not None:
            first = f"{self.paths[previous[0]]}:{previous[1]}"
            raise ConfigError(
                f"rollout (task {key[0]}, rollout {key[1]}) appears twice: {first} and "
                f"{self.paths[file_index]}:{line}. Shards must not overlap; remove the duplicate file from the globs"
            )
        self.spans[key] = (file_index, line, offset, length)
        return key

    def __len__(self) -> int:
        return len(self.spans)

    def __contains__(self, key: object) -> bool:
        return key in self.spans

    def where(self, key: Key) -> str:
        file_index, line, _, _ = self.spans[key]
        return f"{self.paths[file_index]}:{line}"

    def write_sorted(self, output: Path) -> None:
        """Write every indexed line, byte for byte, ordered by (task, rollout); atomically replaces ``output``."""
        output.parent.mkdir(parents=True, exist_ok=True)
        temporary = output.with_name(f".{output.name}.tmp")
        files = [path.open("rb") for path in self.paths]
        try:
            with temporary.open("wb") as out:
                for key in sorted(self.spans):
                    file_index, _, offset, length = self.spans[key]
                    source = files[file_index]
                    source.seek(offset)
                    line = source.read(length)
                    out.write(line if line.endswith(b"\n") else line + b"\n")
            os.replace(temporary, output)
        finally:
            for f in files:
                f.close()
            temporary.unlink(missing_ok=True)


@dataclass
class AggregateResult:
    shards: list[Path]
    skipped: list[Path]
    num_rows: int
    skipped_failure_rows: int
    merged_path: Path | None
    metrics: list[dict[str, Any]]
    metrics_path: Path
    counted_failures: int = 0
    """Failed rollouts counted as reward 0 in the metrics (``count_failure_classes_as_zero``)."""


AgentUrls = Mapping[str, str] | Callable[[str], "str | None"]
"""Where each agent runs: a mapping, or a function of the agent's name (None: not running)."""


async def aggregate_shards(
    input_glob: str | Sequence[str],
    output: Path,
    merge: bool = True,
    agent_urls: AgentUrls | None = None,
    count_failure_classes_as_zero: Collection[str] = (),
) -> AggregateResult:
    """Merge the shards into ``output`` (unless ``merge`` is false) and write ``<output stem>_aggregate_metrics.json``.

    ``agent_urls`` makes each running agent compute its own metrics; without it the default metrics are computed
    here. ``count_failure_classes_as_zero`` adds the shards' failed rollouts of those classes to the metrics as zeros
    (``rollouts/counted_failures.py``), read from each shard's failures file.
    """
    output = output.expanduser().resolve()
    selection = expand_globs(input_glob, exclude=[output])
    index = RowIndex(selection.paths)
    grouped: dict[str, list[dict[str, Any]]] = {}
    failure_rows = 0
    for file_index, path in enumerate(selection.paths):
        for line, offset, length, row in iter_jsonl_spans(path):
            if row.get(FAILURE_CLASS_KEY):  # a failure record is not a rollout: never merged, never a metric
                failure_rows += 1
                continue
            index.add(file_index, line, offset, length, row)
            grouped.setdefault(agent_name_of(row), []).append(strip_row(row))
    sidecars = [failures_path(path) for path in selection.paths]
    counted = counted_as_zero(sidecars, count_failure_classes_as_zero, index.spans)
    for row in counted:
        grouped.setdefault(agent_name_of(row), []).append(strip_row(row))
    if not len(index) and not counted:
        raise ConfigError(f"the shards ({', '.join(str(p) for p in selection.paths)}) hold no rollout rows")
    if merge:
        index.write_sorted(output)
    urls = {a: u for a in grouped if (u := agent_urls(a))} if callable(agent_urls) else agent_urls
    metrics = await compute_metrics(sort_grouped(grouped), dict(urls) if urls is not None else None)
    metrics_path = aggregate_metrics_path(output)
    write_metrics(metrics_path, metrics)
    return AggregateResult(
        shards=selection.paths,
        skipped=selection.skipped,
        num_rows=len(index),
        skipped_failure_rows=failure_rows,
        merged_path=output if merge else None,
        metrics=metrics,
        metrics_path=metrics_path,
        counted_failures=len(counted),
    )
