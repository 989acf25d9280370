"""What ``gym eval run`` says when Ctrl-C stops it: where the finished rollouts are and that ``--resume`` continues,
or, stopped before any rollout finished (while the rows were checked, say), that there is nothing to resume."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

from nemo_gym.cli.commands.eval import _run_reporting
from nemo_gym.cli.output import GymConsole


def _interrupted(output: Path) -> tuple[int, str]:
    stream = io.StringIO()

    def collect() -> None:
        raise KeyboardInterrupt

    code = _run_reporting(collect, SimpleNamespace(output_jsonl_fpath=str(output)), GymConsole(file=stream, width=300))
    return code, stream.getvalue()


def test_an_interrupt_after_rollouts_ended_points_at_them_and_at_resume(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    output.write_text('{"reward": 1.0}\n')
    code, said = _interrupted(output)
    assert code == 130
    assert f"Finished rollouts are in {output}" in said and "--resume" in said
    only_failures = tmp_path / "failed.jsonl"  # nothing scored yet, but failures that --resume retries
    only_failures.write_text("")
    (tmp_path / "failed_failures.jsonl").write_text('{"_ng_failure_class": "timeout"}\n')
    assert "--resume" in _interrupted(only_failures)[1]


def test_an_interrupt_before_any_rollout_finished_says_there_is_nothing_to_resume(tmp_path: Path) -> None:
    for output in (tmp_path / "missing.jsonl", tmp_path / "empty.jsonl"):
        if output.name == "empty.jsonl":
            output.write_text("")
        code, said = _interrupted(output)
        assert code == 130
        assert "before any rollout finished: nothing to resume yet" in said and "--resume" not in said
