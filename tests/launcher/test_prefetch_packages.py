"""``gym env prefetch`` builds the venvs a run will use, so the run reuses them offline; ``gym env packages`` lists
what is in them, or what a venv not built yet will install."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.cli.legacy import main as legacy_main
from nemo_gym.cli.main import main
from nemo_gym.launcher import running_servers
from nemo_gym.launcher.venvs import READY_MARKER
from tests.helpers import write
from tests.launcher.conftest import base_overrides, make_server, server_block


def gym(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def packages_json(capsys: pytest.CaptureFixture[str], overrides: list[str]) -> dict[str, dict]:
    code, out, err = gym(capsys, "env", "packages", "--json", *overrides)
    assert code == 0, err
    return {entry["implementation"]: entry for entry in json.loads(out)}


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_prefetch_builds_each_venv_once_and_a_run_then_needs_no_index(
    server_root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_server(server_root, "with_six", requirements="six\n")
    config = write(server_root / "config.yaml", server_block("first", "with_six") + server_block("second", "with_six"))
    overrides = base_overrides(server_root, config, shared=False)

    before = packages_json(capsys, overrides)["resources_servers/with_six"]
    assert before["built"] is False and before["packages"] is None
    assert before["instances"] == ["first", "second"]
    assert "six" in before["requirements"] and before["requirements"][0].startswith("-e ")  # the framework first

    code, out, err = gym(capsys, "env", "prefetch", *overrides)
    assert code == 0, err
    assert "[1/1] resources_servers/with_six: building its venv for first, second" in err
    assert "[1/1] resources_servers/with_six: built in" in err
    assert "Prefetch complete: 1 venv(s) built, 0 already built." in out
    venv = Path(before["venv"])
    built_at = (venv / READY_MARKER).stat().st_mtime

    after = packages_json(capsys, overrides)["resources_servers/with_six"]
    assert after["built"] is True
    assert "six" in {row["name"] for row in after["packages"]}

    code, out, err = gym(capsys, "env", "prefetch", *overrides)
    assert code == 0 and "[1/1] resources_servers/with_six: already built" in err
    assert "0 venv(s) built, 1 already built" in out

    # The run finds the prefetched venv under the same key and never asks an index.
    monkeypatch.setenv("UV_OFFLINE", "1")
    with running_servers(overrides) as run:
        assert {server.venv.path for server in run.servers if server.venv} == {venv}
    assert (venv / READY_MARKER).stat().st_mtime == built_at
    assert "using cached venv" in (server_root / "results" / "logs" / "first.log").read_text()


def test_a_failed_prefetch_names_the_implementation_and_quotes_uv(
    server_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A local path that does not exist makes uv fail at once, without touching the network.
    make_server(server_root, "broken", requirements="-e ./no_such_package\n")
    config = write(server_root / "config.yaml", server_block("breaks", "broken"))
    code, out, err = gym(capsys, "env", "prefetch", *base_overrides(server_root, config, shared=False))
    assert code == 1 and "Prefetch complete" not in out
    assert "[1/1] resources_servers/broken: building its venv failed: `uv pip install` exited with code" in err
    assert "no_such_package" in err  # uv's own complaint, quoted
    assert not any(p.is_dir() for p in (server_root / "cache" / "venvs" / "resources_servers").glob("broken-*"))


def test_packages_of_a_pyproject_server_lists_its_declared_dependencies(
    server_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    impl = make_server(server_root, "projected")
    write(impl / "pyproject.toml", '[project]\nname = "projected"\nversion = "0"\ndependencies = ["six>=1.16"]\n')
    config = write(server_root / "config.yaml", server_block("one", "projected"))
    code, out, err = gym(capsys, "env", "packages", *base_overrides(server_root, config, shared=False))
    assert code == 0, err
    assert "resources_servers/projected (instances: one)" in out
    assert "not built yet (`gym env prefetch` builds it); it will install:" in out
    assert "    six>=1.16" in out.splitlines()

    # NeMo Gym's spelling for one folder, with or without a config: `ng_pip_list +entrypoint=resources_servers/NAME`
    code = legacy_main(
        ["ng_pip_list", "+entrypoint=resources_servers/projected", f"++cache_dir={server_root / 'cache'}"]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.startswith("resources_servers/projected\n") and "    six>=1.16" in captured.out.splitlines()


def test_a_server_without_a_dependency_file_is_named(server_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_server(server_root, "bare")
    config = write(server_root / "config.yaml", server_block("lonely", "bare"))
    code, _, err = gym(capsys, "env", "packages", *base_overrides(server_root, config, shared=False))
    assert code == 1
    assert "server 'lonely':" in err and "has neither requirements.txt nor pyproject.toml" in err


def test_with_shared_venv_nothing_is_built_and_packages_are_this_environments(
    server_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_server(server_root, "with_six", requirements="six\n")
    config = write(server_root / "config.yaml", server_block("first", "with_six"))
    overrides = base_overrides(server_root, config, shared=True)
    code, out, _ = gym(capsys, "env", "prefetch", *overrides)
    assert code == 0 and "shared_venv is on" in out
    assert not (server_root / "cache" / "venvs").exists()
    shared = packages_json(capsys, overrides)["shared_venv"]
    assert shared["instances"] == ["first"] and "pydantic" in {row["name"] for row in shared["packages"]}
