"""The arithmetic benchmark and the benchmark commands: generation, `gym eval prepare`, `gym list benchmarks`, and a
scripted end-to-end `gym eval run --benchmark arithmetic --split benchmark`.

Commands run in a temporary working directory holding a copy of ``benchmarks/arithmetic`` (cwd is searched before
the install root), so prepared data never lands in the checkout.
"""

from __future__ import annotations

import ast
import json
import operator
import shutil
from pathlib import Path

import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.benchmarks import load_script
from nemo_gym.cli.main import main
from nemo_gym.errors import ConfigError
from nemo_gym.global_config import parse_global_config_dict
from nemo_gym.rollouts.config import RolloutCollectionConfig
from nemo_gym.rollouts.run import prepare_split_input
from tests.helpers import write

SOURCE = INSTALL_DIR / "benchmarks" / "arithmetic"
REPO_DATA = SOURCE / "data" / "arithmetic.jsonl"
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(question: str) -> int:
    """An independent check of an expected answer: parse the expression and fold it (only + - × on integers)."""

    def fold(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](fold(node.left), fold(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        raise AssertionError(f"unexpected syntax in {question!r}: {ast.dump(node)}")

    return fold(ast.parse(question.replace("×", "*"), mode="eval").body)


@pytest.fixture
def bench_root(workdir: Path) -> Path:
    """``workdir`` with a copy of the benchmark (no data)."""
    shutil.copytree(
        SOURCE, workdir / "benchmarks" / "arithmetic", ignore=shutil.ignore_patterns("*.jsonl", "__pycache__")
    )
    return workdir


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------------------------------
# Generation


def test_generation_is_deterministic_distinct_and_correct():
    module = load_script(SOURCE / "prepare.py")
    rows = module.generate(200)
    assert rows == module.generate(200, seed=0)
    assert rows[:50] == module.generate(50)  # the first N do not depend on how many more are asked for
    assert rows != module.generate(200, seed=1)
    assert len({row["question"] for row in rows}) == 200
    assert {row["operation"] for row in rows} == {"add", "sub", "mul", "two_step", "multi_digit"}
    assert any("(" in row["question"] for row in rows) and any(int(row["expected_answer"]) > 9999 for row in rows)
    for row in rows:
        assert row["expected_answer"] == str(evaluate(row["question"])), row
        assert "responses_create_params" not in row  # raw tasks: prompt.yaml renders them
    with pytest.raises(ValueError, match="at least 1"):
        module.generate(0)


def test_prepare_writes_atomically_and_returns_its_path(tmp_path, monkeypatch):
    module = load_script(SOURCE / "prepare.py")
    target = tmp_path / "data" / "arithmetic.jsonl"
    monkeypatch.setattr(module, "DATA_PATH", target)
    assert module.prepare(num_problems=7, seed=3, unknown_option=True) == target
    assert read_rows(target) == module.generate(7, seed=3)
    assert [p.name for p in target.parent.iterdir()] == ["arithmetic.jsonl"]  # no temporary left behind


# --------------------------------------------------------------------------------------------------------------------
# gym eval prepare


def test_eval_prepare_writes_the_benchmark_file_and_honours_the_cache(bench_root, capsys):
    repo_before = REPO_DATA.stat().st_mtime_ns if REPO_DATA.exists() else None
    code, out, err = run(
        capsys, "eval", "prepare", "--benchmark", "arithmetic", "+prepare_script_args={num_problems: 50}"
    )
    assert code == 0, err
    data = bench_root / "benchmarks" / "arithmetic" / "data" / "arithmetic.jsonl"
    assert len(read_rows(data)) == 50 and "prepared" in out and "50 rows" in out
    stamp = data.stat().st_mtime_ns
    code, out, err = run(
        capsys, "eval", "prepare", "--benchmark", "arithmetic", "+use_cached_prepared_benchmarks=true",
        "+prepare_script_args={num_problems: 10}",
    )  # fmt: skip
    assert code == 0, err
    assert "cached" in out and data.stat().st_mtime_ns == stamp and len(read_rows(data)) == 50
    code, _, err = run(
        capsys, "eval", "prepare", "--benchmark", "arithmetic", "+prepare_script_args={num_problems: 10}"
    )
    assert code == 0, err
    assert len(read_rows(data)) == 10  # without the cache flag it is regenerated
    assert (REPO_DATA.stat().st_mtime_ns if REPO_DATA.exists() else None) == repo_before


AGENT = """
{agent}:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {{type: resources_servers, name: string_match}}
      model_server: {{type: responses_api_models, name: policy_model}}
      datasets:
"""
BENCHMARK_AGENT = AGENT + (
    "      - {{name: {agent}, type: benchmark, jsonl_fpath: {data}, prepare_script: {script}, num_repeats: 2}}\n"
)
GOOD_SCRIPT = """
from pathlib import Path


def prepare(rows: int = 3, **_):
    path = Path(__file__).parent / "data" / "{name}.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join('{{"n": %d}}\\n' % i for i in range(rows)))
    return path
"""


def _suite(root: Path, scripts: dict[str, str]) -> Path:
    """A config with one benchmark agent per script (script text, or None for a script that does not exist)."""
    blocks = []
    for name, text in scripts.items():
        script = root / "suite" / f"{name}.py"
        if text is not None:
            write(script, text.format(name=name))
        blocks.append(BENCHMARK_AGENT.format(agent=name, data=root / "suite" / "data" / f"{name}.jsonl", script=script))
    string_match = INSTALL_DIR / "resources_servers" / "string_match" / "configs" / "string_match.yaml"
    return write(root / "suite" / "config.yaml", f"config_paths: [{string_match}]\n" + "".join(blocks))


def test_eval_prepare_runs_several_benchmarks_in_processes(workdir, capsys):
    config = _suite(workdir, {"first": GOOD_SCRIPT, "second": GOOD_SCRIPT})
    code, out, err = run(
        capsys, "eval", "prepare", "--config", str(config), "+num_prepare_benchmark_processes=2",
        "+prepare_script_args={rows: 4}",
    )  # fmt: skip
    assert code == 0, err
    for name in ("first", "second"):
        assert len(read_rows(workdir / "suite" / "data" / f"{name}.jsonl")) == 4 and name in out


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (None, "not found"),
        ("x = 1\n", "defines no prepare"),
        ("prepare = 3\n", "defines no prepare"),
        ("raise RuntimeError('boom')\n", "failed to import: RuntimeError: boom"),
    ],
    ids=["missing", "no function", "not callable", "import error"],
)
def test_a_bad_prepare_script_is_one_error_line_before_anything_runs(workdir, capsys, broken, message):
    config = _suite(workdir, {"good": GOOD_SCRIPT, "bad": broken})
    code, out, err = run(capsys, "eval", "prepare", "--config", str(config))
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "benchmark 'bad'" in lines[0] and message in lines[0] and "Traceback" not in err
    assert not (workdir / "suite" / "data" / "good.jsonl").exists()  # the good one did not run either


