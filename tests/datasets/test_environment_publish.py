"""``gym env publish`` / ``gym env fetch``: an environment round-trips through the Hub (the loopback contract server
the dataset registry tests use, with the real ``huggingface_hub`` client), and the fetched copy runs from where it
landed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.authoring.environment_hub import INDEX_FILE
from nemo_gym.cli.main import main as gym_main
from tests.datasets.hub_contract_server import HubContractServer
from tests.datasets.registry_helpers import ORG, hf_overrides, running_hub
from tests.helpers import write

pytest.importorskip("huggingface_hub")

ENV_CONFIG = """\
my_env_resources:
  resources_servers:
    my_srv:
      entrypoint: app.py
      domain: other
my_env_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: my_env_resources}
      model_server: {type: responses_api_models, name: policy_model}
      datasets:
      - {name: example, type: example, jsonl_fpath: resources_servers/my_srv/data/example.jsonl}
"""
OWN_FILES = {
    "environments/my_env/config.yaml": ENV_CONFIG,
    "environments/my_env/manifest.yaml": "name: my_env\nkind: environment\n",
    "environments/my_env/README.md": "# my_env\n",
    "resources_servers/my_srv/app.py": "print('my server')\n",
    "resources_servers/my_srv/requirements.txt": "nemo-gym\n",
    "resources_servers/my_srv/data/example.jsonl": '{"responses_create_params": {"input": "hi"}}\n',
}


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with running_hub(tmp_path, monkeypatch) as server:
        yield server


@pytest.fixture
def author_root(tmp_path: Path) -> Path:
    root = tmp_path / "author"
    for relative, text in OWN_FILES.items():
        write(root / relative, text)
    write(root / "resources_servers" / "my_srv" / "__pycache__" / "app.cpython-311.pyc", "build output")
    write(root / "resources_servers" / "my_srv" / ".venv" / "bin" / "python", "a venv")
    return root


def gym(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = gym_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_publish_then_fetch_round_trips_and_the_copy_validates(
    hub: HubContractServer, author_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = gym(
        capsys, "env", "publish", "my_env", "--search-dir", str(author_root), "--json", *hf_overrides(hub)
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["repo_id"] == f"{ORG}/my_env"
    assert report["servers"] == ["resources_servers/my_srv"]
    assert report["framework_servers"] == ["responses_api_agents/simple_agent"]  # every install has it
    published = hub.files(f"{ORG}/my_env")
    assert set(published) - {".gitattributes"} == {*OWN_FILES, INDEX_FILE}  # no build output, no venv
    assert all(published[path] == text.encode() for path, text in OWN_FILES.items())
    assert hub.repos[f"{ORG}/my_env"].private
    assert json.loads(published[INDEX_FILE])["files"] == sorted(OWN_FILES)

    fetched_root = tmp_path / "elsewhere"
    code, out, err = gym(capsys, "env", "fetch", f"{ORG}/my_env", "--output-dir", str(fetched_root), *hf_overrides(hub))
    assert code == 0, err
    assert f"run it: gym env start --environment my_env --search-dir {fetched_root.resolve()}" in out
    for relative, text in OWN_FILES.items():
        assert (fetched_root / relative).read_text() == text
    assert not (fetched_root / INDEX_FILE).exists()  # the index describes the repo; it is not a file to run

    # The fetched copy is a search root the environment runs from: every pre-start check passes there.
    code, out, err = gym(
        capsys, "env", "validate", "--environment", "my_env", "--search-dir", str(fetched_root),
        "--model-type", "scripted_model", "++head_server.port=0",
    )  # fmt: skip
    assert code == 0, err
    assert "my_env_resources" in out and "resources_servers/my_srv" in out


def test_a_branch_a_public_repo_and_a_pull_request(
    hub: HubContractServer, author_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    publish = ["env", "publish", "my_env", "--search-dir", str(author_root), "--repo-id", "renamed", *hf_overrides(hub)]
    code, out, err = gym(capsys, *publish, "--revision", "v1", "--public")
    assert code == 0, err
    repo = hub.repos[f"{ORG}/renamed"]
    assert not repo.private and "refs/heads/v1" in repo.refs
    assert "environments/my_env/config.yaml" in hub.files(f"{ORG}/renamed", "v1")
    assert "environments/my_env/config.yaml" not in hub.files(f"{ORG}/renamed", "main")
    code, out, err = gym(capsys, *publish, "--create-pr")
    assert code == 0, err
    assert "/discussions/1" in out and any(ref.startswith("refs/pr/") for ref in repo.refs)


def test_fetch_refuses_what_is_not_an_environment_and_files_it_would_change(
    hub: HubContractServer, author_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = gym(capsys, "env", "publish", "my_env", "--search-dir", str(author_root), *hf_overrides(hub))
    assert code == 0, err
    target = tmp_path / "target"
    local = write(target / "environments" / "my_env" / "README.md", "my own notes\n")
    code, _, err = gym(capsys, "env", "fetch", "my_env", "--output-dir", str(target), *hf_overrides(hub))
    assert code == 1
    assert "1 file(s) of acme/my_env already exist" in err and "environments/my_env/README.md" in err
    assert local.read_text() == "my own notes\n" and not (target / "resources_servers").exists()  # nothing written
    code, _, err = gym(capsys, "env", "fetch", "my_env", "--output-dir", str(target), "--overwrite", *hf_overrides(hub))
    assert code == 0, err
    assert local.read_text() == "# my_env\n"

    hub.repos.pop(f"{ORG}/my_env")
    code, _, err = gym(capsys, "env", "fetch", "my_env", "--output-dir", str(target), *hf_overrides(hub))
    assert code == 1 and "Hub dataset repo acme/my_env not found" in err


def test_publishing_needs_the_token_and_an_environment(
    hub: HubContractServer, author_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    without_token = [o for o in hf_overrides(hub) if not o.startswith("+hf_token=")]
    code, _, err = gym(capsys, "env", "publish", "my_env", "--search-dir", str(author_root), *without_token)
    assert code == 1 and "publishing an environment needs hf_token" in err
    code, _, err = gym(capsys, "env", "publish", "no_such_env", "--search-dir", str(author_root), *hf_overrides(hub))
    assert code == 1 and "no_such_env" in err
    assert not hub.repos
