"""Create params checked ahead of a run (``check_params_ahead``) say what ``create_params_problem`` says, line by
line, and a run uses them only for the file they were read from, unchanged, and without overrides."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nemo_gym.cli.main import collects_from_running_servers, input_named_by
from nemo_gym.datasets.validation import CheckedParams, check_params_ahead, create_params_problem, file_version
from nemo_gym.errors import ConfigError
from nemo_gym.rollouts.materialize import MaterializeOptions, materialize

GOOD = {"responses_create_params": {"input": "hi"}}
BAD = {"responses_create_params": {"input": 3}}


def write_rows(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_the_verdicts_are_create_params_problem_line_by_line(tmp_path: Path) -> None:
    rows = [GOOD, BAD, {"no_params": 1}, GOOD]
    lines = [json.dumps(rows[0]), json.dumps(rows[1]), "", json.dumps(rows[2]), json.dumps(rows[3])]
    path = write_rows(tmp_path / "rows.jsonl", lines)
    checked = check_params_ahead(path, stop=lambda: False)
    assert checked is not None and checked.path == path.resolve() and checked.version == file_version(path)
    expected = [create_params_problem(row["responses_create_params"]) if "responses_create_params" in row else None
                for row in rows]  # fmt: skip
    assert checked.problems[:2] == expected[:2] and checked.problems[2] is None  # line 3 is blank
    assert checked.problems[3] == create_params_problem(None) and checked.problems[4] is None
    assert checked.problems[1] is not None and checked.problems_for(path, {}) == checked.problems


def test_checking_ahead_stops_when_asked_and_at_a_line_the_run_reports_itself(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "rows.jsonl", [json.dumps(GOOD)] * 600)
    asked = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > 2  # the run arrives after two looks: 512 lines were checked

    checked = check_params_ahead(path, stop=stop, every=256)
    assert checked is not None and len(checked.problems) == 512
    path = write_rows(tmp_path / "broken.jsonl", [json.dumps(GOOD), "not json", json.dumps(GOOD)])
    broken = check_params_ahead(path, stop=lambda: False)
    assert broken is not None and broken.problems == [None]
    path = write_rows(tmp_path / "list.jsonl", [json.dumps(GOOD), "[1]"])
    listed = check_params_ahead(path, stop=lambda: False)
    assert listed is not None and listed.problems == [None]
    assert check_params_ahead(tmp_path / "missing.jsonl", stop=lambda: False) is None
    os.mkfifo(tmp_path / "pipe.jsonl")  # never read ahead: its rows would be gone for the run (this would block)
    assert check_params_ahead(tmp_path / "pipe.jsonl", stop=lambda: False) is None


def test_verdicts_hold_only_for_the_same_unchanged_file_without_overrides(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "rows.jsonl", [json.dumps(GOOD)] * 3)
    checked = check_params_ahead(path, stop=lambda: False)
    assert checked is not None and checked.problems_for(path, {}) == [None] * 3
    assert checked.problems_for(tmp_path / "." / "rows.jsonl", {}) == [None] * 3  # the same file, spelled otherwise
    assert checked.problems_for(path, {"temperature": 0.5}) == []  # overrides change what is validated
    copy = write_rows(tmp_path / "copy.jsonl", [json.dumps(GOOD)] * 3)
    assert checked.problems_for(copy, {}) == []
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # written again, same size
    assert checked.problems_for(path, {}) == []
    path.unlink()
    assert checked.problems_for(path, {}) == []


def options(path: Path, tmp_path: Path, checked: CheckedParams | None, **extra: object) -> MaterializeOptions:
    return MaterializeOptions(path, tmp_path / "out" / "o.jsonl", agent_name="a", checked_params=checked, **extra)  # type: ignore[arg-type]


def test_a_run_takes_the_verdicts_where_they_hold_and_validates_the_rest(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "rows.jsonl", [json.dumps(GOOD)] * 4)
    plain = materialize(options(path, tmp_path, None))
    plain_rows = plain.path.read_bytes()
    # Verdicts that say line 2 is bad stand in for validating it: they are what the run goes by.
    said = CheckedParams(path.resolve(), file_version(path), [None, "responses_create_params.input: checked ahead"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"rows\.jsonl:2: responses_create_params\.input: checked ahead"):
        materialize(options(path, tmp_path, said))
    # Lines past the verdicts are validated: a bad line 4 is found.
    write_rows(path, [json.dumps(GOOD)] * 3 + [json.dumps(BAD)])
    short = CheckedParams(path.resolve(), file_version(path), [None, None])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"rows\.jsonl:4: responses_create_params\.input"):
        materialize(options(path, tmp_path, short))
    # With overrides the verdicts do not hold: the overrides are validated with each row.
    write_rows(path, [json.dumps(GOOD)] * 4)
    fine = check_params_ahead(path, stop=lambda: False)
    with pytest.raises(ConfigError, match=r"rows\.jsonl:1: responses_create_params\.temperature"):
        materialize(options(path, tmp_path, fine, responses_create_params={"temperature": "hot"}))
    same = materialize(options(path, tmp_path, fine))
    assert same.path.read_bytes() == plain_rows and same.fingerprint == plain.fingerprint


@pytest.mark.parametrize(
    ("argv", "collects", "named"),
    [
        (["eval", "run", "--no-serve", "--input", "rows.jsonl"], True, "rows.jsonl"),
        (["-v", "eval", "run", "-i", "a.jsonl", "--no-serve", "-i", "b.jsonl"], True, "b.jsonl"),
        (["eval", "run", "--no-serve", "--input=c.jsonl"], True, "c.jsonl"),
        (["eval", "run", "--no-serve", "+input_jsonl_fpath=d.jsonl"], True, "d.jsonl"),
        (["eval", "run", "--no-serve", "++input_jsonl_fpath=e.jsonl"], True, "e.jsonl"),
        (["eval", "run", "--no-serve", "--split", "benchmark"], True, None),
        (["eval", "run", "--no-serve", "--input", "rows.jsonl", "--help"], False, "rows.jsonl"),
        (["eval", "run", "--input", "rows.jsonl"], False, "rows.jsonl"),
        (["env", "start", "--no-serve"], False, None),
        (["eval", "run", "--no-serve", "--input"], True, None),
        (["eval", "run", "--no-serve", "--input", "rows.jsonl", "--temperature", "0.5"], True, None),
        (["eval", "run", "--no-serve", "-i", "rows.jsonl", "+responses_create_params.top_p=0.9"], True, None),
        ([], False, None),
    ],
)
def test_the_entry_point_reads_a_collect_against_running_servers_and_its_input(
    argv: list[str], collects: bool, named: str | None
) -> None:
    assert collects_from_running_servers(argv) is collects
    assert input_named_by(argv) == named
