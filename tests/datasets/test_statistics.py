"""Streaming statistics, metrics comparison rules, and the optional tokenizer."""

from __future__ import annotations

import json
import math
import statistics as py_statistics

from nemo_gym.datasets import statistics as stats
from nemo_gym.datasets.metrics_file import compare_metrics, reconcile_metrics_file
from nemo_gym.datasets.statistics import DatasetStatistics, RunningStats, round_metric
from nemo_gym.datasets.validation import create_params_problem, iter_checked_lines


def test_running_stats_merge_and_weights_match_direct_computation():
    values = [3.0, -1.5, 2.25, 10.0, 0.0, 7.5]
    whole = RunningStats()
    for v in values:
        whole.add(v)
    left, right = RunningStats(), RunningStats()
    for v in values[:2]:
        left.add(v)
    for v in values[2:]:
        right.add(v)
    left.merge(right)
    for merged in (whole, left):
        assert merged.count == 6
        assert math.isclose(merged.mean, py_statistics.fmean(values))
        assert math.isclose(merged.std, py_statistics.pstdev(values))
        assert (merged.minimum, merged.maximum) == (-1.5, 10.0)

    weighted = RunningStats()
    weighted.add(1, weight=3)
    weighted.add(4, weight=1)
    assert weighted.count == 4 and math.isclose(weighted.mean, 1.75)
    assert math.isclose(weighted.std, py_statistics.pstdev([1, 1, 1, 4]))


def test_empty_stats_block_and_rounding():
    assert RunningStats().to_metrics() == {
        "Total # non-null values": 0, "Average": None, "Min": None, "Max": None, "Standard deviation": None,
    }  # fmt: skip
    assert (round_metric(12.3456), round_metric(0.123456), round_metric(7)) == (12.35, 0.123, 7)


def test_word_proxy_turns_and_unique_messages():
    s = DatasetStatistics()
    s.add({"responses_create_params": {"input": "a b c"}})  # '{"input": "a b c"}' -> 4 words
    s.add(
        {"responses_create_params": {"input": [{"role": "user", "content": "a b c"}, {"role": "user", "content": "d"}]}}
    )
    metrics = s.to_metrics()
    assert metrics[stats.WORDS_KEY]["Min"] == 4
    assert metrics[stats.TURNS_KEY]["Max"] == 2
    assert metrics[stats.UNIQUE_USER_MESSAGES_KEY] == 2  # "a b c" (as a string input and as a message) and "d"
    assert metrics[stats.UNIQUE_PARAMS_KEY] == 2


def test_unique_create_params_ignore_key_order():
    s = DatasetStatistics()
    s.add({"responses_create_params": {"input": "q", "temperature": 1}})
    s.add({"responses_create_params": {"temperature": 1, "input": "q"}})
    assert s.to_metrics()[stats.UNIQUE_PARAMS_KEY] == 1


def test_other_fields_lists_and_mixed_types():
    s = DatasetStatistics()
    s.add({"responses_create_params": {"input": "q"}, "scores": [1, [2, 3]], "tag": "a", "mixed": "x", "meta": {}})
    s.add({"responses_create_params": {"input": "q"}, "scores": [4], "tag": ["a", "b"], "mixed": 2, "flag": True})
    metrics = s.to_metrics()
    assert metrics["scores"]["Total # non-null values"] == 4 and metrics["scores"]["Average"] == 2.5
    assert metrics["tag"] == {"unique_count": 2, "total_count": 3}
    assert metrics["mixed"]["Average"] == 2 and metrics["mixed"]["unique_count"] == 1
    assert metrics["flag"]["Average"] == 1.0
    assert "meta" not in metrics  # a mapping is neither a number nor a string


def test_real_tokenizer_counts_when_available(monkeypatch):
    class FakeEncoding:
        def encode(self, text, disallowed_special=()):
            return list(text)

    monkeypatch.setattr(stats, "_tiktoken_encoding", lambda: FakeEncoding())
    s = DatasetStatistics()
    s.add({"responses_create_params": {"input": "hi"}})
    assert s.to_metrics()[stats.TOKENS_KEY]["Max"] == len(json.dumps({"input": "hi"}))

    monkeypatch.setattr(stats, "_tiktoken_encoding", lambda: None)
    without = DatasetStatistics()
    without.add({"responses_create_params": {"input": "hi"}})
    assert stats.TOKENS_KEY not in without.to_metrics()
    # A file written where the tokenizer was available is not a conflict where it is not.
    assert compare_metrics(s.to_metrics(), without.to_metrics()) == []


def test_compare_metrics_rules():
    assert compare_metrics({"a": 1.004, "b": 0.1234}, {"a": 1.0, "b": 0.1236}) == []
    assert compare_metrics({"a": 1.01}, {"a": 1.0}) == ["a: was 1.01, now 1.0"]
    assert compare_metrics({"l": [1, 2, 2]}, {"l": [2, 1, 2]}) == []
    assert compare_metrics({"l": [1, 2]}, {"l": [1, 2, 2]}) != []
    assert compare_metrics({"gone": 1}, {}) == ["gone: no longer computed (was 1)"]
    assert compare_metrics({}, {"new": 1}) == []
    assert compare_metrics({"s": {"x": "a"}}, {"s": {"x": "b"}}) == ['s.x: was "a", now "b"']
    assert compare_metrics({"n": None}, {"n": 0}) != []


def test_reconcile_metrics_file_lifecycle(tmp_path):
    path = tmp_path / "d_metrics.json"
    assert reconcile_metrics_file(path, {"a": 1}).status == "created"
    assert reconcile_metrics_file(path, {"a": 1}).status == "unchanged"
    assert reconcile_metrics_file(path, {"a": 1, "b": 2}).status == "updated"
    conflict = reconcile_metrics_file(path, {"a": 5, "b": 2})
    assert conflict.status == "conflict" and conflict.conflict_path == tmp_path / "d_metrics_conflict.json"
    assert json.loads(path.read_text()) == {"a": 1, "b": 2}
    assert reconcile_metrics_file(path, {"a": 5, "b": 2}, overwrite=True).status == "overwritten"
    assert not conflict.conflict_path.exists()
    path.write_text("{broken")
    assert reconcile_metrics_file(path, {"a": 5}).status == "conflict"


def test_checked_lines_report_every_bad_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"a": 1}\n\n[1]\nnope\n{"b": 2}\n')
    lines = list(iter_checked_lines(path))
    assert [(line.number, line.row is not None) for line in lines] == [(1, True), (3, False), (4, False), (5, True)]
    assert "JSON object, got list" in lines[1].problem and "not valid JSON" in lines[2].problem


def test_create_params_problem():
    assert create_params_problem({"input": "q", "temperature": 0.2}) is None
    assert create_params_problem(None).startswith("missing responses_create_params")
    assert create_params_problem({"input": "q", "bogus": 1}).startswith("responses_create_params.bogus:")
    assert create_params_problem({"input": "q"}, {"temperature": "warm"}).startswith(
        "responses_create_params.temperature:"
    )


def test_row_fields_never_overwrite_the_header_or_statistics():
    s = DatasetStatistics()
    s.add({"responses_create_params": {"input": "q"}, "type": "math", "Number of examples": 7, "name": "n"})
    metrics = s.to_metrics(header={"name": "train", "type": "train"})
    assert (metrics["name"], metrics["type"], metrics["Number of examples"]) == ("train", "train", 1)
    assert metrics["type (row field)"] == {"unique_count": 1, "total_count": 1}
    assert metrics["Number of examples (row field)"]["Average"] == 7
    assert list(metrics)[:2] == ["name", "type"]
