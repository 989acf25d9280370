"""``gym env publish`` / ``gym env fetch``: an environment round-trips through the Hub (the loopback contract server
the dataset registry tests use, with the real ``huggingface_hub`` client), and the fetched copy runs from where it
landed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemo_gym.authoring.environment_hub import INDEX_FILE, collect_bundle, publish_environment
from nemo_gym.authoring.environment_scaffold import scaffold_environment
from nemo_gym.cli.main import main as gym_main
from nemo_gym.config.roots import searching
from nemo_gym.datasets.storage.hf import HfDatasetRegistry
from nemo_gym.environment.manifest import dump_manifest, load_manifest
from tests.datasets.hub_contract_server import HubContractServer
from tests.datasets.registry_helpers import ORG, hf_overrides, running_hub
from tests.helpers import write

pytest.importorskip("huggingface_hub")

BUILD_OUTPUT = ("resources_servers/my_env/__pycache__/app.cpython-311.pyc", "resources_servers/my_env/.venv/bin/python")
LAUNCH = ["+shared_venv=true", "+head_server={port: 0}"]
"""How publishing's validation starts the verifier here: in this environment, on a free port."""


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with running_hub(tmp_path, monkeypatch) as server:
        yield server


@pytest.fixture
def author_root(workdir: Path) -> Path:
    """``gym env init --environment my_env``'s folders, its manifest filled in as an author would before publishing."""
    root = workdir / "author"
    scaffold_environment("my_env", "custom-gym-verifier", root)
    manifest_path = root / "environments" / "my_env" / "manifest.yaml"
    manifest = load_manifest(manifest_path)
    dump_manifest(manifest.model_copy(update={"authors": ["Ada"], "licensing": "Apache-2.0"}), manifest_path)
    for relative in BUILD_OUTPUT:
        write(root / relative, "build output, never published")
    return root


def own_files(root: Path) -> dict[str, bytes]:
    """What publishing takes: the environment's folder and its own server's, without build output."""
    files = {}
    for folder in ("environments/my_env", "resources_servers/my_env"):
        for path in (root / folder).rglob("*"):
            relative = path.relative_to(root).as_posix()
            if path.is_file() and relative not in BUILD_OUTPUT:
                files[relative] = path.read_bytes()
    return files


def gym(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = gym_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_publish_then_fetch_round_trips_and_the_copy_validates(
    hub: HubContractServer, author_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    publish = ["env", "publish", "my_env", "--search-dir", str(author_root), "--json", *hf_overrides(hub), *LAUNCH]
    code, out, err = gym(capsys, *publish)
    assert code == 0, err
    report = json.loads(out)
    assert report["repo_id"] == f"{ORG}/my_env"
    assert report["servers"] == ["resources_servers/my_env"]
    assert report["framework_servers"] == ["responses_api_agents/simple_agent"]  # every install has it
    own = own_files(author_root)
    assert "environments/my_env/manifest.yaml" in own and "resources_servers/my_env/data/example.jsonl" in own
    published = hub.files(f"{ORG}/my_env")
    assert set(published) - {".gitattributes"} == {*own, INDEX_FILE}  # no build output, no venv
    assert all(published[path] == data for path, data in own.items())
    assert hub.repos[f"{ORG}/my_env"].private
    assert json.loads(published[INDEX_FILE])["files"] == sorted(own)

    fetched_root = tmp_path / "elsewhere"
    code, out, err = gym(capsys, "env", "fetch", f"{ORG}/my_env", "--output-dir", str(fetched_root), *hf_overrides(hub))
    assert code == 0, err
    assert f"run it: gym env start --environment my_env --search-dir {fetched_root.resolve()}" in out
    assert own_files(fetched_root) == own
    assert not (fetched_root / INDEX_FILE).exists()  # the index describes the repo; it is not a file to run

    # The fetched copy is a search root the environment runs from: it validates there, fixtures included.
    code, out, err = gym(capsys, "env", "validate", "my_env", "--search-dir", str(fetched_root), *LAUNCH)
    assert code == 0, err
    assert "my_env: valid (4/4 verifier fixture(s) passed)" in out


def test_what_validation_refuses_is_not_published(
    hub: HubContractServer, author_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest_path = author_root / "environments" / "my_env" / "manifest.yaml"
    manifest = load_manifest(manifest_path)
    dump_manifest(manifest.model_copy(update={"authors": ["TODO: your name"], "licensing": "unknown"}), manifest_path)
    publish = ["env", "publish", "my_env", "--search-dir", str(author_root), *hf_overrides(hub), *LAUNCH]
    code, _, err = gym(capsys, *publish)
    assert code == 1 and "fill in authors, licensing before publishing" in err
    dump_manifest(manifest, manifest_path)
    cases = author_root / "resources_servers" / "my_env" / "tests" / "verifier_cases.jsonl"
    cases.write_text("not a case\n")  # what gym env validate my_env finds, publishing finds (here before any launch)
    code, _, err = gym(capsys, *publish)
    assert code == 1 and "my_env is not published" in err and "verifier_cases.jsonl:1" in err
    assert not hub.repos


def upload(hub: HubContractServer, root: Path, repo_id: str, **options: Any) -> str:
    """What ``gym env publish`` uploads once its checks passed (they are the tests above), uploaded."""
    with searching([root]):
        bundle = collect_bundle("my_env")
    registry = HfDatasetRegistry(hub.token, endpoint=hub.endpoint, organization=ORG)
    return publish_environment(bundle, registry, repo_id, **options)


def test_a_branch_a_public_repo_and_a_pull_request(hub: HubContractServer, author_root: Path) -> None:
    upload(hub, author_root, f"{ORG}/renamed", revision="v1", private=False)
    repo = hub.repos[f"{ORG}/renamed"]
    assert not repo.private and "refs/heads/v1" in repo.refs
    assert "environments/my_env/config.yaml" in hub.files(f"{ORG}/renamed", "v1")
    assert "environments/my_env/config.yaml" not in hub.files(f"{ORG}/renamed", "main")
    url = upload(hub, author_root, f"{ORG}/renamed", create_pr=True)
    assert "/discussions/1" in url and any(ref.startswith("refs/pr/") for ref in repo.refs)


def test_fetch_refuses_what_is_not_an_environment_and_files_it_would_change(
    hub: HubContractServer, author_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    upload(hub, author_root, f"{ORG}/my_env")
    target = tmp_path / "target"
    readme = (author_root / "environments" / "my_env" / "README.md").read_text()
    local = write(target / "environments" / "my_env" / "README.md", "my own notes\n")
    code, _, err = gym(capsys, "env", "fetch", "my_env", "--output-dir", str(target), *hf_overrides(hub))
    assert code == 1
    assert "1 file(s) of acme/my_env already exist" in err and "environments/my_env/README.md" in err
    assert local.read_text() == "my own notes\n" and not (target / "resources_servers").exists()  # nothing written
    code, _, err = gym(capsys, "env", "fetch", "my_env", "--output-dir", str(target), "--overwrite", *hf_overrides(hub))
    assert code == 0, err
    assert local.read_text() == readme

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
