"""NeMo Gym 0.7's small helpers, as its server folders use them: sandbox CPU caps, the process supervisor, sandboxed
agents' server helpers, deliverable files, task-data schemas and verifier fixtures."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import pytest
from omegaconf import OmegaConf

from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyRequest
from nemo_gym.config.server_models import ResourcesServerRef
from nemo_gym.deliverables import IGNORE_FILES, is_deliverable
from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.sandbox import agent_tools, process_supervisor
from nemo_gym.sandbox.utils import CPU_CAP_ENV_VARS, cpu_cap_env
from nemo_gym.server_utils import ServerClient
from nemo_gym.task_data import TaskDataValidator, load_task_data_schema, normalize_task_fields
from nemo_gym.verifier_fixture import VerifierFixture, VerifierFixtureError, exercise_verifier_fixture
from resources_servers.example_single_tool_call.app import (
    ExampleSingleToolCallResourcesServer,
    ExampleSingleToolCallResourcesServerConfig,
)

# -- sandbox.utils ----------------------------------------------------------------------------------------------------


def test_cpu_caps_follow_the_whole_cpus_of_a_limit() -> None:
    assert cpu_cap_env(None) == {}
    assert cpu_cap_env(2.7) == dict.fromkeys(CPU_CAP_ENV_VARS, "2")
    assert set(cpu_cap_env(0.25).values()) == {"1"}  # a fraction of a CPU still runs one worker
    assert "OMP_NUM_THREADS" in CPU_CAP_ENV_VARS and "MAKEFLAGS" not in CPU_CAP_ENV_VARS
    assert cpu_cap_env(4) | {"OMP_NUM_THREADS": "8"} == {**dict.fromkeys(CPU_CAP_ENV_VARS, "4"), "OMP_NUM_THREADS": "8"}


# -- sandbox.process_supervisor ----------------------------------------------------------------------------------------

SUPERVISOR = process_supervisor.__file__


def _supervise(tmp_path: Path, worker: str, *flags: str, wait_s: float = 60) -> tuple[int, dict[str, Any]]:
    receipt = tmp_path / "cleanup.json"
    argv = [sys.executable, "-I", SUPERVISOR, "--receipt", str(receipt), *flags, "--", sys.executable, "-c", worker]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=wait_s)
    return done.returncode, json.loads(receipt.read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# The worker leaves a grandchild in its own session (what a shell tool's daemon does), writes its pid, and exits.
ESCAPER = (
    "import subprocess, sys, pathlib; "
    "p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
    "pathlib.Path('escaped.pid').write_text(str(p.pid))"
)


def test_exec_timeout_leaves_room_for_every_cleanup_phase() -> None:
    budget = process_supervisor.exec_timeout(timeout=100)
    assert budget > 100 + 3 * process_supervisor.DEFAULT_CLEANUP_TIMEOUT
    assert process_supervisor.exec_timeout(timeout=100, cleanup_timeout=1) < budget


def test_the_supervisor_kills_what_the_worker_left_behind(tmp_path: Path) -> None:
    code, receipt = _supervise(tmp_path, ESCAPER, "--timeout", "30", "--cleanup-timeout", "5")
    assert (code, receipt) == (0, {"cleanup_confirmed": True, "return_code": 0, "error": None, "timed_out": False})
    escaped = int((tmp_path / "escaped.pid").read_text())
    assert not _alive(escaped)


def test_the_deadline_stops_the_worker_and_says_so(tmp_path: Path) -> None:
    worker = "import time; time.sleep(300)"
    code, receipt = _supervise(tmp_path, worker, "--timeout", "0.5", "--cleanup-timeout", "1")
    assert code == 0 and receipt["timed_out"] is True and receipt["cleanup_confirmed"] is True
    assert receipt["return_code"] == -signal.SIGTERM


def test_a_stop_file_fences_the_launch(tmp_path: Path) -> None:
    (tmp_path / "stop").touch()
    code, receipt = _supervise(tmp_path, "open('ran', 'w')", "--timeout", "30", "--stop-file", str(tmp_path / "stop"))
    assert code == 0 and receipt == {"cleanup_confirmed": True, "return_code": None, "error": None, "timed_out": False}
    assert not (tmp_path / "ran").exists()


def test_sigterm_stops_a_running_worker_without_calling_it_a_timeout(tmp_path: Path) -> None:
    receipt = tmp_path / "cleanup.json"
    worker = "import time, pathlib; pathlib.Path('up').touch(); time.sleep(300)"
    argv = [sys.executable, "-I", SUPERVISOR, "--timeout", "120", "--cleanup-timeout", "1", "--receipt", str(receipt)]
    process = subprocess.Popen([*argv, "--", sys.executable, "-c", worker], cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not (tmp_path / "up").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.terminate()
    assert process.wait(timeout=60) == 0
    assert json.loads(receipt.read_text())["timed_out"] is False


# -- sandbox.agent_tools -----------------------------------------------------------------------------------------------


def _run_config(monkeypatch: pytest.MonkeyPatch, **hosts: str) -> None:
    config = OmegaConf.create(
        {name: {"resources_servers": {"impl": {"host": host, "port": 9000}}} for name, host in hosts.items()}
    )
    monkeypatch.setattr(agent_tools, "get_global_config_dict", lambda: config)


def test_sandbox_server_url_reaches_wildcard_binds_over_loopback_unless_a_remote_sandbox_needs_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _run_config(monkeypatch, wild="0.0.0.0", wild6="::", named="10.0.0.7")
    assert agent_tools.sandbox_server_url("wild") == "http://127.0.0.1:9000"
    assert agent_tools.sandbox_server_url("wild6") == "http://[::1]:9000"
    assert agent_tools.sandbox_server_url("named", require_reachable=True) == "http://10.0.0.7:9000"
    with pytest.raises(ValueError, match="not reachable from a sandbox"):
        agent_tools.sandbox_server_url("wild", require_reachable=True)


def test_restricted_network_policy_fails_closed() -> None:
    assert agent_tools.restricted_network_policy("opensandbox", ["http://b.example:1", "http://a.example/x"]) == {
        "defaultAction": "deny",
        "egress": [{"action": "allow", "target": "a.example"}, {"action": "allow", "target": "b.example"}],
    }
    with pytest.raises(ValueError, match="OpenSandbox"):
        agent_tools.restricted_network_policy("docker", ["http://a.example"])
    for host in ("localhost", "127.0.0.2", "0.0.0.0", "[::1]"):
        with pytest.raises(ValueError, match="reachable"):
            agent_tools.restricted_network_policy("opensandbox", [f"http://{host}:8000"])


def _answer(body: dict[str, Any], status: int = 200) -> Any:
    return SimpleNamespace(ok=200 <= status < 300, status=status, read=lambda: _bytes(body))


async def _bytes(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


ROW = BaseRunRequest(responses_create_params={"input": "solve"})
RESPONSE = NeMoGymResponse.model_validate(
    {"id": "r", "created_at": 0, "model": "m", "object": "response", "parallel_tool_calls": False, "tool_choice": "auto",
     "tools": [], "output": [{"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                              "content": [{"type": "output_text", "text": "done", "annotations": []}]}]}
)  # fmt: skip


async def test_seed_mcp_servers_passes_only_the_session_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    _run_config(monkeypatch, tools="10.0.0.3")
    seed = {"mcp": {"url_path": "/mcp", "headers": {"X-NeMo-Gym-Session-Token": "scoped"}}}
    client = MagicMock(spec=ServerClient)
    client.post.return_value = _answer(seed)
    tools = [ResourcesServerRef(type="resources_servers", name="tools")]
    entries = await agent_tools.seed_mcp_servers(client, tools, ROW, {"c": "1"}, timeout_s=60, require_reachable=True)
    assert entries == {
        "tools": {
            "url": "http://10.0.0.3:9000/mcp",
            "headers": {"X-NeMo-Gym-Session-Token": "scoped"},
            "enabled": True,
            "timeout": 60000,
        }
    }
    assert client.post.call_args.kwargs["url_path"] == "/seed_session"
    client.post.return_value = _answer({})
    with pytest.raises(ValueError, match="authenticated MCP"):
        await agent_tools.seed_mcp_servers(client, tools, ROW, {}, timeout_s=60)


async def test_verify_agent_response_lets_the_verifier_score_a_failed_run() -> None:
    sent: list[dict[str, Any]] = []

    async def post(**kwargs: Any) -> Any:
        sent.append(kwargs["json"])
        return _answer(kwargs["json"] | {"reward": float(bool(kwargs["json"]["response"]["output"]))})

    client = MagicMock(spec=ServerClient)
    client.post.side_effect = post
    server = ResourcesServerRef(type="resources_servers", name="judge")
    scored = await agent_tools.verify_agent_response(client, server, ROW, RESPONSE, {}, force_zero_reward=False)
    assert scored["reward"] == 1.0 and "failure_kind" not in scored
    zeroed = await agent_tools.verify_agent_response(client, server, ROW, RESPONSE, {}, force_zero_reward=True)
    assert sent[-1]["response"]["output"] == []  # the verifier graded an empty response...
    assert zeroed["reward"] == 0.0 and zeroed["failure_kind"] == "agent_run_error"
    assert zeroed["response"]["output"][0]["id"] == "m1"  # ...and the real one comes back for inspection

    async def lenient(**kwargs: Any) -> Any:
        return _answer(kwargs["json"] | {"reward": 0.5})

    client.post.side_effect = lenient
    with pytest.raises(ValueError, match="unmasked 0"):
        await agent_tools.verify_agent_response(client, server, ROW, RESPONSE, {}, force_zero_reward=True)


# -- deliverables ------------------------------------------------------------------------------------------------------


def test_only_files_the_agent_produced_are_deliverables(tmp_path: Path) -> None:
    (tmp_path / "report.docx").write_text("work")
    (tmp_path / "history.json").write_text("[]")
    (tmp_path / "reference_files").mkdir()
    assert [p.name for p in sorted(tmp_path.iterdir()) if is_deliverable(p)] == ["report.docx"]
    assert {"history.json", "log.txt", "reference_files"} <= IGNORE_FILES


# -- task_data ---------------------------------------------------------------------------------------------------------

SCHEMA = """
from pydantic import BaseModel, ConfigDict, Field

