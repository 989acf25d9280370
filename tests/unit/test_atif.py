"""ATIF v1.7 export and its reading back, without servers: the mapping both ways, strict JSON, the export folder
and its manifest, the one-line refusals, and the reward comparison. Every trajectory written is also checked by the
``atif`` package (an independent model of the format) besides our own."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import atif
import pytest

from nemo_gym.atif.export import export_atif
from nemo_gym.atif.from_rollout import rollout_to_trajectory
from nemo_gym.atif.reverify import load_export, reward_mismatches, write_stored_rollouts
from nemo_gym.atif.schema import Trajectory
from nemo_gym.atif.strict_json import loads
from nemo_gym.atif.to_response import trajectory_response
from nemo_gym.cli.main import main
from nemo_gym.errors import ConfigError

WEATHER = Path(__file__).parents[2] / "resources_servers" / "example_single_tool_call" / "data"


def _message(text: str, id_: str = "msg_1") -> dict[str, Any]:
    return {"id": id_, "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def _row(output: list[dict[str, Any]], task: int = 0, reward: float = 1.0, **params: Any) -> dict[str, Any]:
    return {
        "_ng_task_index": task, "_ng_rollout_index": 0, "agent_ref": {"name": "weather_agent"}, "reward": reward,
        "responses_create_params": {"input": [{"role": "user", "content": "Weather in Oslo?"}], **params},
        "response": {"id": "resp_1", "object": "response", "created_at": 1.0, "model": "m", "output": output,
                     "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                     "usage": {"input_tokens": 30, "output_tokens": 12, "input_tokens_details": {"cached_tokens": 4}}},
    }  # fmt: skip


TOOL_TURNS = [
    {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "I need the weather."}]},
    {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "get_weather",
     "arguments": '{"city": "Oslo"}', "status": "completed"},
    {"type": "function_call_output", "call_id": "call_1", "output": '{"weather": "cold"}'},
    {"id": "fc_2", "type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{'city':"},
    {"type": "function_call_output", "call_id": "call_2", "output": "bad arguments"},
    _message("It is cold in Oslo.", "msg_2"),
]  # fmt: skip


def _task(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("response", "reward")}


def _both_validators(trajectory: Trajectory) -> dict[str, Any]:
    """The JSON of the trajectory, read back by our model and by the ``atif`` package."""
    document = json.loads(trajectory.model_dump_json(exclude_unset=True))
    assert Trajectory.model_validate(document) == trajectory
    atif.Trajectory.model_validate(document)
    assert document["schema_version"] == "ATIF-v1.7"
    return document


def test_a_tool_calling_rollout_becomes_steps_and_comes_back_as_the_same_output() -> None:
    row = _row(TOOL_TURNS, instructions="Answer briefly.", tools=[{"type": "function", "name": "get_weather"}])
    trajectory = rollout_to_trajectory(row, _task(row), session_id="run", agent_version="2")
    document = _both_validators(trajectory)
    steps = document["steps"]
    assert [(s["step_id"], s["source"]) for s in steps] == [(1, "system"), (2, "user"), (3, "agent"), (4, "agent"),
                                                             (5, "agent")]  # fmt: skip
    assert steps[0]["message"] == "Answer briefly." and steps[1]["message"] == "Weather in Oslo?"
    first, second, answer = steps[2], steps[3], steps[4]
    assert first["reasoning_content"] == "I need the weather." and first["message"] == ""
    assert first["tool_calls"][0] | {"extra": None} == {"tool_call_id": "call_1", "function_name": "get_weather",
                                                          "arguments": {"city": "Oslo"}, "extra": None}  # fmt: skip
    assert first["observation"]["results"][0]["content"] == '{"weather": "cold"}'
    # arguments that are not a JSON object: ATIF's object is empty, the model's text kept for the way back
    assert second["tool_calls"][0]["arguments"] == {}
    assert second["tool_calls"][0]["extra"]["nemo_gym"]["raw_arguments"] == "{'city':"
    assert answer["message"] == "It is cold in Oslo." and "tool_calls" not in answer
    assert document["agent"] == {"name": "weather_agent", "version": "2", "model_name": "m",
                                 "tool_definitions": [{"type": "function", "name": "get_weather"}]}  # fmt: skip
    assert document["final_metrics"] == {"total_prompt_tokens": 30, "total_completion_tokens": 12,
                                         "total_cached_tokens": 4, "total_steps": 5}  # fmt: skip
    assert document["trajectory_id"] == "run:0-0" and document["extra"]["nemo_gym"]["reward"] == 1.0
    # the way back: the same output items, ids and order included, from the file's JSON
    assert trajectory_response(Trajectory.model_validate(document)) == row["response"]


def test_token_ids_of_a_turn_are_the_steps_metrics_and_go_back_on_their_item() -> None:
    record = {"prompt_token_ids": [1, 2, 3], "generation_token_ids": [7, 8], "generation_log_probs": [-0.5, -0.25]}
    call = TOOL_TURNS[1] | record
    answer = _message("Cold.", "msg_2") | {"prompt_token_ids": [1, 2, 3, 7, 8, 9], "generation_token_ids": [4],
                                            "generation_log_probs": [-1.0]}  # fmt: skip
    row = _row([call, TOOL_TURNS[2], answer])
    document = _both_validators(rollout_to_trajectory(row, _task(row), session_id="s", agent_version="1"))
    first, second = (step for step in document["steps"] if step["source"] == "agent")
    assert first["metrics"] == {"prompt_tokens": 3, "completion_tokens": 2, "prompt_token_ids": [1, 2, 3],
                                "completion_token_ids": [7, 8], "logprobs": [-0.5, -0.25]}  # fmt: skip
    assert second["metrics"]["completion_token_ids"] == [4] and second["metrics"]["prompt_tokens"] == 6
    assert "prompt_token_ids" not in json.dumps(first["tool_calls"])  # once, in the metrics
    assert trajectory_response(Trajectory.model_validate(document)) == row["response"]


def test_earlier_turns_of_the_prompt_are_copied_context_and_not_scored_again() -> None:
    prompt = [{"role": "user", "content": "Hi"}, _message("Hello!", "msg_0"), {"role": "user", "content": "Oslo?"}]
    row = _row([_message("Cold.")]) | {"responses_create_params": {"input": prompt}}
    document = _both_validators(rollout_to_trajectory(row, _task(row), session_id="s", agent_version="1"))
    assert [(s["source"], s.get("is_copied_context")) for s in document["steps"]] == [
        ("user", None), ("agent", True), ("user", None), ("agent", None)]  # fmt: skip
    assert [item["id"] for item in trajectory_response(Trajectory.model_validate(document))["output"]] == ["msg_1"]


def test_a_trajectory_from_another_producer_gets_a_response_of_its_own() -> None:
    foreign = Trajectory.model_validate({
        "schema_version": "ATIF-v1.7", "session_id": "x", "agent": {"name": "a", "version": "1", "model_name": "m"},
        "steps": [{"step_id": 1, "source": "user", "message": "2+2?"},
                  {"step_id": 2, "source": "agent", "message": "", "tool_calls": [
                      {"tool_call_id": "c", "function_name": "add", "arguments": {"a": 2, "b": 2}}],
                   "observation": {"results": [{"source_call_id": "c", "content": "4"}]}},
                  {"step_id": 3, "source": "agent", "message": [{"type": "text", "text": "4"}]}],
    })  # fmt: skip
    response = trajectory_response(foreign)
    assert response["model"] == "m" and response["object"] == "response"
    assert [(i["type"], i.get("id")) for i in response["output"]] == [
        ("function_call", None), ("function_call_output", None), ("message", "msg_atif_2")]  # fmt: skip
    assert response["output"][0]["arguments"] == '{"a": 2, "b": 2}'
    assert response["output"][2]["content"][0]["text"] == "4"


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"schema_version": "ATIF-v1.6"}, "schema_version"),
        ({"steps": [{"step_id": 2, "source": "user", "message": "x"}]}, "ids count up from 1"),
        ({"steps": [{"step_id": 1, "source": "user", "message": "x", "reasoning_content": "r"}]}, "agent steps"),
        ({"steps": [{"step_id": 1, "source": "agent", "message": "x",
                     "observation": {"results": [{"source_call_id": "nope"}]}}]}, "not made in this step"),
        ({"steps": [{"step_id": 1, "source": "user", "message": "x", "timestamp": "yesterday"}]}, "ISO 8601"),
        ({"surprise": 1}, "Extra inputs"),
    ],
)  # fmt: skip
def test_our_schema_refuses_what_v1_7_does_not_allow(document: dict[str, Any], problem: str) -> None:
    base = {"schema_version": "ATIF-v1.7", "agent": {"name": "a", "version": "1"},
            "steps": [{"step_id": 1, "source": "user", "message": "x"}]}  # fmt: skip
    with pytest.raises(ValueError, match=problem):
        Trajectory.model_validate(base | document)


@pytest.mark.parametrize(
    ("text", "problem"),
    [(b'{"a": NaN}', "NaN is not a JSON number"), (b'{"a": 1, "a": 2}', "key 'a' appears twice"),
     (b'{"a": 1', "not valid JSON"), (b'{"a": "\xff"}', "not UTF-8")],
)  # fmt: skip
def test_strict_json_refuses_what_plain_json_would_bend(text: bytes, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as caught:
        loads(text, "f.json")
    assert str(caught.value).startswith("f.json: ") and "\n" not in str(caught.value)


def _run_files(folder: Path, rows: list[dict[str, Any]]) -> Path:
    rollouts = folder / "run.jsonl"
    rollouts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "run_materialized_inputs.jsonl").write_text("".join(json.dumps(_task(r)) + "\n" for r in rows))
    return rollouts


def test_export_writes_a_file_per_rollout_and_a_manifest_of_their_hashes(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in (WEATHER / "example_rollouts.jsonl").read_text().splitlines()]
    result = export_atif(_run_files(tmp_path, rows), tmp_path / "atif")
    manifest = [json.loads(line) for line in result.manifest_path.read_text().splitlines()]
    assert result.trajectories == len(rows) == len(manifest)
    assert sorted(p.name for p in result.output_dir.iterdir()) == sorted(
        [f"{r['_ng_task_index']}-{r['_ng_rollout_index']}.json" for r in rows] + ["manifest.jsonl"]
    )
    for entry, row in zip(manifest, sorted(rows, key=lambda r: r["_ng_task_index"]), strict=True):
        data = (result.output_dir / entry["trajectory_path"]).read_bytes()
        assert entry["expected_sha256"] == hashlib.sha256(data).hexdigest()
        assert (entry["_ng_task_index"], entry["_ng_rollout_index"]) == (row["_ng_task_index"], 0)
        document = json.loads(data)
        atif.Trajectory.model_validate(document)
        assert document["schema_version"] == "ATIF-v1.7" and document["session_id"] == "run"
        assert document["agent"]["version"] == "unspecified"
        assert trajectory_response(Trajectory.model_validate(document)) == row["response"]
    # read back: the stored rollouts gym eval reverify gets are the run's own rows, rebuilt from the files
    exported = load_export(result.output_dir)
    write_stored_rollouts(exported, tmp_path / "stored.jsonl", tmp_path / "inputs.jsonl")
    stored = [json.loads(line) for line in (tmp_path / "stored.jsonl").read_text().splitlines()]
    assert [(s["_ng_task_index"], s["reward"], s["response"]) for s in stored] == [
        (r["_ng_task_index"], r["reward"], r["response"]) for r in sorted(rows, key=lambda r: r["_ng_task_index"])
    ]


def test_export_refusals_are_one_line_and_leave_nothing_behind(tmp_path: Path, capsys) -> None:
    refusal = [{"id": "m", "type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}]
    rows = [_row([_message("ok")], task=0), _row(refusal, task=1), _row([{"type": "web_search_call"}], task=2)]
    args = ["eval", "export", "--format", "atif", "--rollouts", str(_run_files(tmp_path, rows)), "--output-dir"]
    assert main([*args, str(tmp_path / "atif")]) == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and error.startswith("error: 2 rollout(s) cannot be exported as ATIF")
    assert "run.jsonl:2: response.output[0].content[0]: a 'refusal' part cannot be exported" in error
    assert "run.jsonl:3: response.output[0]: a 'web_search_call' item cannot be exported" in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl", "run_materialized_inputs.jsonl"]
    assert main(["eval", "export", "--format", "csv", "--rollouts", "x", "--output-dir", "y"]) == 1
    assert "the only export format is atif" in capsys.readouterr().err


def _rehash(folder: Path, name: str, document: dict[str, Any]) -> None:
    data = json.dumps(document).encode()
    (folder / name).write_bytes(data)
    manifest = [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()]
    for entry in manifest:
        if entry["trajectory_path"] == name:
            entry["expected_sha256"] = hashlib.sha256(data).hexdigest()
    (folder / "manifest.jsonl").write_text("".join(json.dumps(e) + "\n" for e in manifest))


def test_reading_an_export_back_refuses_changed_or_invalid_files(tmp_path: Path) -> None:
    rows = [_row([_message("Cold.")], task=t) for t in range(2)]
    folder = export_atif(_run_files(tmp_path, rows), tmp_path / "atif").output_dir
    original = json.loads((folder / "1-0.json").read_text())
    (folder / "1-0.json").write_text(json.dumps(original))  # same content, other bytes: not the exported file
    with pytest.raises(ConfigError, match=r"1-0.json: sha256 is \w+, the manifest says \w+: the file changed"):
        load_export(folder)
    _rehash(folder, "1-0.json", original | {"steps": [original["steps"][0] | {"metrics": {}}, original["steps"][1]]})
    with pytest.raises(ConfigError, match=r"1-0.json: not ATIF v1.7: steps.0: Value error, metrics: only agent steps"):
        load_export(folder)
    _rehash(
        folder, "1-0.json", original | {"extra": {"nemo_gym": original["extra"]["nemo_gym"] | {"_ng_task_index": 0}}}
    )
    with pytest.raises(ConfigError, match=r"1-0.json: the file is not \(task 1, rollout 0\)"):
        load_export(folder)
    (folder / "manifest.jsonl").write_text(json.dumps({"trajectory_path": "../run.jsonl", "expected_sha256": "0",
                                                       "_ng_task_index": 0, "_ng_rollout_index": 0}) + "\n")  # fmt: skip
    with pytest.raises(ConfigError, match="must stay inside the export's folder"):
        load_export(folder / "manifest.jsonl")
    with pytest.raises(ConfigError, match="no manifest.jsonl there"):
        load_export(tmp_path)


def test_a_reward_the_verifier_no_longer_gives_is_one_line_naming_the_file_and_both_rewards(tmp_path: Path) -> None:
    rows = [_row([_message("Cold.")], task=t, reward=1.0) for t in range(3)]
    folder = export_atif(_run_files(tmp_path, rows), tmp_path / "atif").output_dir
    reverified = tmp_path / "re.jsonl"
    new = [r | {"reward": 0.0 if r["_ng_task_index"] == 1 else 1.0} for r in rows]
    reverified.write_text("".join(json.dumps(r) + "\n" for r in new))
    assert reward_mismatches(load_export(folder), reverified) == (
        [f"reward mismatch: {folder / '1-0.json'} (task 1, rollout 0): exported 1, verifier now 0"],
        3,
    )


def test_reverify_atif_flags_are_checked_before_anything_starts(tmp_path: Path, capsys) -> None:
    assert main(["eval", "reverify", "--input-format", "atif", "--output", str(tmp_path / "o.jsonl")]) == 1
    assert "--input-format atif needs --atif-manifest DIR" in capsys.readouterr().err
    assert main(["eval", "reverify", "--atif-manifest", str(tmp_path), "--rollouts", "r.jsonl"]) == 1
    assert "give --rollouts or --atif-manifest, not both" in capsys.readouterr().err
    assert main(["eval", "reverify", "--atif-manifest", str(tmp_path)]) == 1
    assert "no manifest.jsonl there" in capsys.readouterr().err


def test_an_export_of_another_exporter_is_read_with_the_runs_inputs_and_has_no_reward_to_compare(
    tmp_path: Path,
) -> None:
    """NeMo Gym 0.7's exporter keeps neither the task row nor the reward: --inputs gives the rows, nothing is compared."""
    document = {"schema_version": "ATIF-v1.7", "session_id": "r", "agent": {"name": "weather_agent", "version": "1"},
                "steps": [{"step_id": 1, "source": "user", "message": "Weather in Oslo?"},
                          {"step_id": 2, "source": "agent", "message": "Cold."}],
                "extra": {"nemo_gym": {"source": {"task_index": 3, "rollout_index": 1}}}}  # fmt: skip
    data = json.dumps(document).encode()
    (tmp_path / "3-1.json").write_bytes(data)
    entry = {"trajectory_path": "3-1.json", "_ng_task_index": 3, "_ng_rollout_index": 1,
             "expected_sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip
    (tmp_path / "manifest.jsonl").write_text(json.dumps(entry) + "\n")
    exported = load_export(tmp_path)
    assert [(item.key, item.reward) for item in exported] == [((3, 1), None)]
    with pytest.raises(ConfigError, match=r"3-1.json: \(task 3, rollout 1\) extra.nemo_gym.task: no task row kept"):
        write_stored_rollouts(exported, tmp_path / "stored.jsonl", tmp_path / "inputs.jsonl")
    task = {"responses_create_params": {"input": "Weather in Oslo?"}, "expected": "cold"}
    write_stored_rollouts(exported, tmp_path / "stored.jsonl", tmp_path / "inputs.jsonl", {(3, 1): task})
    (stored,) = [json.loads(line) for line in (tmp_path / "stored.jsonl").read_text().splitlines()]
    assert stored["reward"] is None and stored["agent_ref"] == {"name": "weather_agent"}
    assert [item["content"][0]["text"] for item in stored["response"]["output"]] == ["Cold."]
    (inputs,) = [json.loads(line) for line in (tmp_path / "inputs.jsonl").read_text().splitlines()]
    assert inputs == task | {"_ng_task_index": 3, "_ng_rollout_index": 1}
    reverified = tmp_path / "re.jsonl"
    reverified.write_text(json.dumps(stored | {"reward": 1.0}) + "\n")
    assert reward_mismatches(exported, reverified) == ([], 0)
