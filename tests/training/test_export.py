"""``gym dataset export``: what goes into SFT conversations and DPO pairs, what is left out and why, and the errors a
user sees (``file:line`` for a bad row, a refused overwrite), run as the command line runs it.

The rollouts are the real stack's (``weather_runs``: one run that calls the tool, reward 1, one that does not,
reward 0); rows for the edge cases are those rows with one field changed, so they keep the real format.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_gym.cli.main import main
from tests.helpers import write
from tests.training.conftest import REPEATS, TASKS, WeatherRuns


def gym(capsys: Any, *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def rows_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_rows(path: Path, rows: list[dict[str, Any] | str]) -> Path:
    return write(path, "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))


def test_sft_keeps_well_scored_conversations_with_their_tool_calls(weather_runs: WeatherRuns, tmp_path, capsys):
    output = tmp_path / "sft.jsonl"
    code, out, err = gym(
        capsys, "dataset", "export", "--format", "sft", "-i", weather_runs.with_tool, "-i", weather_runs.without_tool,
        "-o", output,
    )  # fmt: skip
    assert code == 0, err
    assert f"read {2 * TASKS * REPEATS} row(s): {2 * TASKS * REPEATS} usable, 0 problem(s)" in out
    assert f"left out: below_min_reward {TASKS * REPEATS}" in out
    assert f"wrote {TASKS * REPEATS} SFT conversation(s), mean reward 1.0000 to {output}" in out

    rows = rows_of(output)
    assert len(rows) == TASKS * REPEATS and {row["reward"] for row in rows} == {1.0}
    messages = rows[0]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    (call,) = messages[2]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}} and call["type"] == "function"
    assert messages[3]["tool_call_id"] == call["id"] and messages[3]["name"] == "get_weather"
    assert json.loads(messages[3]["content"])["city"] == "Paris"
    assert messages[4] == {"role": "assistant", "content": "It is cold there."}
    (tool,) = json.loads(rows[0]["tools"])  # a JSON string: one Arrow schema for every environment's tools
    assert tool["type"] == "function" and tool["function"]["name"] == "get_weather"
    assert tool["function"]["parameters"]["required"] == ["city"]


def test_min_reward_is_the_sft_threshold(weather_runs: WeatherRuns, tmp_path, capsys):
    output = tmp_path / "all.jsonl"
    code, out, _ = gym(capsys, "dataset", "export", "-f", "sft", "-i", weather_runs.without_tool, "-o", output,
                       "--min-reward", "0")  # fmt: skip
    assert code == 0 and len(rows_of(output)) == TASKS * REPEATS and "mean reward 0.0000" in out


def test_dpo_pairs_the_best_and_worst_rollout_of_each_task(weather_runs: WeatherRuns, tmp_path, capsys):
    output = tmp_path / "dpo.jsonl"
    code, out, err = gym(capsys, "dataset", "export", "--format", "dpo", "-i", weather_runs.without_tool,
                         "-i", weather_runs.with_tool, "-o", output)  # fmt: skip
    assert code == 0, err
    assert f"{TASKS} task(s), {TASKS} with a pair" in out
    assert "mean reward: chosen 1.0000, rejected 0.0000, margin 1.0000" in out
    rows = rows_of(output)
    assert sorted(row["task_index"] for row in rows) == list(range(TASKS))
    first = rows[0]
    assert [m["role"] for m in first["prompt"]] == ["system", "user"]
    assert [m["role"] for m in first["chosen"]] == ["assistant", "tool", "assistant"]
    assert first["rejected"] == [{"role": "assistant", "content": "Sunny."}]
    assert (first["chosen_reward"], first["rejected_reward"]) == (1.0, 0.0)
    assert json.loads(first["tools"])[0]["function"]["name"] == "get_weather"


def test_dpo_all_pairs_with_a_margin_and_no_ties(weather_runs: WeatherRuns, tmp_path, capsys):
    rollouts = [row for row in rows_of(weather_runs.with_tool) if row["_ng_task_index"] == 0]
    task_0 = [{**rollouts[0], "reward": reward} for reward in (0.0, 0.5, 1.0, 1.0)]
    task_1 = [{**rollouts[0], "_ng_task_index": 1, "reward": 0.3} for _ in range(2)]  # a tie: no pair
    data = write_rows(tmp_path / "graded.jsonl", [*task_0, *task_1])
    pairs = lambda rows: sorted((r["chosen_reward"], r["rejected_reward"]) for r in rows)  # noqa: E731

    def export(*flags: str) -> tuple[str, list[dict[str, Any]]]:
        output = tmp_path / f"pairs_{'_'.join(flags)}.jsonl"
        code, out, err = gym(capsys, "dataset", "export", "-f", "dpo", "-i", data, "-o", output, *flags)
        assert code == 0, err
        return out, rows_of(output)

    out, rows = export()
    assert pairs(rows) == [(1.0, 0.0)] and "tasks without a pair: all_rewards_equal 1" in out
    _, rows = export("--pairs", "all")
    assert pairs(rows) == [(0.5, 0.0), (1.0, 0.0), (1.0, 0.0), (1.0, 0.5), (1.0, 0.5)]
    _, rows = export("--pairs", "all", "--min-margin", "0.6")
    assert pairs(rows) == [(1.0, 0.0), (1.0, 0.0)]
    out, rows = export("--min-margin", "2")
    assert rows == [] and "below_min_margin 1" in out


def test_incomplete_responses_are_left_out_unless_asked(weather_runs: WeatherRuns, tmp_path, capsys):
    row = rows_of(weather_runs.with_tool)[0]
    data = write_rows(tmp_path / "cut.jsonl", [{**row, "response": {**row["response"], "status": "incomplete"}}])
    code, out, _ = gym(capsys, "dataset", "export", "-f", "sft", "-i", data, "-o", tmp_path / "a.jsonl")
    assert code == 0 and "left out: incomplete 1" in out and rows_of(tmp_path / "a.jsonl") == []
    code, _, _ = gym(capsys, "dataset", "export", "-f", "sft", "-i", data, "-o", tmp_path / "b.jsonl",
                     "--keep-incomplete")  # fmt: skip
    assert code == 0 and len(rows_of(tmp_path / "b.jsonl")) == 1


def bad_rows(weather_runs: WeatherRuns) -> list[dict[str, Any] | str]:
    good = rows_of(weather_runs.with_tool)[0]
    call = good["response"]["output"][0]
    return [
        good,
        '{"responses_create_params": ',
        {key: value for key, value in good.items() if key != "reward"},
        {**good, "response": None},
        {**good, "_ng_failure_class": "timeout"},
        {**good, "response": {**good["response"], "output": [{**call, "arguments": "{not json"}]}},
        good,
    ]


def test_bad_rows_are_reported_as_file_and_line_and_skipped(weather_runs: WeatherRuns, tmp_path, capsys):
    data = write_rows(tmp_path / "mixed.jsonl", bad_rows(weather_runs))
    output = tmp_path / "out.jsonl"
    code, out, err = gym(capsys, "dataset", "export", "-f", "sft", "-i", data, "-o", output)
    assert code == 3  # as `gym dataset collate`: bad rows were skipped
    assert "read 7 row(s): 2 usable, 5 problem(s)" in out and "wrote 2 SFT conversation(s)" in out
    assert "bad_tool_arguments 1, failure_row 1, invalid_json 1, missing_response 1, missing_reward 1" in out
    assert f"{data}:2: not valid JSON" in err
    assert f"{data}:3: no 'reward'" in err
    assert f"{data}:4: no 'response.output' list" in err
    assert f"{data}:5: a failed rollout (timeout)" in err
    assert f"{data}:6: the arguments of tool call 'get_weather' are not a JSON object" in err
    assert "Traceback" not in err and len(rows_of(output)) == 2


def test_strict_stops_at_the_first_bad_row_and_writes_nothing(weather_runs: WeatherRuns, tmp_path, capsys):
    data = write_rows(tmp_path / "mixed.jsonl", bad_rows(weather_runs))
    output = tmp_path / "out.jsonl"
    code, _, err = gym(capsys, "dataset", "export", "-f", "dpo", "-i", data, "-o", output, "--strict")
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: {data}:2: not valid JSON (")
    assert not output.exists() and list(tmp_path.iterdir()) == [data]  # no temporary file left either


def test_dpo_refuses_rollouts_of_different_inputs_under_one_task(weather_runs: WeatherRuns, tmp_path, capsys):
    other = [{**row, "responses_create_params": {**row["responses_create_params"], "input": "another question"}}
             for row in rows_of(weather_runs.without_tool)]  # fmt: skip
    data = write_rows(tmp_path / "other.jsonl", other)
    code, _, err = gym(capsys, "dataset", "export", "-f", "dpo", "-i", weather_runs.with_tool, "-i", data,
                       "-o", tmp_path / "out.jsonl")  # fmt: skip
    assert code == 3
    assert f"{data}:1: its prompt differs from {weather_runs.with_tool}:" in err and "different inputs" in err


def test_an_existing_output_is_replaced_only_with_overwrite(weather_runs: WeatherRuns, tmp_path, capsys):
    output = write(tmp_path / "sft.jsonl", "keep me\n")
    argv = ("dataset", "export", "-f", "sft", "-i", weather_runs.with_tool, "-o", output)
    code, out, err = gym(capsys, *argv)
    assert code == 1 and out == "" and output.read_text() == "keep me\n"
    assert err.strip() == f"error: --output {output} already exists; pass --overwrite to replace it"
    code, _, _ = gym(capsys, *argv, "--overwrite")
    assert code == 0 and len(rows_of(output)) == TASKS * REPEATS


def test_flag_mistakes_are_one_line(weather_runs: WeatherRuns, tmp_path, capsys):
    base = ("dataset", "export", "-i", weather_runs.with_tool, "-o", tmp_path / "x.jsonl")
    cases = {
        ("-f", "dpo", "--min-reward", "0.5"): "--min-reward applies to --format sft only",
        ("-f", "sft", "--pairs", "all"): "--pairs applies to --format dpo only",
        ("-f", "rl",): "--format must be one of sft, dpo, got 'rl'",
        ("-f", "dpo", "--pairs", "best"): "--pairs must be one of best-worst, all, got 'best'",
        ("-f", "sft", "+min_reward=0"): "unknown argument '+min_reward=0'",
    }  # fmt: skip
    for flags, message in cases.items():
        code, _, err = gym(capsys, *base, *flags)
        assert code == 1 and message in err and len(err.strip().splitlines()) == 1, (flags, err)
    code, _, err = gym(capsys, "dataset", "export", "-f", "sft", "-i", tmp_path / "missing.jsonl", "-o", "x.jsonl")
    assert code == 1 and f"--input {tmp_path / 'missing.jsonl'} does not exist" in err
