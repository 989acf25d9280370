"""ATIF end to end (issue 35, item 3): a real run exported as ATIF v1.7 validates against the format, and
re-verifying the export against the real resources server gives back every reward; a changed reward is named.

The weather environment with the scripted model: its verifier reads the tool's outputs and the final answer, so
the rewards depend on exactly what the export must carry (tool calls, their outputs, messages). Tokyo gets a wrong
answer and Nairobi no tool call (reward 0); Oslo's turn starts with reasoning and compact arguments.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import atif
import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.cli.main import main

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

WEATHER = "example_single_tool_call"
DATA = INSTALL_DIR / "resources_servers" / WEATHER / "data" / "example.jsonl"


def _message(text: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]


def _call(city: str, arguments: str | None = None) -> dict[str, Any]:
    return {"type": "function_call", "name": "get_weather", "arguments": arguments or json.dumps({"city": city})}


SCRIPTS = [
    {"match": "Tokyo", "script": [[_call("Tokyo")], _message("It is sunny in Tokyo.")]},
    {"match": "Nairobi", "script": [_message("I cannot check the weather.")]},
    {"match": "Oslo", "script": [
        [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "Look it up first."}]},
         _call("Oslo", '{"city":"Oslo"}')],
        _message("Oslo is cold today."),
    ]},
]  # fmt: skip


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _key(row: dict[str, Any]) -> tuple[int, int]:
    return row["_ng_task_index"], row["_ng_rollout_index"]


def test_a_real_run_exported_as_atif_validates_and_reverifies_to_the_same_rewards(workdir: Path, capsys) -> None:
    scripts = workdir / "scripts.jsonl"
    scripts.write_text("".join(json.dumps(line) + "\n" for line in SCRIPTS))
    servers = ["+shared_venv=true", "+head_server={port: 0}", f"+cache_dir={workdir / 'cache'}"]
    rollouts = workdir / "results" / "weather.jsonl"
    run = ["eval", "run", "--resources-server", WEATHER, "--agent", f"{WEATHER}_simple_agent", "--model-type",
           "scripted_model", "--input", str(DATA), "--output", str(rollouts), "--no-health-check",
           f"++policy_model.responses_api_models.scripted_model.scripts_file={scripts}", *servers]  # fmt: skip
    assert main(run) == 0
    rows = {_key(row): row for row in _read(rollouts)}
    rewards = {key: row["reward"] for key, row in rows.items()}
    assert sorted(rewards.values()) == [0.0, 0.0, 1.0, 1.0, 1.0]

    export = workdir / "results" / "weather_atif"
    assert main(["eval", "export", "--format", "atif", "--rollouts", str(rollouts), "--output-dir", str(export),
                 "--agent-version", "1.2"]) == 0  # fmt: skip
    manifest = _read(export / "manifest.jsonl")
    assert sorted(_key(entry) for entry in manifest) == sorted(rows)
    for entry in manifest:
        data = (export / entry["trajectory_path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["expected_sha256"]
        document = json.loads(data)
        atif.Trajectory.model_validate(document)  # an independent model of the format
        assert document["schema_version"] == "ATIF-v1.7" and document["agent"]["version"] == "1.2"
        row = rows[_key(entry)]
        agent_steps = [s for s in document["steps"] if s["source"] == "agent"]
        calls = [c for s in agent_steps for c in s.get("tool_calls", [])]
        outputs = [item for item in row["response"]["output"] if item["type"] == "function_call"]
        assert [(c["tool_call_id"], c["function_name"]) for c in calls] == [(o["call_id"], o["name"]) for o in outputs]
        assert agent_steps[-1]["message"] == row["response"]["output"][-1]["content"][0]["text"]
        if "Oslo" in json.dumps(row["responses_create_params"]["input"]):
            assert agent_steps[0]["reasoning_content"] == "Look it up first."
            assert calls[0]["arguments"] == {"city": "Oslo"}
    capsys.readouterr()

    # scored again by the real resources server (started for it, as gym eval reverify does): every reward equal
    reverify = ["eval", "reverify", "--resources-server", WEATHER, "--atif-manifest", str(export), *servers,
                f"+results_dir={workdir / 'reverify_results'}"]  # fmt: skip
    assert main(reverify) == 0
    assert "All 5 re-verified rewards equal the exported ones." in capsys.readouterr().err
    reverified = _read(workdir / "results" / "weather_atif_reverified.jsonl")
    assert {_key(row): row["reward"] for row in reverified} == rewards
    assert all(row["response"]["output"] == rows[_key(row)]["response"]["output"] for row in reverified)

    # a trajectory handed over with a reward its verifier does not give (hash updated): one line, exit 4
    tampered = workdir / "results" / "tampered_atif"
    shutil.copytree(export, tampered)
    entry = next(e for e in manifest if rewards[_key(e)] == 1.0)
    document = json.loads((tampered / entry["trajectory_path"]).read_text())
    document["extra"]["nemo_gym"]["reward"] = 0.0
    data = json.dumps(document).encode()
    (tampered / entry["trajectory_path"]).write_bytes(data)
    entries = [e | {"expected_sha256": hashlib.sha256(data).hexdigest()} if e == entry else e for e in manifest]
    (tampered / "manifest.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    reverify[reverify.index(str(export))] = str(tampered)
    assert main([*reverify, "--output", str(workdir / "tampered.jsonl")]) == 4
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("reward mismatch")]
    task, rollout = _key(entry)
    assert lines == [
        f"reward mismatch: {tampered / entry['trajectory_path']} (task {task}, rollout {rollout}): "
        "exported 0, verifier now 1"
    ]