def test_prepare_must_write_where_jsonl_fpath_points(workdir, capsys):
    elsewhere = GOOD_SCRIPT.replace('"data" / "{name}.jsonl"', '"elsewhere.jsonl"')
    config = _suite(workdir, {"astray": elsewhere})
    code, _, err = run(capsys, "eval", "prepare", "--config", str(config))
    assert code == 1 and "jsonl_fpath" in err and "elsewhere.jsonl" in err


def test_eval_prepare_without_a_benchmark_says_how_to_pick_one(workdir, capsys):
    code, _, err = run(capsys, "eval", "prepare", "--resources-server", "string_match")
    assert code == 1 and "--benchmark NAME" in err


# --------------------------------------------------------------------------------------------------------------------
# gym list benchmarks and the --benchmark selector


def test_list_benchmarks_json_and_discovery_rules(workdir, capsys):
    write(workdir / "benchmarks" / "perf_script" / "run.py", "print('not an eval benchmark')\n")
    write(workdir / "benchmarks" / "perf_script" / "settings.yaml", "iterations: 3\n")  # no benchmark dataset
    nested = (SOURCE / "config.yaml").read_text()
    write(workdir / "benchmarks" / "suite" / "v2.yaml", nested)
    code, out, err = run(capsys, "list", "benchmarks", "--json")
    assert code == 0, err
    rows = {row["name"]: row for row in json.loads(out)}
    assert "perf_script" not in rows and "rollout_overhead" not in rows
    arithmetic = rows["arithmetic"]
    assert arithmetic["kind"] == "benchmark" and arithmetic["agent"] == "arithmetic_simple_agent"
    assert arithmetic["num_repeats"] == 4 and arithmetic["domain"] == "math" and arithmetic["description"]
    assert arithmetic["jsonl_fpath"] == "benchmarks/arithmetic/data/arithmetic.jsonl"
    assert "suite/v2" in rows
    code, out, _ = run(capsys, "list", "benchmarks", "arithmetic")
    assert code == 0 and "gym eval prepare --benchmark arithmetic" in out
    code, out, _ = run(capsys, "search", "arithmetc", "--json")
    assert "arithmetic" in [row["name"] for row in json.loads(out)]
    code, out, err = run(capsys, "env", "resolve", "--benchmark", "suite/v2")
    assert code == 0 and "arithmetic_resources_server" in out, err


def test_benchmark_selector_composes_isolated_instances(capsys):
    code, out, err = run(capsys, "env", "validate", "--benchmark", "arithmetic")
    assert code == 0, err
    assert "arithmetic_resources_server" in out and "arithmetic_simple_agent" in out
    assert "string_match_simple_agent" not in out  # inherited instances are moved, not started twice
    code, _, err = run(capsys, "env", "validate", "--benchmark", "rollout_overhead")
    assert code == 1 and "--benchmark 'rollout_overhead'" in err


# --------------------------------------------------------------------------------------------------------------------
# --split benchmark input


