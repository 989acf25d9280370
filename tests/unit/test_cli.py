"""The gym CLI: routing, flag translation, errors, and the commands of the foundation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.cli.flags import quote
from nemo_gym.cli.main import main
from tests.helpers import write

BIN = Path(sys.executable).parent

RESOURCES = """
weather:
  resources_servers:
    weather_impl:
      entrypoint: app.py
      domain: agent
      description: Tells the weather
      api_key: ${policy_api_key}
weather_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: weather}
      model_server: {type: responses_api_models, name: policy_model}
      datasets:
      - {name: example, type: example, jsonl_fpath: data/example.jsonl}
"""
MODEL = """
policy_model:
  responses_api_models:
    fake_model:
      entrypoint: app.py
      description: A model for tests
      api_key: ${policy_api_key}
"""


@pytest.fixture
def tree(workdir: Path) -> Path:
    """A checkout-shaped tree: one resources server, one model, one agent, one environment."""
    write(workdir / "resources_servers" / "weather_impl" / "configs" / "weather_impl.yaml", RESOURCES)
    write(workdir / "resources_servers" / "weather_impl" / "app.py", "")
    write(workdir / "responses_api_models" / "fake_model" / "configs" / "fake_model.yaml", MODEL)
    write(workdir / "responses_api_agents" / "simple_agent" / "configs" / "simple_agent.yaml", "")
    for folder in ("responses_api_models/fake_model", "responses_api_agents/simple_agent"):
        write(workdir / folder / "app.py", "")  # validate, like a run, wants each server's entrypoint
    write(workdir / "environments" / "weather_env" / "config.yaml", RESOURCES)
    return workdir


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_resolve_masks_secrets(tree, capsys):
    code, out, err = run(
        capsys, "env", "resolve", "--resources-server", "weather_impl", "--model-type", "fake_model",
        "--model-api-key", "sk-verysecret",
    )  # fmt: skip
    assert code == 0, err
    assert "sk-verysecret" not in out and "policy_api_key: '****'" in out and "api_key: '****'" in out
    assert "weather_impl.yaml" in out


def test_a_missing_value_is_one_error_line_and_exit_1(tree, capsys):
    write(tree / "needs.yaml", "thing: ???\n")
    code, out, err = run(capsys, "env", "validate", "--config", "needs.yaml")
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "++thing=<value>" in lines[0]
    assert "Traceback" not in err


def test_resolve_shows_a_config_with_unset_values_marked_and_says_what_to_set(tree, capsys):
    """Resolving is for looking at a config: a value still to be set (a ``???``, or an interpolation of a secret that
    only env.yaml would hold) is printed as ``???`` - never masked, never a crash - with one warning line each."""
    write(tree / "needs.yaml", "thing: ???\nurl: ${policy_base_url}/v1\nmy_api_key: ${policy_api_key}\nkept: 3\n")
    code, out, err = run(capsys, "env", "resolve", "--config", "needs.yaml")
    assert code == 0, err
    assert "thing: ???" in out and "url: ???" in out and "my_api_key: ???" in out and "kept: 3" in out
    lines = err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("warning:") for line in lines), err
    assert "++thing=<value>" in lines[0] and "++policy_base_url=<value>" in err and "++policy_api_key=<value>" in err
    code, out, err = run(capsys, "env", "resolve", "--config", "needs.yaml", "+thing=1", "+policy_base_url=http://h",
                         "+policy_api_key=sk-verysecret")  # fmt: skip
    assert code == 0 and err == "" and "url: http://h/v1" in out and "my_api_key: '****'" in out


def test_verbose_adds_the_traceback(tree, capsys):
    write(tree / "needs.yaml", "thing: ???\n")
    code, _, err = run(capsys, "env", "validate", "--config", "needs.yaml", "-v")
    assert code == 1 and "Traceback" in err and "ConfigMissingValuesError" in err


def test_flags_and_plus_overrides_are_the_same(tree, capsys):
    _, via_flag, _ = run(capsys, "env", "resolve", "--config", "resources_servers/weather_impl/configs/weather_impl.yaml",
                         "--model-type", "fake_model", "--model", "gpt-x", "+policy_api_key=k")  # fmt: skip
    _, via_override, _ = run(
        capsys, "env", "resolve",
        "+config_paths=[responses_api_models/fake_model/configs/fake_model.yaml,"
        "resources_servers/weather_impl/configs/weather_impl.yaml]",
        "+policy_model_name=gpt-x", "+policy_api_key=k",
    )  # fmt: skip
    assert via_flag == via_override and "policy_model_name: gpt-x" in via_flag


def test_selector_config_paths_coalesce_with_user_config_paths(tree, capsys):
    write(tree / "extra.yaml", "extra_setting: 7\n")
    code, out, err = run(capsys, "env", "resolve", "--model-type", "fake_model", "+config_paths=[extra.yaml]",
                         "+policy_api_key=k")  # fmt: skip
    assert code == 0, err
    assert "extra_setting: 7" in out and "fake_model.yaml" in out


def test_a_users_config_file_overrides_the_configs_the_selectors_name(tree, capsys):
    """``--config mine.yaml --resources-server x``: the file is the user's change to x, so it is merged last."""
    write(tree / "mine.yaml", "weather:\n  resources_servers:\n    weather_impl:\n      domain: knowledge\n")
    code, out, err = run(capsys, "env", "resolve", "--config", "mine.yaml", "--resources-server", "weather_impl",
                         "--model-type", "fake_model", "+policy_api_key=k")  # fmt: skip
    assert code == 0, err
    assert "domain: knowledge" in out and "domain: agent" not in out


