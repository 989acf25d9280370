"""Typed settings: a flag that names a settings field sets it as a typed value, the composed config is passed whole,
each default is written once, and ``--search-dir`` leaves ``os.environ`` alone."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import nemo_gym.assets
import nemo_gym.cli.commands.eval as eval_commands
import nemo_gym.config.compose as compose_module
import nemo_gym.launcher
import nemo_gym.rollouts.inputs as inputs_module
import nemo_gym.rollouts.reverify as reverify_module
import nemo_gym.rollouts.run as run_module
from nemo_gym import INSTALL_DIR
from nemo_gym.cli.main import main
from nemo_gym.config.compose import ComposedConfig, ComposeOptions
from nemo_gym.config.roots import EXTRA_ROOTS_ENV_VAR, child_env, search_roots, searching
from nemo_gym.errors import ConfigError
from nemo_gym.rollouts.collector import CollectionOptions, CollectionSummary, failures_path
from nemo_gym.rollouts.config import DEFAULT_CONCURRENCY, DEFAULT_REVERIFY_CONCURRENCY
from nemo_gym.rollouts.materialize import Materialized
from nemo_gym.rollouts.reverify import ReverifyOptions
from tests.helpers import write

WEATHER_DATA = INSTALL_DIR / "resources_servers" / "example_single_tool_call" / "data" / "example.jsonl"
NEMO_GYM = INSTALL_DIR / "nemo_gym"


@dataclass
class Captured:
    composed: list[ComposeOptions] = field(default_factory=list)
    collector_options: list[CollectionOptions] = field(default_factory=list)
    collector_urls: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch, workdir: Path) -> Captured:
    """``gym eval run`` with no servers: what composition is asked for and what the collector receives."""
    record = Captured()
    real_compose = compose_module.compose

    def compose(options: ComposeOptions) -> ComposedConfig:
        record.composed.append(options)
        return real_compose(options)

    @contextmanager
    def running_servers(*, config: ComposedConfig) -> Iterator[SimpleNamespace]:
        yield SimpleNamespace(composed=config)

    class Collector:
        def __init__(self, materialized: Materialized, urls: dict[str, str], options: CollectionOptions) -> None:
            record.collector_options.append(options)
            record.collector_urls.append(urls)
            self.options = options

        async def run(self) -> CollectionSummary:
            return CollectionSummary(self.options.output_path, failures_path(self.options.output_path))

    monkeypatch.setattr(compose_module, "compose", compose)  # the commands import it where they run
    monkeypatch.setattr(nemo_gym.launcher, "running_servers", running_servers)
    monkeypatch.setattr(run_module, "RolloutCollector", Collector)
    return record


def eval_run(*extra: str) -> list[str]:
    return [
        "eval", "run", "--resources-server", "example_single_tool_call", "--model-type", "scripted_model",
        "--input", str(WEATHER_DATA), "--output", "out.jsonl", "--disable-aggregation", *extra,
    ]  # fmt: skip


def test_concurrency_flag_reaches_the_collector_as_an_int_without_an_override_string(
    captured: Captured, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(eval_run("--concurrency", "7")) == 0, capsys.readouterr().err
    (options,) = captured.collector_options
    assert type(options.concurrency) is int and options.concurrency == 7
    (composition,) = captured.composed  # composed once, for the whole command
    assert not [token for token in composition.overrides if "num_samples_in_parallel" in token]
    assert not [token for token in composition.overrides if "output_jsonl_fpath" in token]


def test_the_instances_found_at_composition_reach_the_collector(
    captured: Captured, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(eval_run()) == 0, capsys.readouterr().err
    (urls,) = captured.collector_urls
    assert list(urls) == ["example_single_tool_call_simple_agent"]
    for module in (run_module, reverify_module, nemo_gym.launcher.runner):
        assert not hasattr(module, "find_server_instances"), module.__name__


def test_without_the_flag_the_default_concurrency_is_the_one_constant(
    captured: Captured, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(eval_run()) == 0, capsys.readouterr().err
    assert captured.collector_options[0].concurrency == DEFAULT_CONCURRENCY


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (["+num_samples_in_parallel=5"], 5),  # NeMo Gym style, no flag
        (["--concurrency", "7", "+config_paths=[more.yaml]"], 7),  # the flag beats a config file
        (["+config_paths=[more.yaml]"], 32),  # the file beats the default
        (["--concurrency", "7", "++num_samples_in_parallel=5"], 5),  # a later ++ override beats the flag
    ],
)
def test_flag_and_override_precedence_is_unchanged(
    captured: Captured, capsys: pytest.CaptureFixture[str], workdir: Path, tokens: list[str], expected: int
) -> None:
    write(workdir / "more.yaml", "num_samples_in_parallel: 32\n")
    assert main(eval_run(*tokens)) == 0, capsys.readouterr().err
    assert captured.collector_options[0].concurrency == expected


def test_overwrite_is_one_typed_setting_for_the_flag_and_the_legacy_override(
    captured: Captured, capsys: pytest.CaptureFixture[str], workdir: Path
) -> None:
    earlier = write(workdir / "out.jsonl", '{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}\n')
    assert main(eval_run()) == 1
    assert "--overwrite" in capsys.readouterr().err and not captured.collector_options
    assert main(eval_run("--overwrite")) == 0, capsys.readouterr().err
    assert main(eval_run("+overwrite=true")) == 0, capsys.readouterr().err  # NeMo Gym's spelling, same field
    assert len(captured.collector_options) == 2 and earlier.exists()  # (the fake collector writes nothing)
    assert main(eval_run("--overwrite", "+overwrite=true")) == 1
    assert "++overwrite" in capsys.readouterr().err


def test_the_same_key_as_flag_and_plus_override_is_one_error_naming_the_flag(
    captured: Captured, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(eval_run("--concurrency", "7", "+num_samples_in_parallel=5")) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--concurrency" in err and "++num_samples_in_parallel" in err
    assert not captured.collector_options


def test_sampling_flags_are_typed_values_in_the_create_params(
    captured: Captured, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []
    real_materialize = inputs_module.materialize  # prepare_inputs lives in rollouts/inputs.py

    def materialize(options: Any) -> Materialized:
        seen.append(options.responses_create_params)
        return real_materialize(options)

    monkeypatch.setattr(inputs_module, "materialize", materialize)
    assert main(eval_run("--temperature", "0.5", "--max-output-tokens", "64")) == 0, capsys.readouterr().err
    assert seen == [{"temperature": 0.5, "max_output_tokens": 64}]
    assert type(seen[0]["temperature"]) is float and type(seen[0]["max_output_tokens"]) is int


def test_reverify_concurrency_flag_is_a_typed_field_with_its_own_default(
    monkeypatch: pytest.MonkeyPatch, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[ReverifyOptions] = []

    def plan_reverify(options: ReverifyOptions) -> None:
        seen.append(options)
        raise ConfigError("stopped by the test")

    monkeypatch.setattr(reverify_module, "plan_reverify", plan_reverify)
    base = ["eval", "reverify", "--no-serve", "--rollouts", "r.jsonl", "--output", "new.jsonl"]
    assert main([*base, "--concurrency", "3"]) == 1
    assert main(base) == 1
    assert "stopped by the test" in capsys.readouterr().err
    assert [o.concurrency for o in seen] == [3, DEFAULT_REVERIFY_CONCURRENCY]
    assert type(seen[0].concurrency) is int


@pytest.mark.parametrize(("name", "value"), [("DEFAULT_CONCURRENCY", 256), ("DEFAULT_REVERIFY_CONCURRENCY", 64)])
def test_each_default_concurrency_is_assigned_once_in_nemo_gym(name: str, value: int) -> None:
    assignment = re.compile(rf"^\s*{name}\s*(:[^=]*)?=\s*(\S+)", re.MULTILINE)
    found = [
        (path.relative_to(INSTALL_DIR), match.group(2))
        for path in sorted(NEMO_GYM.rglob("*.py"))
        for match in assignment.finditer(path.read_text(encoding="utf-8"))
    ]
    assert found == [(Path("nemo_gym/rollouts/config.py"), str(value))]
    written_out = re.compile(rf"default:? {value}\b")
    assert not [p for p in NEMO_GYM.rglob("*.py") if written_out.search(p.read_text(encoding="utf-8"))]


def test_help_text_takes_the_defaults_from_the_constants() -> None:
    run_flags = {flag.names[0]: flag for flag in eval_commands.RUN_FLAGS}
    reverify_flags = {flag.names[0]: flag for flag in eval_commands.REVERIFY_FLAGS}
    assert f"(default {DEFAULT_CONCURRENCY})" in run_flags["--concurrency"].help
    assert f"(default {DEFAULT_REVERIFY_CONCURRENCY})" in reverify_flags["--concurrency"].help


def test_search_dir_leaves_os_environ_unchanged(
    workdir: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    other = tmp_path_factory.mktemp("other_root")
    write(other / "environments" / "elsewhere_env" / "config.yaml", "x: 1\n")
    before = dict(os.environ)
    during: list[tuple[dict[str, str], list[Path]]] = []

    def recording_search_roots() -> list[Path]:
        roots = search_roots()
        during.append((dict(os.environ), roots))
        return roots

    monkeypatch.setattr(nemo_gym.assets, "search_roots", recording_search_roots)
    assert main(["list", "environments", "--json", "--search-dir", str(other)]) == 0, capsys.readouterr().err
    assert during and all(env == before for env, _ in during)
    assert all(roots[0] == other.resolve() for _, roots in during)
    assert dict(os.environ) == before and search_roots()[0] != other.resolve()


def test_search_dirs_reach_child_processes_explicitly_and_the_users_variable_still_counts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from_user, from_flag = tmp_path / "user", tmp_path / "flag"
    from_user.mkdir()
    from_flag.mkdir()
    monkeypatch.setenv(EXTRA_ROOTS_ENV_VAR, str(from_user))
    with searching([from_flag]):
        assert search_roots()[:2] == [from_flag.resolve(), from_user.resolve()]
        env = child_env({"PATH": "/bin"})
    assert env == {"PATH": "/bin", EXTRA_ROOTS_ENV_VAR: os.pathsep.join([str(from_flag.resolve()), str(from_user)])}
    assert os.environ[EXTRA_ROOTS_ENV_VAR] == str(from_user)
