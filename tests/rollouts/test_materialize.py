"""Row materialization: agent refs, stable task identity, repeats, overrides, seeds, and input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.errors import ConfigError
from nemo_gym.rollouts.materialize import MaterializeOptions, materialize


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def dataset(tmp_path: Path, *rows: dict | str) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_repeats_indices_agent_refs_and_overrides(tmp_path):
    data = dataset(
        tmp_path,
        {"responses_create_params": {"input": "a"}},
        {"responses_create_params": {"input": "b"}, "agent_ref": {"name": "other"}},
    )
    result = materialize(
        MaterializeOptions(data, tmp_path / "out.jsonl", agent_name="main", num_repeats=2,
                           responses_create_params={"temperature": 0.5})
    )  # fmt: skip
    rows = rows_of(result.path)
    assert [(r["_ng_task_index"], r["_ng_rollout_index"], r["agent_ref"]["name"]) for r in rows] == [
        (0, 0, "main"), (0, 1, "main"), (1, 0, "other"), (1, 1, "other"),
    ]  # fmt: skip
    assert all(r["responses_create_params"]["temperature"] == 0.5 for r in rows)
    assert result.path.name == "out_materialized_inputs.jsonl"
    assert result.rollouts_per_agent == {"main": 2, "other": 2}


def test_identical_rows_share_a_task_regardless_of_key_order_and_whitespace(tmp_path):
    data = dataset(
        tmp_path,
        '{"responses_create_params": {"input": "a"}, "x": 1}',
        '{"x":1,   "responses_create_params":{"input":"a"}}',
        '{"responses_create_params": {"input": "b"}, "_ng_task_index": 7}',
    )
    rows = rows_of(materialize(MaterializeOptions(data, tmp_path / "o.jsonl", agent_name="a")).path)
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows] == [(0, 0), (0, 1), (7, 0)]


def test_limit_counts_rows_before_repeats_and_per_agent_repeats(tmp_path):
    data = dataset(tmp_path, *({"responses_create_params": {"input": str(i)}} for i in range(5)))
    result = materialize(
        MaterializeOptions(data, tmp_path / "o.jsonl", agent_name="a", limit=2, num_repeats={"a": 3, "_default": 1})
    )
    assert result.num_rows == 6 and result.num_tasks == 2


def test_repeat_seeds(tmp_path):
    data = dataset(tmp_path, {"responses_create_params": {"input": "a"}})
    rows = rows_of(
        materialize(MaterializeOptions(data, tmp_path / "o.jsonl", agent_name="a", num_repeats=2,
                                       num_repeats_add_seed=True)).path
    )  # fmt: skip
    assert [json.loads(r["responses_create_params"]["metadata"]["extra_body"])["seed"] for r in rows] == [0, 1]


def test_every_problem_is_reported_with_its_line(tmp_path):
    data = dataset(
        tmp_path,
        {"responses_create_params": {"input": "ok"}},
        {"responses_create_params": {"input": "x", "bogus_field": 1}},
        {"no_params": True},
        {"responses_create_params": {"input": "x"}, "agent_ref": {"name": "ghost"}},
    )
    with pytest.raises(ConfigError) as error:
        materialize(MaterializeOptions(data, tmp_path / "o.jsonl", agent_name="a", known_agents=["a"]))
    message = str(error.value)
    assert f"{data}:2: responses_create_params.bogus_field" in message
    assert f"{data}:3: missing responses_create_params" in message
    assert f"{data}:4: agent 'ghost' is not defined" in message
    assert not (tmp_path / "o_materialized_inputs.jsonl").exists()


def test_rows_without_agent_and_bad_limits(tmp_path):
    data = dataset(tmp_path, {"responses_create_params": {"input": "a"}})
    with pytest.raises(ConfigError, match="--agent"):
        materialize(MaterializeOptions(data, tmp_path / "o.jsonl"))
    with pytest.raises(ConfigError, match="limit"):
        materialize(MaterializeOptions(data, tmp_path / "o.jsonl", agent_name="a", limit=0))
    with pytest.raises(ConfigError, match="num_repeats"):
        materialize(MaterializeOptions(data, tmp_path / "o.jsonl", agent_name="a", num_repeats=0))


def test_the_only_agent_of_the_config_is_the_default(tmp_path):
    data = dataset(tmp_path, {"responses_create_params": {"input": "a"}})
    rows = rows_of(materialize(MaterializeOptions(data, tmp_path / "o.jsonl", known_agents=["solo"])).path)
    assert rows[0]["agent_ref"]["name"] == "solo"
    with pytest.raises(ConfigError, match=r"pass --agent NAME .*\(agents in the config: one, two\)"):
        materialize(MaterializeOptions(data, tmp_path / "o.jsonl", known_agents=["two", "one"]))


def test_a_problem_on_many_lines_is_reported_once_with_its_other_lines(tmp_path):
    data = dataset(tmp_path, *({"responses_create_params": {"input": "x"}} for _ in range(8)), {"no_params": 1})
    with pytest.raises(ConfigError) as error:
        materialize(MaterializeOptions(data, tmp_path / "o.jsonl", known_agents=["a", "b"]))
    message = str(error.value)
    assert message.count("no agent_ref") == 1
    assert f"{data}:1: no agent_ref in the row" in message and "(also lines 2, 3, 4, 5, 6, …)" in message
    assert f"{data}:9: missing responses_create_params" in message
    assert message.startswith(f"10 problem(s) in {data}: ")
