"""``gym dataset collate``: collation with agent refs and repeats, statistics, metrics conflicts, and bad input."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from nemo_gym.cli.commands.dataset import EXIT_INVALID_ROWS, EXIT_METRICS_CONFLICT
from nemo_gym.cli.legacy import main as legacy_main
from nemo_gym.cli.main import main
from nemo_gym.datasets.collate import CollateConfig, collate
from nemo_gym.global_config import parse_global_config_dict
from tests.datasets.conftest import (
    ENV_A_EXAMPLE,
    ENV_A_TRAIN,
    ENV_A_VALIDATION,
    ENV_B_EXAMPLE,
    ENV_B_TRAIN,
    env_config,
    read_rows,
    write_rows,
)
from tests.helpers import write

CONFIGS = ("--config", "configs/env_a.yaml", "--config", "configs/env_b.yaml")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def collate_cli(capsys, *extra: str, mode: str = "train_preparation") -> tuple[int, str, str]:
    return run(capsys, "dataset", "collate", *CONFIGS, "--mode", mode, "--output-dir", "out", *extra)


def agent(name: str) -> dict:
    return {"type": "responses_api_agents", "name": name}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_collates_two_environments_with_agent_refs_and_repeats(two_envs, capsys):
    code, out, err = collate_cli(capsys)
    assert code == 0, err

    train = read_rows(two_envs / "out" / "train.jsonl")
    a, b, c = ENV_A_TRAIN
    expected = [a, a, b, b, c, c, *ENV_B_TRAIN]  # each env_a row twice in a row (num_repeats: 2), config order
    assert [{k: v for k, v in r.items() if k != "agent_ref"} for r in train] == expected
    assert [r["agent_ref"] for r in train] == [agent("env_a_agent")] * 6 + [agent("env_b_agent")] * 2

    validation = read_rows(two_envs / "out" / "validation.jsonl")
    assert validation == [{**ENV_A_VALIDATION[0], "agent_ref": agent("env_a_agent")}]
    assert not (two_envs / "out" / "example.jsonl").exists()  # example datasets are out of scope in this mode

    for sidecar in ("env_a/train", "env_a/validation", "env_b/train"):
        assert (two_envs / "data" / f"{sidecar}_metrics.json").is_file()
    assert not (two_envs / "data" / "env_a" / "example_metrics.json").exists()
    assert load(two_envs / "out" / "train_metrics.json")["Number of examples"] == 8
    assert "train: " in out and "(8 rows)" in out


def test_dataset_statistics_match_hand_computed_values(two_envs, capsys):
    assert collate_cli(capsys)[0] == 0
    metrics = load(two_envs / "data" / "env_a" / "train_metrics.json")

    # The declaration heads the file.
    assert {k: metrics[k] for k in ("name", "type", "jsonl_fpath", "license", "num_repeats")} == {
        "name": "train", "type": "train", "jsonl_fpath": "data/env_a/train.jsonl", "license": "MIT", "num_repeats": 2,
    }  # fmt: skip
    # 3 valid rows, each counted twice (num_repeats: 2); averages and deviations are those of the 3 rows.
    assert metrics["Number of examples"] == 6
    assert metrics["Number of invalid rows"] == 0
    # tools per row [1, 0, 0]: mean 1/3, population std sqrt(2/9) = 0.4714
    assert metrics["Number of tools"] == {
        "Total # non-null values": 6, "Average": 0.333, "Min": 0, "Max": 1, "Standard deviation": 0.471,
    }  # fmt: skip
    # user messages per row [1, 2, 1]
    assert metrics["Number of turns"] == {
        "Total # non-null values": 6, "Average": 1.33, "Min": 1, "Max": 2, "Standard deviation": 0.471,
    }  # fmt: skip
    # words of json.dumps(responses_create_params), counted by hand: [10, 19, 3] -> mean 10.667, std 6.549
    assert metrics["Json-dumped number of words (proxy for token count)"] == {
        "Total # non-null values": 6, "Average": 10.67, "Min": 3, "Max": 19, "Standard deviation": 6.55,
    }  # fmt: skip
    # temperature set on two rows: [0.5, 1.0]
    assert metrics["Temperature"] == {
        "Total # non-null values": 4, "Average": 0.75, "Min": 0.5, "Max": 1.0, "Standard deviation": 0.25,
    }  # fmt: skip
    assert metrics["Top p"]["Total # non-null values"] == 0 and metrics["Top p"]["Average"] is None
    assert metrics["Number of unique create params"] == 3
    assert metrics["Number of unique user messages"] == 3  # "hi there", "q1", "q2"
    # other top-level fields: numbers get a stats block, strings get counts
    assert metrics["difficulty"] == {
        "Total # non-null values": 6, "Average": 2.0, "Min": 1, "Max": 3, "Standard deviation": 0.816,
    }  # fmt: skip
    assert metrics["category"] == {"unique_count": 2, "total_count": 6}

    aggregate = load(two_envs / "out" / "train_metrics.json")
    assert aggregate["Number of examples"] == 8
    assert aggregate["Number of unique user messages"] == 4  # + "hello"
    assert aggregate["Number of unique create params"] == 5
    assert aggregate["Top p"]["Total # non-null values"] == 1 and aggregate["Top p"]["Average"] == 0.9
    # difficulty 1, 3, 2 twice each, and 5 once: 17 / 7
    assert aggregate["difficulty"]["Total # non-null values"] == 7 and aggregate["difficulty"]["Average"] == 2.43
    assert [d["agent_name"] for d in aggregate["datasets"]] == ["env_a_agent", "env_b_agent"]


def test_second_run_with_unchanged_data_reports_no_conflict(two_envs, capsys):
    assert collate_cli(capsys)[0] == 0
    sidecar = two_envs / "data" / "env_a" / "train_metrics.json"
    before = (sidecar.read_bytes(), sidecar.stat().st_mtime_ns)

    code, out, err = collate_cli(capsys)
    assert code == 0, err
    assert "conflict" not in out + err
    assert out.count("(unchanged)") == 5  # three dataset sidecars, two aggregates
    assert (sidecar.read_bytes(), sidecar.stat().st_mtime_ns) == before  # not even rewritten


def test_changed_row_is_a_conflict_until_overwritten(two_envs, capsys):
    assert collate_cli(capsys)[0] == 0
    sidecar = two_envs / "data" / "env_a" / "train_metrics.json"
    original = sidecar.read_text()
    changed = [*ENV_A_TRAIN[:2], {**ENV_A_TRAIN[2], "difficulty": 9}]
    write_rows(two_envs / "data" / "env_a" / "train.jsonl", changed)

    code, out, err = collate_cli(capsys)
    assert code == EXIT_METRICS_CONFLICT
    assert f"metrics conflict: {sidecar}" in err
    assert "difficulty.Average: was 2.0, now 4.33" in err
    conflict = two_envs / "data" / "env_a" / "train_metrics_conflict.json"
    assert load(conflict)["difficulty"]["Max"] == 9
    assert sidecar.read_text() == original  # the reviewed file is left alone
    assert (two_envs / "out" / "train_metrics_conflict.json").is_file()  # the aggregate changed too

    code, out, err = collate_cli(capsys, "--overwrite-metrics")
    assert code == 0, err
    assert load(sidecar)["difficulty"]["Max"] == 9
    assert not conflict.exists()
    assert "(overwritten)" in out

    assert collate_cli(capsys)[0] == 0


def test_malformed_line_and_invalid_create_params_are_reported_and_left_out(two_envs, capsys):
    path = two_envs / "data" / "env_a" / "train.jsonl"
    write_rows(
        path,
        [
            ENV_A_TRAIN[0],
            '{"responses_create_params": {"input": "oops"',
            {"responses_create_params": {"input": "bad", "temperature": "hot"}},
            {"question": "no create params"},
            ENV_A_TRAIN[2],
        ],
    )
    code, out, err = collate_cli(capsys)
    assert code == EXIT_INVALID_ROWS
    assert f"{path}:2: not valid JSON" in err
    assert f"{path}:3: responses_create_params.temperature:" in err
    assert f"{path}:4: missing responses_create_params" in err
    assert "3 invalid row(s)" in err

    train = read_rows(two_envs / "out" / "train.jsonl")
    inputs = [r["responses_create_params"]["input"] for r in train]
    assert "bad" not in inputs and "oops" not in inputs and all("question" not in r for r in train)
    assert len(train) == 2 * 2 + len(ENV_B_TRAIN)
    metrics = load(two_envs / "data" / "env_a" / "train_metrics.json")
    assert metrics["Number of invalid rows"] == 3 and metrics["Number of examples"] == 4


def test_all_missing_files_are_reported_before_any_work(two_envs, capsys):
    (two_envs / "data" / "env_a" / "validation.jsonl").unlink()
    (two_envs / "data" / "env_b" / "train.jsonl").unlink()
    code, _, err = collate_cli(capsys)
    assert code == 1
    assert "env_a_agent/validation (validation): data/env_a/validation.jsonl not found" in err
    assert "env_b_agent/train (train): data/env_b/train.jsonl not found" in err
    assert not (two_envs / "out").exists()
    assert not (two_envs / "data" / "env_a" / "train_metrics.json").exists()


def test_train_datasets_need_a_license(workdir, capsys):
    write(
        workdir / "configs" / "env_a.yaml",
        env_config("env_a", "      - {name: t, type: train, jsonl_fpath: t.jsonl}\n"),
    )
    write_rows(workdir / "t.jsonl", ENV_A_VALIDATION)
    code, _, err = run(
        capsys, "dataset", "collate", "-c", "configs/env_a.yaml", "--mode", "train_preparation", "-o", "o"
    )
    assert code == 1 and "declares no `license:`" in err


def test_example_validation_mode_collates_example_datasets(two_envs, capsys):
    code, out, err = collate_cli(capsys, mode="example_validation")
    assert code == 0, err
    rows = read_rows(two_envs / "out" / "example.jsonl")
    assert rows == [
        {**ENV_A_EXAMPLE[0], "agent_ref": agent("env_a_agent")},
        {**ENV_B_EXAMPLE[0], "agent_ref": agent("env_b_agent")},
    ]
    assert sorted(p.name for p in (two_envs / "out").iterdir()) == ["example.jsonl", "example_metrics.json"]
    assert load(two_envs / "data" / "env_b" / "example_metrics.json")["Number of examples"] == 1


def test_legacy_prepare_data_with_overrides(two_envs, capsys):
    code = legacy_main(
        ["ng_prepare_data", "+config_paths=[configs/env_a.yaml,configs/env_b.yaml]", "+output_dirpath=legacy_out",
         "+mode=example_validation"]
    )  # fmt: skip
    assert code == 0
    assert len(read_rows(two_envs / "legacy_out" / "example.jsonl")) == 2
    assert "use `gym dataset collate`" in capsys.readouterr().err


def test_invalid_mode_is_a_clear_error(two_envs, capsys):
    code, _, err = collate_cli(capsys, mode="training")
    assert code == 1 and "mode" in err


def test_python_api(two_envs):
    config = parse_global_config_dict(["+config_paths=[configs/env_a.yaml,configs/env_b.yaml]"], dummy_model=True)
    result = collate(CollateConfig(output_dirpath=str(two_envs / "api"), mode="train_preparation"), config)
    assert result.rows_per_type == {"train": 8, "validation": 1}
    assert result.problems == [] and result.conflicts == []
    assert [r.metrics_file.status for r in result.datasets] == ["created"] * 3
    assert result.outputs["train"] == two_envs / "api" / "train.jsonl"


def test_output_dir_may_not_overwrite_a_dataset(two_envs, capsys):
    code, _, err = run(capsys, "dataset", "collate", *CONFIGS, "--mode", "train_preparation", "-o", "data/env_a")
    assert code == 1 and "would overwrite its dataset" in err
    assert len(read_rows(two_envs / "data" / "env_a" / "train.jsonl")) == 3


@pytest.fixture
def sourced_env(workdir: Path) -> Path:
    datasets = (
        "      - {name: train, type: train, jsonl_fpath: data/remote/train.jsonl, license: MIT,\n"
        "         source: {type: huggingface, repo_id: org/remote}}\n"
    )
    write(workdir / "configs" / "remote.yaml", env_config("remote", datasets))
    return workdir


def test_missing_sourced_dataset_needs_download_flag(sourced_env, capsys):
    code, _, err = run(
        capsys, "dataset", "collate", "-c", "configs/remote.yaml", "--mode", "train_preparation", "-o", "o"
    )
    assert code == 1 and "pass --download" in err and "huggingface" in err


def test_download_fetches_missing_sourced_datasets_first(sourced_env, capsys, monkeypatch):
    calls = []

    def download_dataset_source(dataset, global_config):
        calls.append((dataset.name, dataset.source.repo_id, global_config["data_source"]))
        return write_rows(sourced_env / dataset.jsonl_fpath, ENV_B_TRAIN)

    fake = types.ModuleType("nemo_gym.datasets.storage")
    fake.download_dataset_source = download_dataset_source
    monkeypatch.setitem(sys.modules, "nemo_gym.datasets.storage", fake)
    code, out, err = run(
        capsys,
        "dataset",
        "collate",
        "-c",
        "configs/remote.yaml",
        "--mode",
        "train_preparation",
        "-o",
        "o",
        "--download",
    )
    assert code == 0, err
    assert calls == [("train", "org/remote", "huggingface")]
    assert "Downloaded remote_agent/train (train)" in out
    assert len(read_rows(sourced_env / "o" / "train.jsonl")) == 2


def test_download_without_registry_support_is_a_clear_error(sourced_env, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "nemo_gym.datasets.storage", None)  # import fails
    code, _, err = run(
        capsys,
        "dataset",
        "collate",
        "-c",
        "configs/remote.yaml",
        "--mode",
        "train_preparation",
        "-o",
        "o",
        "--download",
    )
    assert code == 1 and "needs dataset download support (nemo_gym.datasets.storage)" in err


def test_benchmark_datasets_are_rendered_with_their_prompt_config(workdir, capsys):
    datasets = (
        "      - {name: bench, type: benchmark, jsonl_fpath: bench/data.jsonl, prepare_script: bench/prepare.py,\n"
        "         prompt_config: bench/prompt.yaml}\n"
    )
    write(workdir / "configs" / "bench.yaml", env_config("bench", datasets))
    write(workdir / "bench" / "prompt.yaml", "system: Be brief.\nuser: 'Q: {question}'\n")
    write_rows(workdir / "bench" / "data.jsonl", [{"question": "2+2?"}, {"answer": 4}])
    code, _, err = run(
        capsys, "dataset", "collate", "-c", "configs/bench.yaml", "--mode", "train_preparation", "-o", "o"
    )
    assert code == EXIT_INVALID_ROWS
    assert "data.jsonl:2: prompt field {question} is missing" in err
    [row] = read_rows(workdir / "o" / "benchmark.jsonl")
    assert row["responses_create_params"]["input"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q: 2+2?"},
    ]
    assert row["agent_ref"] == agent("bench_agent") and row["prompt_config_used"] == "bench/prompt.yaml"


def test_no_in_scope_datasets_is_an_error(two_envs, capsys):
    write(two_envs / "configs" / "bare.yaml", env_config("bare", "      - {name: e, type: example, jsonl_fpath: x}\n"))
    code, _, err = run(
        capsys, "dataset", "collate", "-c", "configs/bare.yaml", "--mode", "train_preparation", "-o", "o"
    )
    assert code == 1 and "no agent in the config declares a dataset of type train" in err


def test_a_file_declared_twice_gets_one_metrics_file(workdir, capsys):
    datasets = "      - {name: train, type: train, jsonl_fpath: shared.jsonl, license: MIT}\n"
    write(workdir / "configs" / "a.yaml", env_config("a", datasets))
    write(workdir / "configs" / "b.yaml", env_config("b", datasets))
    write_rows(workdir / "shared.jsonl", ENV_B_TRAIN)
    code, _, err = run(
        capsys, "dataset", "collate", "-c", "configs/a.yaml", "-c", "configs/b.yaml", "--mode", "train_preparation",
        "-o", "o",
    )  # fmt: skip
    assert code == 0, err
    rows = read_rows(workdir / "o" / "train.jsonl")
    assert [r["agent_ref"]["name"] for r in rows] == ["a_agent", "a_agent", "b_agent", "b_agent"]
    assert load(workdir / "shared_metrics.json")["Number of examples"] == 2
    assert load(workdir / "o" / "train_metrics.json")["Number of examples"] == 4
