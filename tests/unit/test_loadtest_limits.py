"""``gym env loadtest``'s numbers: the step counts read back from stamped files, the quantiles, the stated limits that
stop the ladder, the limit each step shows, the ladder flag, the scripts made from an environment's data, and the
health route's loop-lag probe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from nemo_gym.loadtest.config import LoadtestConfig
from nemo_gym.loadtest.limits import MachineUse, ServerUse, StepCounts, count_step, stated_limit, step_limit
from nemo_gym.loadtest.scripts import write_scripts
from nemo_gym.rollouts.latency import quantile
from nemo_gym.row_fields import FAILURE_CLASS_KEY, ROLLOUT_SECONDS_KEY, ROLLOUT_STARTED_AT_KEY
from nemo_gym.transport.types import LOOP_LAG_HEADER


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _stamped(started: float, seconds: float, **extra: object) -> dict[str, object]:
    return {ROLLOUT_STARTED_AT_KEY: started, ROLLOUT_SECONDS_KEY: seconds, **extra}


def test_quantiles_interpolate_between_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert quantile(values, 0.5) == 3.0
    assert quantile(values, 0.99) == pytest.approx(4.96)
    assert quantile(values, 0.0) == 1.0
    assert quantile([], 0.5) is None


def test_a_step_is_counted_from_its_stamped_files(tmp_path: Path) -> None:
    rollouts = _write(tmp_path / "c4.jsonl", [_stamped(100.0, 0.5), _stamped(100.2, 1.0), _stamped(101.0, 2.0)])
    failures = _write(
        tmp_path / "c4_failures.jsonl",
        [
            _stamped(100.1, 0.2, **{FAILURE_CLASS_KEY: "verify_failed"}),
            _stamped(104.0, 1.0, **{FAILURE_CLASS_KEY: "timeout"}),
        ],
    )
    counts = count_step(rollouts, failures)
    assert (counts.completed, counts.failed) == (3, 2)
    assert counts.window_s == pytest.approx(5.0)  # first start 100.0, last end 104.0 + 1.0 (a failure's)
    assert counts.rollouts_per_s == pytest.approx(3 / 5.0)
    assert counts.latencies_s == [0.5, 1.0, 2.0]
    assert counts.latency_ms(0.5) == pytest.approx(1000.0)
    assert counts.failure_rate == pytest.approx(0.4)
    assert dict(counts.failures_by_class) == {"verify_failed": 1, "timeout": 1}


def test_a_step_without_failures_file_and_a_record_without_stamps(tmp_path: Path) -> None:
    rollouts = _write(tmp_path / "c1.jsonl", [_stamped(10.0, 1.0)])
    assert count_step(rollouts, tmp_path / "missing.jsonl").completed == 1
    _write(rollouts, [{"reward": 1.0}])
    with pytest.raises(ValueError, match=ROLLOUT_STARTED_AT_KEY):
        count_step(rollouts, tmp_path / "missing.jsonl")


def _counts(completed: int, failed: int, latencies: list[float], window: float = 10.0, **classes: int) -> StepCounts:
    counts = StepCounts(completed=completed, failed=failed, window_s=window, latencies_s=sorted(latencies))
    counts.failures_by_class.update(classes)
    return counts


def test_the_stated_limits_stop_the_ladder() -> None:
    fine = _counts(99, 1, [0.1] * 99)
    assert stated_limit(fine, max_failure_rate=0.05, max_p99_ms=None) is None
    failing = _counts(90, 10, [0.1] * 90, timeout=10)
    assert stated_limit(failing, 0.05, None) == "failure rate 10.0% > 5.0% (timeout 10)"
    slow = _counts(100, 0, [0.1] * 98 + [3.0, 3.0])
    assert stated_limit(slow, 0.05, None) is None
    assert stated_limit(slow, 0.05, max_p99_ms=500) == "p99 3000 ms > 500 ms"
    assert stated_limit(_counts(0, 0, []), 0.05, None) == "no rollout finished in the step"


def _machine(busy: float = 0.2, memory: float = 0.3) -> MachineUse:
    return MachineUse(cpus=2, busy_share=busy, peak_memory_share=memory, ours_cores=0.5)


def test_each_limit_a_step_can_show_in_order() -> None:
    counts, wall = _counts(100, 0, [0.1] * 100), 10.0
    calm = [ServerUse("agent", "responses_api_agents", cpu_s=1.0, peak_fds=10, fd_limit=1024, loop_lag_s=[0.001])]
    assert step_limit(counts, None, calm, _machine(), wall) is None

    fds = [ServerUse("agent", "responses_api_agents", peak_fds=900, fd_limit=1024)]
    assert step_limit(counts, None, fds, _machine(), wall) == "file descriptors: agent held 900 of its limit 1024"
    assert step_limit(counts, None, calm, _machine(memory=0.95), wall).startswith("memory: 95%")

    env = [ServerUse("weather", "resources_servers", cpu_s=9.5)]
    assert step_limit(counts, None, env, _machine(), wall) == (
        "CPU: weather, the environment's own tools and verify, used 0.95 CPU-s per s (its event loop's one core)"
    )
    agent = [ServerUse("agent", "responses_api_agents", cpu_s=9.5)]
    said = step_limit(counts, None, agent, _machine(), wall)
    assert said == "CPU: agent, used 0.95 CPU-s per s (its event loop's one core)"
    workers = [ServerUse("code", "resources_servers", cpu_s=15.0, processes=5)]  # 1.5 of the machine's 2 cores
    assert step_limit(counts, None, workers, _machine(), wall) is None
    workers[0].cpu_s = 19.0
    said = step_limit(counts, None, workers, _machine(), wall)
    assert said is not None and said.endswith("used 1.90 CPU-s per s (2 cores for its processes)")

    shared = step_limit(counts, None, calm, _machine(busy=0.97), wall)
    assert shared == (
        "machine CPU: 97% of 2 CPUs busy; our processes 0.50 cores of it (the most: agent, 0.10), "
        "the rest other processes"
    )

    lagging = [ServerUse("model", "responses_api_models", loop_lag_s=[0.001, 0.25])]
    assert step_limit(counts, None, lagging, _machine(), wall) == "event loop: model answered a lag probe 250 ms late"

    before = _counts(95, 0, [0.1] * 95)
    assert step_limit(counts, before, calm, _machine(), wall).startswith("throughput stopped rising (9.5 -> 10.0")
    assert step_limit(counts, _counts(50, 0, [0.1] * 50), calm, _machine(), wall) is None


def test_the_ladder_flag_is_comma_separated_and_rising() -> None:
    assert LoadtestConfig(loadtest_output_fpath="r.json", loadtest_concurrency="4,16, 64").loadtest_concurrency == [
        4,
        16,
        64,
    ]
    for bad, said in (("4,x", "comma-separated integers"), ("16,4", "must rise"), ("0,4", "at least 1")):
        with pytest.raises(ValidationError, match=said):
            LoadtestConfig(loadtest_output_fpath="r.json", loadtest_concurrency=bad)


def test_scripts_come_from_shipped_scripts_else_from_example_rollouts(tmp_path: Path) -> None:
    shipped, recorded = tmp_path / "shipped", tmp_path / "recorded"
    shipped.mkdir()
    recorded.mkdir()
    script = {"match": "task-1", "script": [[{"type": "message", "role": "assistant", "content": []}]]}
    _write(shipped / "example_scripts.jsonl", [script])
    _write(shipped / "example_rollouts.jsonl", [{"ignored": True}])
    call = {"type": "function_call", "name": "get_weather", "arguments": "{}", "id": "c1", "status": "completed"}
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Cold."}]}
    rollout = {
        "responses_create_params": {
            "input": [{"role": "system", "content": "s"}, {"role": "user", "content": "Paris?"}]
        },
        "response": {"output": [call, {"type": "function_call_output", "output": "{}"}, answer]},
    }
    _write(recorded / "example_rollouts.jsonl", [rollout])
    out = tmp_path / "scripts.jsonl"
    assert write_scripts([shipped, recorded, tmp_path / "none"], out) == 2
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert written[0] == script
    assert written[1] == {
        "match": "Paris?",
        "script": [
            [{"type": "function_call", "name": "get_weather", "arguments": "{}"}],
            [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Cold."}]}],
        ],
    }
    assert write_scripts([tmp_path / "none"], out) == 0 and not out.exists()


def test_the_health_route_reports_its_loop_lag_only_when_asked() -> None:
    from nemo_gym.server_utils import ServerClient
    from responses_api_models.scripted_model.app import ScriptedModel, ScriptedModelConfig

    config = ScriptedModelConfig(name="policy_model", host="127.0.0.1", port=0, entrypoint="app.py")
    server = ScriptedModel(config=config, server_client=MagicMock(spec=ServerClient))
    client = TestClient(server.setup_webserver())
    assert LOOP_LAG_HEADER not in client.get("/").headers
    lag = float(client.get("/?loop_lag=1").headers[LOOP_LAG_HEADER])
    assert 0 <= lag < 5


def _composed(*configs: str) -> Any:
    from nemo_gym import INSTALL_DIR
    from nemo_gym.config.compose import ComposeOptions, compose

    paths = ",".join(str(INSTALL_DIR / c) for c in configs)
    return compose(ComposeOptions(overrides=[f"+config_paths=[{paths}]"], allow_unset=True))


CODE_GEN = "resources_servers/code_gen/configs/code_gen.yaml"
SCRIPTED = "responses_api_models/scripted_model/configs/scripted_model.yaml"


def test_the_scripted_model_gets_the_latency_and_the_environments_scripts(tmp_path: Path) -> None:
    from nemo_gym.cli.commands.loadtest import scripted_model_overrides
    from nemo_gym.errors import ConfigError

    settings = LoadtestConfig(loadtest_output_fpath=str(tmp_path / "cg.json"), loadtest_model_latency_ms=250)
    said: list[str] = []
    extra = scripted_model_overrides(_composed(CODE_GEN, SCRIPTED), settings, said.append)
    scripts = tmp_path / "cg_steps" / "scripts.jsonl"
    assert extra == [
        "++policy_model.responses_api_models.scripted_model.reply_delay_s=0.25",
        f"++policy_model.responses_api_models.scripted_model.scripts_file={scripts}",
    ]
    assert len(scripts.read_text().splitlines()) == 5 and "5 example scripts" in said[0]
    with pytest.raises(ConfigError, match="add --model-type scripted_model"):
        scripted_model_overrides(_composed(CODE_GEN), settings, said.append)
