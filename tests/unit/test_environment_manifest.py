"""Environment manifests (``nemo_gym/environment/manifest.py``) and the static half of ``gym env validate``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from nemo_gym import INSTALL_DIR
from nemo_gym.config.datasets import Domain
from nemo_gym.environment.manifest import (
    EnvironmentManifest,
    ManifestError,
    dump_manifest,
    find_manifest,
    load_manifest,
    manifest_json_schema,
    manifest_paths,
)
from nemo_gym.environment.validation import CASES_FILE, FixtureResult, check_statically
from nemo_gym.errors import UserError
from nemo_gym.roots import searching
from nemo_gym.verifier_fixture import load_verifier_fixture
from tests.helpers import write

SHIPPED = sorted(path.parent.name for path in (INSTALL_DIR / "environments").glob("*/config.yaml"))


def minimal(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "demo", "version": "0.1.0", "kind": "environment", "integration_profile": "custom-gym-verifier",
        "domain": "math", "description": "d", "modality": "text", "authors": ["a"],
        "reward": {"range": [0, 1], "higher_is_better": True}, "resources_server": "demo", "agent_server": "demo_agent",
        "model_server": "policy_model",
        "datasets": [{"name": "example", "type": "example", "jsonl_fpath": "resources_servers/demo/data/example.jsonl"}],
    }  # fmt: skip
    data.update(changes)
    return data


def test_every_shipped_environment_has_a_manifest_that_loads_and_round_trips(tmp_path: Path) -> None:
    assert "string_match" in SHIPPED
    assert [path.parent.name for path in manifest_paths(INSTALL_DIR)] == SHIPPED
    for name in SHIPPED:
        manifest = load_manifest(find_manifest(name))
        assert manifest.name == name
        again = load_manifest(dump_manifest(manifest, tmp_path / f"{name}.yaml"))
        assert again == manifest
        cases = INSTALL_DIR / "resources_servers" / str(manifest.resources_server) / CASES_FILE
        kinds = {case.kind for case in load_verifier_fixture(cases)}
        assert {"full_reward", "zero_reward", "malformed"} <= kinds, cases


def test_a_bad_manifest_is_one_line_naming_the_file_and_each_key(tmp_path: Path) -> None:
    path = write(tmp_path / "manifest.yaml", yaml.safe_dump(minimal(reward={"range": [1, 0], "higher_is_better": True},
                                                                     kind="env", colour="blue")))  # fmt: skip
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    assert "kind: " in message and "reward: " in message and "range must be [lower, upper]" in message
    assert "colour: Extra inputs are not permitted" in message
    assert isinstance(caught.value, UserError)


@pytest.mark.parametrize(
    ("text", "says"),
    [("name: [unclosed\n", "not valid YAML at line"), ("- a list\n", "a manifest is a YAML mapping")],
)
def test_unreadable_manifests_say_why(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ManifestError, match=says):
        load_manifest(write(tmp_path / "manifest.yaml", text))
    with pytest.raises(ManifestError, match="cannot read the manifest"):
        load_manifest(tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"kind": "benchmark"}, "needs canonical_split, standard_prompt_config"),
        ({"integration_profile": "external-rollout-driver"}, "needs rollout_driver"),
        ({"rollout_driver": "pkg.mod:drive"}, "external-rollout-driver profile only"),
        ({"prompt_source": "prepared", "standard_prompt_config": "p.yaml"}, "prepared prompts take no"),
        ({"authors": ["a", "a"]}, "authors are listed more than once"),
        ({"licensing": "not a licence"}, "is not an SPDX expression"),
        ({"datasets": [{"name": "b", "type": "benchmark", "jsonl_fpath": "b.jsonl"}]}, "needs prepare_script"),
    ],
)
def test_the_rules_between_fields(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        EnvironmentManifest.model_validate(minimal(**changes))


def test_licensing_is_canonical_spdx_or_one_of_three_words() -> None:
    assert EnvironmentManifest.model_validate(minimal(licensing="apache-2.0")).licensing == "Apache-2.0"
    assert EnvironmentManifest.model_validate(minimal(licensing="proprietary")).licensing == "proprietary"


def test_the_json_schema_describes_the_model() -> None:
    schema = manifest_json_schema()
    assert schema["$schema"].endswith("2020-12/schema")
    assert {"name", "kind", "reward", "datasets", "resources_server"} <= set(schema["required"])
    assert schema["additionalProperties"] is False
    json.dumps(schema)


def test_find_manifest_names_what_is_missing(tmp_path: Path) -> None:
    write(tmp_path / "environments" / "bare" / "config.yaml", "{}\n")
    with searching([tmp_path]):
        with pytest.raises(ManifestError, match="environment 'bare' has no manifest.yaml"):
            find_manifest("bare")
        with pytest.raises(UserError, match="Did you mean"):
            find_manifest("bar")


def copy_of_string_match(root: Path, manifest_changes: dict[str, Any]) -> None:
    """``environments/sm`` under ``root``: string_match's config, with a manifest changed as given."""
    write(
        root / "environments" / "sm" / "config.yaml",
        "config_paths:\n- resources_servers/string_match/configs/string_match.yaml\n",
    )
    shipped = load_manifest(INSTALL_DIR / "environments" / "string_match" / "manifest.yaml")
    dump_manifest(shipped.model_copy(update={"name": "sm", **manifest_changes}), root / "environments" / "sm" / "manifest.yaml")  # fmt: skip