def test_split_input_renders_benchmark_rows_once_and_reports_their_num_repeats(bench_root, capsys):
    config_path = bench_root / "benchmarks" / "arithmetic" / "config.yaml"
    config = parse_global_config_dict([f"+config_paths=[{config_path}]"], dummy_model=True)
    with pytest.raises(ConfigError, match="gym eval prepare --benchmark"):
        prepare_split_input(config, "benchmark", bench_root / "split.jsonl")
    assert run(capsys, "eval", "prepare", "--benchmark", "arithmetic", "+prepare_script_args={num_problems: 3}")[0] == 0
    split = prepare_split_input(config, "benchmark", bench_root / "split.jsonl")
    assert split.num_repeats == {"arithmetic_simple_agent": 4}
    rows = read_rows(split.path)
    assert len(rows) == 3  # written once; the repeats are applied when rollouts are materialized
    for row in rows:
        system, user = row["responses_create_params"]["input"]
        assert system["role"] == "system" and row["question"] in user["content"] and "\\boxed{}" in user["content"]
        assert row["agent_ref"] == {"type": "responses_api_agents", "name": "arithmetic_simple_agent"}
    with pytest.raises(ConfigError, match="no agent"):
        prepare_split_input(config, "train", bench_root / "split.jsonl")


def test_split_input_duplicates_rows_when_an_agents_datasets_disagree_on_num_repeats(workdir):
    write(workdir / "a.jsonl", '{"responses_create_params": {"input": "a"}}\n')
    write(workdir / "b.jsonl", '{"responses_create_params": {"input": "b"}}\n')
    config_text = AGENT.format(agent="mixed") + (
        "      - {name: a, type: example, jsonl_fpath: a.jsonl, num_repeats: 1}\n"
        "      - {name: b, type: example, jsonl_fpath: b.jsonl, num_repeats: 3}\n"
    )
    string_match = INSTALL_DIR / "resources_servers" / "string_match" / "configs" / "string_match.yaml"
    config_path = write(workdir / "mixed.yaml", f"config_paths: [{string_match}]\n{config_text}")
    config = parse_global_config_dict([f"+config_paths=[{config_path}]"], dummy_model=True)
    split = prepare_split_input(config, "example", workdir / "split.jsonl")
    inputs = [row["responses_create_params"]["input"] for row in read_rows(split.path)]
    assert split.num_repeats["mixed"] == 1 and inputs.count("a") == 1 and inputs.count("b") == 3
    assert split.num_repeats["string_match_simple_agent"] == 1


def test_an_explicit_num_repeats_is_told_apart_from_the_default():
    assert "num_repeats" not in RolloutCollectionConfig.model_validate({"output_jsonl_fpath": "x"}).model_fields_set
    given = RolloutCollectionConfig.model_validate({"output_jsonl_fpath": "x", "num_repeats": 1})
    assert "num_repeats" in given.model_fields_set


# --------------------------------------------------------------------------------------------------------------------
# End to end


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_eval_run_benchmark_split_with_a_scripted_model(bench_root, capsys):
    code, _, err = run(capsys, "eval", "prepare", "--benchmark", "arithmetic", "+prepare_script_args={num_problems: 5}")
    assert code == 0, err
    first, second = read_rows(bench_root / "benchmarks" / "arithmetic" / "data" / "arithmetic.jsonl")[:2]
    assert first["expected_answer"] != second["expected_answer"]
    reply = {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": f"Adding up: \\boxed{{{first['expected_answer']}}}"}]}  # fmt: skip
    body = {"policy_model": {"responses_api_models": {"scripted_model": {"script": [[reply]]}}}}
    script = write(bench_root / "script.yaml", json.dumps(body))
    output = bench_root / "results" / "arithmetic.jsonl"
    code, _, err = run(
        capsys, "eval", "run", "--benchmark", "arithmetic", "--model-type", "scripted_model", "--config", str(script),
        "--split", "benchmark", "--limit", "2", "--output", str(output), "+shared_venv=true", "+head_server={port: 0}",
        f"+results_dir={bench_root / 'results'}", f"+cache_dir={bench_root / 'cache'}",
    )  # fmt: skip
    assert code == 0, err
    rollouts = sorted(read_rows(output), key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
    assert len(rollouts) == 8  # 2 tasks x the dataset's num_repeats (4)
    assert [r["reward"] for r in rollouts] == [1.0] * 4 + [0.0] * 4
    assert {r["extracted_answer"] for r in rollouts} == {first["expected_answer"]}
    assert (
        rollouts[0]["question"] == first["question"] and rollouts[0]["agent_ref"]["name"] == "arithmetic_simple_agent"
    )
    prompt = rollouts[0]["responses_create_params"]["input"][-1]["content"]
    assert "\\boxed{}" in prompt and first["question"] in prompt
    (metrics,) = json.loads((bench_root / "results" / "arithmetic_aggregate_metrics.json").read_text())
    assert metrics["agent_metrics"]["mean/reward"] == 0.5
    assert metrics["key_metrics"]["majority@4"] == 0.5 and metrics["key_metrics"]["no_answer"] == 0.0