def test_unknown_selector_suggests_close_names(tree, capsys):
    code, _, err = run(capsys, "env", "resolve", "--resources-server", "wether_impl")
    assert code == 1 and "Did you mean: weather_impl?" in err


def test_validate_lists_the_embedded_policy_model_that_eval_run_starts(tree, capsys):
    code, out, err = run(capsys, "env", "validate", "--resources-server", "weather_impl", "+policy_api_key=k")
    assert code == 0, err
    assert "Config is valid: 3 server instance(s)" in out and "responses_api_models/llamacpp_model" in out
    assert "dummy_model" not in out


def test_unknown_command_and_flag_get_did_you_mean(tree, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["env", "reslove"])
    assert exit_info.value.code == 2
    assert "Did you mean: resolve?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["env", "resolve", "--confg", "x.yaml"])
    assert "Did you mean: --config?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["lsit", "environments"])
    assert "Did you mean: list?" in capsys.readouterr().err


def test_a_bare_path_is_one_usage_line_naming_its_flag_not_parser_jargon(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "profile", "results/run.jsonl"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "error: gym eval profile: unexpected argument 'results/run.jsonl': a path goes after its flag, e.g. "
        "gym eval profile --rollouts results/run.jsonl. See `gym eval profile --help`."
    )
    with pytest.raises(SystemExit):
        main(["env", "status", "weather"])
    assert capsys.readouterr().err.strip() == (
        "error: gym env status: unexpected argument 'weather': this command takes flags and key=value overrides. "
        "See `gym env status --help`."
    )


def test_version_json(capsys):
    code, out, _ = run(capsys, "--version", "--json")
    info = json.loads(out)
    assert code == 0 and info["nemo_gym"] and info["python"].startswith("3.") and "openai" in info


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "env" in out and "list" in out and "search" in out


