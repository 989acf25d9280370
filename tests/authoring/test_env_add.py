"""gym env add NAME --from-nemo-gym VERSION, on a miniature release already in the releases cache (no network).

The real release, fetched from the package index and run with the embedded model, is tests/e2e/test_env_add.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.authoring.release_import import (
    LICENCE_COPY_NAME,
    copy_environment,
    fetch_release,
    plan_environment_import,
)
from nemo_gym.cli.main import main
from nemo_gym.errors import ConfigError, UserError
from tests.helpers import write

VERSION = "9.9.0"
ENVIRONMENT = """\
dice:
  resources_servers:
    dice:
      entrypoint: app.py
dice_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
dice_environment_server:
  environment_servers:
    legacy_agent:
      entrypoint: app.py
"""


@pytest.fixture
def releases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A releases cache holding an unpacked nemo_gym 9.9.0 with one environment, ``dice``."""
    cache = tmp_path / "releases"
    root = cache / f"nemo_gym-{VERSION}"
    write(root / "nemo_gym" / "__init__.py", "")
    dist_info = root / f"nemo_gym-{VERSION}.dist-info"
    write(dist_info / "METADATA", f"Metadata-Version: 2.4\nName: nemo-gym\nVersion: {VERSION}\nLicense-Expression: "
                                  "Apache-2.0\n")  # fmt: skip
    write(dist_info / "licenses" / "LICENSE", "Apache License, Version 2.0 (the text)\n")
    write(root / "environments" / "dice" / "config.yaml", ENVIRONMENT)
    write(root / "environments" / "dice" / "data" / "example.jsonl", '{"responses_create_params": {"input": "x"}}\n')
    write(
        root / "resources_servers" / "dice" / "app.py",
        "# the release's server\nfrom resources_servers.dicebase import Base\n",
    )
    write(root / "resources_servers" / "dicebase" / "__init__.py", "from resources_servers.dice import unused\n")
    write(root / "resources_servers" / "dice" / "__pycache__" / "app.cpython-313.pyc", "compiled")
    write(root / "responses_api_agents" / "simple_agent" / "app.py", "# theirs, not copied: we ship simple_agent\n")
    monkeypatch.setenv("NEMO_GYM_RELEASES_CACHE", str(cache))
    return cache


def test_the_entry_and_the_servers_we_do_not_ship_are_copied_with_the_licence(releases: Path, tmp_path: Path) -> None:
    release = fetch_release(VERSION, releases)
    plan = plan_environment_import(release, "dice", INSTALL_DIR)
    assert plan.copies == ["environments/dice", "resources_servers/dice", "resources_servers/dicebase"]
    assert plan.ours == ["responses_api_agents/simple_agent", "environment_servers/legacy_agent"]
    assert plan.licence_name == "Apache-2.0"
    workspace = tmp_path / "workspace"
    copy_environment(plan, workspace)
    assert (workspace / "resources_servers" / "dice" / "app.py").read_text().startswith("# the release's server\n")
    assert (workspace / "resources_servers" / "dicebase" / "__init__.py").is_file()  # imported by dice: it comes too
    assert not (workspace / "resources_servers" / "dice" / "__pycache__").exists()
    assert not (workspace / "responses_api_agents").exists()
    assert "Apache License" in (workspace / "environments" / "dice" / LICENCE_COPY_NAME).read_text()


def test_nothing_in_the_workspace_is_replaced_without_overwrite(releases: Path, tmp_path: Path) -> None:
    plan = plan_environment_import(fetch_release(VERSION, releases), "dice", INSTALL_DIR)
    workspace = tmp_path / "workspace"
    mine = write(workspace / "resources_servers" / "dice" / "app.py", "# my own edits\n")
    with pytest.raises(UserError, match="already exist.*--overwrite"):
        copy_environment(plan, workspace)
    assert mine.read_text() == "# my own edits\n"
    copy_environment(plan, workspace, overwrite=True)
    assert mine.read_text().startswith("# the release's server\n")


def test_an_unknown_environment_lists_the_releases_environments(releases: Path) -> None:
    with pytest.raises(ConfigError, match="no environment 'dise'.*Its environments: dice"):
        plan_environment_import(fetch_release(VERSION, releases), "dise", INSTALL_DIR)


def test_the_command_prints_what_it_copied_and_the_next_step(
    releases: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["env", "add", "dice", "--from-nemo-gym", VERSION]) == 0
    out = capsys.readouterr().out
    assert "copied   resources_servers/dice" in out
    assert "ours     responses_api_agents/simple_agent" in out
    assert "Licence: Apache-2.0" in out
    assert "gym eval run --environment dice --input environments/dice/data/example.jsonl" in out
    assert main(["env", "add", "dice", "--from-nemo-gym", VERSION]) != 0  # a second time: refused, nothing replaced
    assert "--overwrite" in capsys.readouterr().err