class TaskData(BaseModel):
    model_config = ConfigDict(extra="allow")
    question: str
    expected_answer: str = Field(json_schema_extra={"legacy_location": "verifier_metadata"})
"""


def test_task_data_schema_validates_flat_legacy_and_materialized_rows(tmp_path: Path) -> None:
    assert load_task_data_schema(tmp_path) is None  # no task_data.py: the server has no schema yet
    (tmp_path / "task_data.py").write_text(SCHEMA)
    adapter = load_task_data_schema(tmp_path)
    assert adapter is not None
    legacy = {"responses_create_params": {}, "_ng_task_index": 3, "question": "q", "verifier_metadata": {"expected_answer": "a"}}  # fmt: skip
    fields, conflicts = normalize_task_fields(legacy)
    assert (fields, conflicts) == ({"question": "q", "expected_answer": "a"}, [])
    validator = TaskDataValidator("math", adapter, "rows.jsonl")
    validator.validate_row(0, legacy)
    validator.validate_row(1, {"question": "q", "task_data": {"expected_answer": "a"}})  # migrated
    validator.validate_row(2, {"task_id": {"taskset": "t", "task_id": "0"}, "task_input": {"question": "q", "task_data": {"expected_answer": "a"}}})  # fmt: skip
    assert validator.report.clean, validator.report.summary()

    validator.validate_row(3, {"question": "q", "expected_answer": "a"})  # the server reads it only from metadata
    validator.validate_row(4, {"expected_answer": "a", "verifier_metadata": {"expected_answer": "b"}, "qestion": "q"})
    report = validator.report
    assert (report.rows, report.error_rows) == (5, 1)
    assert report.misplaced_keys == {"expected_answer": 1}
    assert report.conflicting_keys == {"expected_answer": 1}
    assert "question" in report.summary()  # row 4 misspelt it, so the required field is missing
    assert "only at the top level: expected_answer (1 rows)" in report.summary()


def test_a_broken_schema_module_is_an_error_not_a_missing_schema(tmp_path: Path) -> None:
    from nemo_gym.task_data import TaskDataSchemaError

    (tmp_path / "task_data.py").write_text("Task = 1\n")
    with pytest.raises(TaskDataSchemaError, match="defines no `TaskData`"):
        load_task_data_schema(tmp_path)


# -- verifier_fixture --------------------------------------------------------------------------------------------------


def _weather_server() -> ExampleSingleToolCallResourcesServer:
    config = ExampleSingleToolCallResourcesServerConfig(host="0.0.0.0", port=8080, entrypoint="", name="weather")
    return ExampleSingleToolCallResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))


CALL = {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
RESULT = {"type": "function_call_output", "call_id": "c",
          "output": '{"city": "Oslo", "weather_description": "The weather in Oslo is cold."}'}  # fmt: skip
ANSWER = {"type": "message", "id": "m", "role": "assistant", "status": "completed",
          "content": [{"type": "output_text", "text": "Cold.", "annotations": []}]}  # fmt: skip


def _case(name: str, kind: str, output: list[dict[str, Any]] | None, **expect: Any) -> str:
    request: dict[str, Any] = {"responses_create_params": {"input": "weather?"}}
    if output is not None:
        request["response"] = RESPONSE.model_dump(mode="json") | {"output": output}
    return json.dumps({"name": name, "kind": kind, "request": request, **expect})


def _fixture(tmp_path: Path, *lines: str) -> VerifierFixture:
    path = tmp_path / "verifier_cases.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return VerifierFixture(server_factory=_weather_server, request_model=BaseVerifyRequest, cases_path=path)


GOOD = _case("tool then answer", "full_reward", [CALL, RESULT, ANSWER], expected_reward=1.0)
NO_TOOL = _case("answer only", "zero_reward", [ANSWER], expected_reward=0.0)
MALFORMED = _case("no response", "malformed", None, expected_error="response")


def test_a_verifier_gives_its_known_trajectories_their_rewards(tmp_path: Path) -> None:
    results = asyncio.run(
        exercise_verifier_fixture(
            _fixture(tmp_path, GOOD, NO_TOOL, MALFORMED), reward_range=(0, 1), determinism="unknown"
        )
    )
    assert [(r.kind, r.observed_rewards) for r in results] == [
        ("full_reward", (1.0,)),
        ("zero_reward", (0.0,)),
        ("malformed", ()),
    ]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ((GOOD, NO_TOOL), "lacks cases of kind: malformed"),
        ((_case("wrong", "full_reward", [ANSWER], expected_reward=1.0), NO_TOOL, MALFORMED), "not the best reward"),
        ((GOOD, NO_TOOL, _case("fine", "malformed", [CALL, ANSWER], expected_error="x")), "scored instead of failing"),
        ((GOOD, NO_TOOL, MALFORMED, _case("seeded", "determinism", [ANSWER], expected_reward=0.0)), "reseed"),
    ],
)
def test_a_verifier_that_drifted_from_its_cases_fails(tmp_path: Path, lines: tuple[str, ...], message: str) -> None:
    determinism = "seeded" if any('"determinism"' in line for line in lines) else "unknown"
    with pytest.raises(VerifierFixtureError, match=message):
        asyncio.run(exercise_verifier_fixture(_fixture(tmp_path, *lines), reward_range=(0, 1), determinism=determinism))


def test_update_expected_rewrites_the_rewards_after_an_intended_change(tmp_path: Path) -> None:
    stale = _case("tool then answer", "full_reward", [CALL, RESULT, ANSWER], expected_reward=0.0)
    fixture = _fixture(tmp_path, stale, NO_TOOL, MALFORMED)
    with pytest.raises(VerifierFixtureError, match="expects 0.0"):
        asyncio.run(exercise_verifier_fixture(fixture, reward_range=(0, 1), determinism="stochastic"))
    asyncio.run(exercise_verifier_fixture(fixture, reward_range=(0, 1), determinism="stochastic", update_expected=True))
    first = json.loads(Path(fixture.cases_path).read_text().splitlines()[0])
    assert first["expected_reward"] == 1.0
