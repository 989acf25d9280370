"""gym env init creates a server that passes its own tests in its own venv and serves rollouts; gym env test reports."""

from __future__ import annotations

import json

import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.authoring.server_tests import validate_server_data
from nemo_gym.cli.main import main
from tests.helpers import write

pytestmark = pytest.mark.timeout(300)


@pytest.mark.e2e
def test_init_then_test_then_eval_run(workdir, capsys):
    assert main(["env", "init", "--resources-server", "my_env"]) == 0
    server = workdir / "resources_servers" / "my_env"
    assert (server / "app.py").is_file() and (server / "configs" / "my_env.yaml").is_file()
    assert len((server / "data" / "example.jsonl").read_text().splitlines()) == 5

    code = main(["env", "test", "--resources-server", "my_env", f"+cache_dir={workdir / 'cache'}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "resources_servers/my_env" in out and "passed" in out and "1 passed, 0 failed" in out
    assert list((workdir / "cache" / "venvs" / "resources_servers").glob("my_env-*")), "tests ran in the server's venv"
    assert "venv for resources_servers/my_env ready" in out and "\n + " not in out  # uv's package list stays quiet

    requirements = server / "requirements.txt"
    requirements.write_text(requirements.read_text() + "this is not a requirement !!\n")
    code = main(["env", "test", "--resources-server", "my_env", f"+cache_dir={workdir / 'cache'}"])
    out = capsys.readouterr().out
    assert code == 1 and "venv failed" in out
    assert "this is not a requirement" in out  # a failed build shows what uv said
    requirements.write_text(requirements.read_text().replace("this is not a requirement !!\n", ""))

    script = write(workdir / "script.yaml", json.dumps(
        {"policy_model": {"responses_api_models": {"scripted_model": {"script": [[
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "apple"}]}
        ]]}}}}
    ))  # fmt: skip
    scripted = INSTALL_DIR / "responses_api_models" / "scripted_model" / "configs" / "scripted_model.yaml"
    code = main([
        "eval", "run", "--resources-server", "my_env", "--config", str(scripted), "--config", str(script),
        "--agent", "my_env_simple_agent", "--input", str(server / "data" / "example.jsonl"),
        "--output", str(workdir / "results" / "my_env.jsonl"), "+shared_venv=true", "+head_server={port: 0}",
        f"+results_dir={workdir / 'results'}", f"+cache_dir={workdir / 'cache'}",
    ])  # fmt: skip
    assert code == 0, capsys.readouterr()
    rows = [json.loads(line) for line in (workdir / "results" / "my_env.jsonl").read_text().splitlines()]
    assert sorted(row["reward"] for row in rows) == [0.0, 0.0, 0.0, 0.0, 1.0]  # "apple" is right for one row


def test_init_refuses_bad_names_and_existing_directories(workdir, capsys):
    assert main(["env", "init", "--resources-server", "not-valid"]) == 1
    assert "not a valid resources server name" in capsys.readouterr().err
    assert main(["env", "init", "--resources-server", "twice"]) == 0
    assert main(["env", "init", "--resources-server", "twice"]) == 1
    assert "already exists" in capsys.readouterr().err


def test_legacy_init_spelling(workdir):
    from nemo_gym.cli.legacy import main as legacy_main

    assert legacy_main(["ng_init_resources_server", "+entrypoint=resources_servers/old_style"]) == 0
    assert (workdir / "resources_servers" / "old_style" / "app.py").is_file()


def test_a_failing_server_fails_the_run_and_unknown_servers_get_a_hint(workdir, capsys):
    assert main(["env", "init", "--resources-server", "broken_env"]) == 0
    tests = workdir / "resources_servers" / "broken_env" / "tests" / "test_app.py"
    tests.write_text(tests.read_text() + "\n\ndef test_fails():\n    assert False\n")
    assert main(["env", "test", "--resources-server", "broken_env", "--shared-venv"]) == 1
    assert "failed" in capsys.readouterr().out
    assert main(["env", "test", "--resources-server", "brokn_env", "--shared-venv"]) == 1
    assert "Did you mean: resources_servers/broken_env" in capsys.readouterr().err


def test_data_validation_names_each_problem(tmp_path):
    server = tmp_path / "resources_servers" / "x"
    write(server / "data" / "example.jsonl", "{}\n" * 4)
    write(server / "data" / "example_metrics.json", json.dumps({"Number of examples": 4}))
    write(server / "data" / "example_metrics_conflict.json", "{}")
    problems = validate_server_data(server)
    assert any("4 rows, expected 5" in p for p in problems)
    assert any("reports 4 examples" in p for p in problems)
    assert any("example_rollouts.jsonl is missing" in p for p in problems)
    assert any("conflict" in p for p in problems)
    write(server / "data" / "example.jsonl", "{}\n" * 5)
    write(server / "data" / "example_rollouts.jsonl", "{}\n" * 5)
    write(server / "data" / "example_metrics.json", json.dumps({"Number of examples": 5}))
    (server / "data" / "example_metrics_conflict.json").unlink()
    assert validate_server_data(server) == []


def test_the_readme_environment_table_is_current():
    from nemo_gym.authoring.env_table import update_readme

    assert update_readme(INSTALL_DIR / "README.md", check=True), "run `gym dev env-table` and commit README.md"