def test_list_environments_table_json_and_inspect(tree, capsys):
    code, out, _ = run(capsys, "list", "environments")
    assert code == 0 and "weather_env" in out and "Tells the weather" in out
    code, out, _ = run(capsys, "list", "environments", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["weather_env"]["domain"] == "agent"
    code, out, _ = run(capsys, "list", "environments", "weather_env")
    assert code == 0 and "gym env start --environment weather_env" in out and "example (example)" in out
    code, _, err = run(capsys, "list", "environments", "weathr_env")
    assert code == 1 and "Did you mean: weather_env?" in err


def test_list_resources_servers_models_and_agents(tree, capsys):
    _, out, _ = run(capsys, "list", "resources-servers", "--json")
    assert {"name": "weather_impl", "domain": "agent"}.items() <= {
        k: v for row in json.loads(out) if row["name"] == "weather_impl" for k, v in row.items()
    }.items()
    _, out, _ = run(capsys, "list", "models", "--json")
    assert "fake_model" in [row["name"] for row in json.loads(out)]
    _, out, _ = run(capsys, "list", "agents", "--json")
    assert "simple_agent" in [row["name"] for row in json.loads(out)]


def test_list_models_shows_the_bundled_provider_servers(workdir, capsys):
    """From any directory: the install root is a search root, so the bundled model servers are listed."""
    _, out, _ = run(capsys, "list", "models", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert {"anthropic_model", "litellm_model", "azure_openai_model"} <= set(rows)
    assert "Anthropic" in rows["anthropic_model"]["description"]


def test_search_is_fuzzy(tree, capsys):
    _, out, _ = run(capsys, "search", "wether", "--json")
    assert "weather_env" in [row["name"] for row in json.loads(out)]
    _, out, _ = run(capsys, "search", "models", "fake", "--json")
    assert [row["kind"] for row in json.loads(out)] == ["model"]
    _, out, _ = run(capsys, "search", "zzzqqq", "--json")
    assert json.loads(out) == []


def test_search_dir_adds_a_root(tree, capsys, tmp_path_factory):
    other = tmp_path_factory.mktemp("other_root")
    write(other / "environments" / "elsewhere_env" / "config.yaml", RESOURCES)
    _, out, _ = run(capsys, "list", "environments", "--json")
    assert "elsewhere_env" not in out
    _, out, _ = run(capsys, "list", "environments", "--json", "--search-dir", str(other))
    assert "elsewhere_env" in [row["name"] for row in json.loads(out)]


@pytest.mark.parametrize("value", ["plain", "with space", "it's", "a,b", "x=y", "null", "back\\slash\\", "c:\\d'"])
def test_quote_round_trips_through_the_override_parser(value):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert OverridesParser.create().parse_override(f"+k={quote(value)}").value() == value


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*args], cwd=cwd, capture_output=True, text=True, timeout=60, env={"PATH": str(BIN), "NEMO_GYM_ENV_YAML": ""}
    )


def test_installed_scripts_and_legacy_alias(tree):
    write(tree / "a.yaml", "policy_api_key: sk-abcdef\nx: 1\n")
    gym = _cli(str(BIN / "gym"), "env", "resolve", "--config", "a.yaml", cwd=tree)
    ng = _cli(str(BIN / "ng"), "env", "resolve", "--config", "a.yaml", cwd=tree)
    legacy = _cli(str(BIN / "ng_dump_config"), "+config_paths=[a.yaml]", cwd=tree)
    assert gym.returncode == ng.returncode == legacy.returncode == 0
    assert gym.stdout == ng.stdout == legacy.stdout and "sk-abcdef" not in gym.stdout
    assert legacy.stderr.strip() == "warning: ng_dump_config is deprecated; use `gym env resolve`"
    long_form = _cli(str(BIN / "nemo_gym_dump_config"), "+config_paths=[a.yaml]", cwd=tree)
    assert long_form.stdout == gym.stdout


def test_installed_script_error_has_no_traceback(tree):
    write(tree / "needs.yaml", "thing: ???\n")
    result = _cli(str(BIN / "gym"), "env", "validate", "--config", "needs.yaml", cwd=tree)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_every_legacy_script_is_installed():
    from nemo_gym.cli.legacy import LEGACY_COMMANDS

    for name in [*LEGACY_COMMANDS, "reinstall"]:
        assert (BIN / f"ng_{name}").exists() and (BIN / f"nemo_gym_{name}").exists(), name


def test_eval_run_reports_bad_rows_before_starting_any_server(workdir, capsys, monkeypatch):
    import nemo_gym.launcher

    def no_servers(*args, **kwargs):
        raise AssertionError("servers were started although the input is bad")

    monkeypatch.setattr(nemo_gym.launcher, "running_servers", no_servers)
    data = write(workdir / "bad.jsonl", '{"responses_create_params": {"input": "hi"}}\nnot json\n')
    code, out, err = run(
        capsys, "eval", "run", "--resources-server", "example_single_tool_call", "--model-type", "scripted_model",
        "--input", str(data), "--output", str(workdir / "out.jsonl"),
    )  # fmt: skip
    assert code == 1
    assert f"{data}:2" in err and "Starting servers" not in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