def test_static_checks_pass_a_whole_environment(tmp_path: Path) -> None:
    copy_of_string_match(tmp_path, {})
    with searching([tmp_path]):
        check = check_statically("sm")
    assert check.problems == []
    assert list(check.servers) == ["string_match"] and check.servers["string_match"].name == "verifier_cases.jsonl"


def test_static_checks_name_where_the_manifest_and_config_disagree(tmp_path: Path) -> None:
    shipped = load_manifest(INSTALL_DIR / "environments" / "string_match" / "manifest.yaml")
    extra = shipped.datasets[0].model_copy(update={"name": "train", "type": "train", "jsonl_fpath": "data/train.jsonl"})
    copy_of_string_match(tmp_path, {"agent_server": "nobody", "datasets": [*shipped.datasets, extra]})
    with searching([tmp_path]):
        problems = check_statically("sm").problems
    assert problems == [
        "manifest agent_server 'nobody' is not a responses_api_agents or environment_servers instance of the config",
        "manifest dataset data/train.jsonl is not among the config's datasets",
    ]


def test_static_checks_find_bad_rows_missing_files_and_missing_fixtures(tmp_path: Path) -> None:
    config = {
        "sm": {"resources_servers": {"string_match": {"entrypoint": "app.py", "domain": "knowledge", "description": "d"}}},
        "sm_agent": {"responses_api_agents": {"simple_agent": {
            "entrypoint": "app.py", "resources_server": {"type": "resources_servers", "name": "sm"},
            "model_server": {"type": "responses_api_models", "name": "policy_model"},
            "datasets": [{"name": "example", "type": "example", "jsonl_fpath": "rows.jsonl", "license": "MIT"},
                         {"name": "train", "type": "train", "jsonl_fpath": "absent.jsonl", "license": "MIT"}]}}},
    }  # fmt: skip
    write(tmp_path / "environments" / "sm" / "config.yaml", yaml.safe_dump(config))
    write(tmp_path / "rows.jsonl", json.dumps({"responses_create_params": {"input": "hi"}}) + "\n" + '{"no": 1}\n')
    server = tmp_path / "resources_servers" / "string_match"
    write(server / "app.py", "")
    with searching([tmp_path]):
        check = check_statically("sm")
    assert check.problems == [
        f"{(tmp_path / 'environments' / 'sm' / 'manifest.yaml').resolve()}: environment 'sm' has no manifest.yaml",
        f"{(tmp_path / 'rows.jsonl').resolve()}:2: the row has no responses_create_params object",
        "dataset 'train': absent.jsonl not found, and nothing says how to make it",
        f"resources server 'sm' has no verifier fixtures ({server.resolve() / CASES_FILE})",
    ]


def test_a_fixture_result_is_one_line_with_both_rewards() -> None:
    differs = FixtureResult("env", "srv", "case a", "full_reward", 1.0, 0.25)
    assert not differs.ok
    assert differs.line() == "env: fixture 'case a' (srv): expected reward 1.0, the verifier gave 0.25"
    failed = FixtureResult("env", "srv", "case b", "zero_reward", 0.0, None, "HTTP 500")
    assert failed.line() == "env: fixture 'case b' (srv): expected reward 0.0, the verifier failed: HTTP 500"
    assert FixtureResult("env", "srv", "bad", "malformed", None, None, "HTTP 422").ok
    assert not FixtureResult("env", "srv", "bad", "malformed", None, 1.0).ok
    assert FixtureResult("env", "srv", "same", "determinism", 0.5, 0.5).ok


def test_the_command_splits_names_from_overrides_and_exits_by_the_result(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from nemo_gym.cli.router import run
    from nemo_gym.environment import validation
    from nemo_gym.environment.validation import EnvironmentCheck

    seen: list[tuple[list[str], list[str]]] = []

    def validate(names: list[str], overrides: list[str]) -> list[EnvironmentCheck]:
        seen.append((list(names), list(overrides)))
        good = EnvironmentCheck("a", results=[FixtureResult("a", "s", "right", "full_reward", 1.0, 1.0)])
        bad = EnvironmentCheck("b", results=[FixtureResult("b", "s", "changed", "full_reward", 1.0, 0.0)])
        return [good, bad]

    monkeypatch.setattr(validation, "validate_environments", validate)
    assert run(["env", "validate", "a", "b", "+shared_venv=true", "--json"]) == 1
    assert seen == [(["a", "b"], ["+shared_venv=true"])]
    report = json.loads(capsys.readouterr().out)
    assert [(entry["environment"], entry["ok"]) for entry in report] == [("a", True), ("b", False)]
    assert report[1]["fixtures"][0] == {"server": "s", "case": "changed", "kind": "full_reward",
                                             "expected_reward": 1.0, "reward": 0.0, "error": None, "ok": False}  # fmt: skip
    assert run(["env", "validate", "b"]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip() == "b: fixture 'changed' (s): expected reward 1.0, the verifier gave 0.0"
    assert captured.out.splitlines() == [
        "a: valid (1/1 verifier fixture(s) passed)",
        "b: INVALID (0/1 verifier fixture(s) passed)",
    ]


def test_static_checks_compare_the_domain_with_the_servers_config(tmp_path: Path) -> None:
    copy_of_string_match(tmp_path, {"domain": Domain.MATH})
    with searching([tmp_path]):
        assert check_statically("sm").problems == ["manifest domain math differs from the config's knowledge"]
