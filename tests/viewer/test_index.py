"""The line-offset index: summaries without keeping rows, appends followed, half-written lines held back."""

from __future__ import annotations

import json
from pathlib import Path

from nemo_gym.viewer.index import LineIndex
from nemo_gym.viewer.runs import Filters, Run
from tests.viewer import rows


def test_summaries_come_from_the_rows_and_rows_are_read_on_demand(tmp_path: Path) -> None:
    path = rows.write(
        tmp_path / "r.jsonl", [rows.rollout(3, 1, 0.0, "four", tool_calls=2), rows.rollout(4, 0, 1.0, "hi")]
    )
    index = LineIndex(path)
    assert index.refresh() == 2
    assert list(index.reward) == [0.0, 1.0] and list(index.task) == [3, 4] and list(index.rollout) == [1, 0]
    assert list(index.tool_calls) == [2, 1] and list(index.output_chars) == [4, 2]
    assert list(index.turns) == [3, 2]  # one turn per tool-calling step, plus the answer
    assert index.agent_name(0) == "weather_simple_agent"
    assert index.row(1)["response"]["id"] == "resp_4_0"


def test_appends_are_followed_and_a_half_written_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = rows.write(tmp_path / "r.jsonl", [rows.rollout(0, 0, 1.0, "a")])
    index = LineIndex(path)
    index.refresh()
    with path.open("a") as f:
        f.write('{"reward": 0.5, "_ng_task_')
    assert index.refresh() == 0 and len(index) == 1
    with path.open("a") as f:
        f.write('index": 7}\nnot json\n\n[1]\n')
    assert index.refresh() == 1
    assert index.task[1] == 7 and index.bad_lines == 2
    assert index.refresh() == 0


def test_a_file_replaced_by_a_shorter_one_is_indexed_again(tmp_path: Path) -> None:
    path = rows.write(tmp_path / "r.jsonl", [rows.rollout(k, 0, 1.0, "a") for k in range(3)])
    index = LineIndex(path)
    index.refresh()
    rows.write(path, [rows.rollout(9, 0, 0.0, "b")])
    index.refresh()
    assert list(index.task) == [9]


def test_filters_combine_and_failures_join_the_list(tmp_path: Path) -> None:
    path = rows.run_files(tmp_path, "run", {0: 1.0, 1: 0.0, 2: 0.0}, failures=2)
    run = Run(0, path)
    run.refresh()
    assert run.select(Filters(reward=0.0)) == [("r", 1), ("r", 2)]
    # failures are grouped by their kind (nemo_gym.failure_kinds): the class `timeout` is an `agent_timeout`
    assert run.select(Filters(failure="agent_timeout")) == [("f", 0), ("f", 1)]
    assert run.select(Filters(failure="timeout")) == []
    assert run.select(Filters(min_tools=2, task=2)) == [("r", 2)]
    assert run.select(Filters(text="COLD.")) == [("r", 0)]
    assert run.select(Filters(sort="reward", descending=True))[0] == ("r", 0)
    overview = run.overview()
    assert overview["failures_by_class"] == [("agent_timeout", 2)] and overview["rollouts"] == 3
    assert json.loads(path.with_name("run_aggregate_metrics.json").read_text()) == run.metrics()


def test_text_search_without_a_failures_file(tmp_path: Path) -> None:
    run = Run(0, rows.write(tmp_path / "alone.jsonl", [rows.rollout(0, 0, 1.0, "sunny")]))
    run.refresh()
    assert run.select(Filters(text="sunny")) == [("r", 0)]
