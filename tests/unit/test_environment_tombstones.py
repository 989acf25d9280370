"""Renamed environments (NeMo Gym 0.7's ``environments/<old>/.nemo_gym_tombstone``): the old name still selects the
environment, under its new name, with one notice line; a tombstone that is not exactly one name is an error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.assets import list_environments, resolve_selector
from nemo_gym.cli.main import main
from nemo_gym.errors import ConfigError
from tests.helpers import write

CONFIG = "new_env_resources:\n  resources_servers:\n    some_impl:\n      entrypoint: app.py\n      domain: other\n"


def tombstone(root: Path, old: str, text: str) -> Path:
    return write(root / "environments" / old / ".nemo_gym_tombstone", text)


def test_the_old_name_selects_the_new_environment_with_one_notice(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = write(workdir / "environments" / "new_env" / "config.yaml", CONFIG)
    tombstone(workdir, "old_env", "new_env\n")
    assert resolve_selector("environment", "old_env") == new
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"notice: environment 'old_env' was renamed to 'new_env' ({workdir / 'environments/old_env/.nemo_gym_tombstone'})"
    ]
    assert [entry.name for entry in list_environments() if entry.name.endswith("_env")] == ["new_env"]

    assert main(["list", "environments", "old_env", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["name"] == "new_env" and "renamed to 'new_env'" in captured.err

    code = main(["env", "resolve", "--environment", "old_env"])
    captured = capsys.readouterr()
    assert code == 0 and "new_env_resources:" in captured.out
    assert captured.err.count("was renamed to 'new_env'") == 1


def test_a_tombstone_wins_over_a_config_left_beside_it_and_renames_chain(workdir: Path) -> None:
    final = write(workdir / "environments" / "third" / "config.yaml", CONFIG)
    write(workdir / "environments" / "first" / "config.yaml", CONFIG)
    tombstone(workdir, "first", "second")
    tombstone(workdir, "second", "third")
    assert resolve_selector("environment", "first") == final


@pytest.mark.parametrize(
    ("text", "found"),
    [("", "found nothing"), ("new_env other_env\n", "found 'new_env', 'other_env'"), ("old_env", "'old_env'")],
)
def test_a_tombstone_must_hold_exactly_one_other_name(workdir: Path, text: str, found: str) -> None:
    write(workdir / "environments" / "new_env" / "config.yaml", CONFIG)
    tombstone(workdir, "old_env", text)
    with pytest.raises(ConfigError) as info:
        resolve_selector("environment", "old_env")
    assert "old_env/.nemo_gym_tombstone must hold exactly one name" in str(info.value) and found in str(info.value)


def test_a_rename_to_nowhere_and_a_loop_are_named(workdir: Path) -> None:
    tombstone(workdir, "gone", "missing_env")
    with pytest.raises(ConfigError, match="'gone' was renamed to 'missing_env' .*which is not found"):
        resolve_selector("environment", "gone")
    tombstone(workdir, "ping", "pong")
    tombstone(workdir, "pong", "ping")
    with pytest.raises(ConfigError, match=r"renames loop \(ping -> pong -> ping\)"):
        resolve_selector("environment", "ping")
