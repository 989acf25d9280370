"""The Hugging Face Hub registry, with ``huggingface_hub`` pointed at a loopback contract server.

No Hub-compatible server from PyPI runs offline (see ``hub_contract_server.py``), so these tests run the real
``huggingface_hub`` client against a server that implements the Hub endpoints it calls, and assert both the results
and the requests (the recorded contract). ``gym dataset migrate`` (MLflow to Hub) is in ``test_registries.py``.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from nemo_gym.cli.main import main as gym_main
from nemo_gym.config_types import DatasetConfig
from nemo_gym.datasets.storage import DatasetNotFoundError, RegistryError, download_dataset_source, get_registry
from nemo_gym.datasets.storage.hf import (
    HfDatasetRegistry,
    collection_slug,
    hf_repo_id,
    resources_server_identity,
    split_files,
)
from tests.datasets.hub_contract_server import HubContractServer
from tests.datasets.registry_helpers import (
    COLLECTION_SUFFIX,
    ORG,
    REPO,
    ROW_V1,
    ROW_V2,
    hf_overrides,
    jsonl,
    registry_round_trip,
    resources_server_config,
    rows_of,
    running_hub,
)
from tests.helpers import write

pytest.importorskip("huggingface_hub")


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with running_hub(tmp_path, monkeypatch) as server:
        yield server


def test_naming_follows_org_prefix_domain_and_name(tmp_path: Path):
    assert resources_server_identity(resources_server_config(tmp_path)) == ("my_env", "MATH")
    assert hf_repo_id("acme", "Nemotron-RL", "MATH", "my_env") == REPO
    assert collection_slug("acme", "RL Environments!", "abc") == "acme/rl-environments-abc"
    with pytest.raises(RegistryError, match="domain"):
        resources_server_identity(write(tmp_path / "x.yaml", "a: {b: 1}\n"))


def test_split_files_follow_the_hub_naming_rules():
    files = [".gitattributes", "train.jsonl", "data/val-00.jsonl", "test_set.jsonl", "README.md"]
    assert split_files(files, "train") == ["train.jsonl"]
    assert split_files(files, "validation") == ["data/val-00.jsonl"]
    assert split_files(files, "test") == ["test_set.jsonl"]
    assert split_files(["only.jsonl"], "train") == ["only.jsonl"]
    assert split_files(["only.jsonl"], "validation") == []
    assert split_files(["a.jsonl", "b.jsonl"], "train") == []


@pytest.mark.timeout(120)
def test_hub_round_trip_keeps_versions_on_branches(hub: HubContractServer, tmp_path: Path):
    registry = get_registry("hf", {"hf_token": hub.token, "hf_endpoint": hub.endpoint, "hf_organization": ORG})
    assert isinstance(registry, HfDatasetRegistry)
    registry_round_trip(registry, REPO, tmp_path)
    assert hub.repos == {}, "removing the dataset deletes its repo"
    assert hub.calls("POST", f"/api/datasets/{REPO}/branch/0.0.1") and hub.calls("DELETE", "/api/repos/delete")


@pytest.mark.timeout(120)
def test_cli_upload_names_the_repo_and_joins_the_collection(hub: HubContractServer, workdir: Path, capsys):
    config = resources_server_config(workdir)
    jsonl(workdir / "data" / "train.jsonl", ROW_V1, ROW_V2)
    upload = ["dataset", "upload", "-i", "data/train.jsonl", "--resource-config", str(config), *hf_overrides(hub)]
    assert gym_main(upload) == 0
    out = capsys.readouterr().out
    assert f"to {REPO}" in out and "Added to collection acme/rl-environments-" in out
    assert hub.repos[REPO].private
    assert hub.files(REPO)["train.jsonl"] == (workdir / "data" / "train.jsonl").read_bytes()
    slug = f"acme/rl-environments-{COLLECTION_SUFFIX}"
    assert [item["id"] for item in hub.collections[slug]["items"]] == [REPO]

    jsonl(workdir / "data" / "validation.jsonl", {"question": "raw row, allowed outside train"})
    assert gym_main([*upload[:3], "data/validation.jsonl", *upload[4:], "--split", "validation"]) == 0
    assert "Already in collection" in capsys.readouterr().out
    assert len(hub.collections[slug]["items"]) == 1

    assert gym_main([*upload, "--revision", "0.0.1"]) == 0
    assert hub.files(REPO, "0.0.1")["train.jsonl"] == hub.files(REPO)["train.jsonl"]
    assert gym_main([*upload, "--revision", "0.0.1"]) == 1
    assert "already has train.jsonl" in capsys.readouterr().err

    out_dir = workdir / "downloaded"
    download = ["dataset", "download", "--repo-id", REPO, *hf_overrides(hub)]
    assert gym_main([*download, "--split", "train", "-o", str(out_dir / "t.jsonl")]) == 0
    assert gym_main([*download, "--artifact", "validation.jsonl", "--output-dir", str(out_dir)]) == 0
    assert gym_main([*download, "--output-dir", str(out_dir / "all")]) == 0
    assert rows_of(out_dir / "t.jsonl") == [ROW_V1, ROW_V2]
    assert rows_of(out_dir / "validation.jsonl") == [{"question": "raw row, allowed outside train"}]
    assert sorted(p.name for p in (out_dir / "all").iterdir()) == ["train.jsonl", "validation.jsonl"]
    capsys.readouterr()
    assert gym_main([*download, "--split", "train", "-o", str(out_dir / "t.jsonl")]) == 1
    assert "already exists" in capsys.readouterr().err
    assert gym_main([*download, "--revision", "0.0.1", "--split", "train", "-o", str(out_dir / "t.jsonl"),
                     "--overwrite"]) == 0  # fmt: skip
    assert hub.calls("HEAD", f"/datasets/{REPO}/resolve/0.0.1/train.jsonl")


@pytest.mark.timeout(120)
def test_cli_create_pr_leaves_main_alone(hub: HubContractServer, workdir: Path, capsys):
    config = resources_server_config(workdir)
    jsonl(workdir / "train.jsonl", ROW_V1)
    upload = ["dataset", "upload", "-i", "train.jsonl", "--resource-config", str(config), *hf_overrides(hub)]
    assert gym_main(upload) == 0
    jsonl(workdir / "train.jsonl", ROW_V2)
    assert gym_main([*upload, "--create-pr"]) == 0
    assert "/discussions/1" in capsys.readouterr().out
    assert hub.files(REPO)["train.jsonl"] == (json.dumps(ROW_V1) + "\n").encode()
    assert hub.files(REPO, "refs/pr/1")["train.jsonl"] == (json.dumps(ROW_V2) + "\n").encode()
    assert hub.calls("POST", f"/api/datasets/{REPO}/commit/main")[-1][2] == {"create_pr": "1"}


@pytest.mark.timeout(120)
def test_upload_is_refused_before_any_commit(hub: HubContractServer, workdir: Path, capsys):
    config = resources_server_config(workdir)
    jsonl(workdir / "bad.jsonl", {"question": "no create params"})
    base = ["dataset", "upload", "--resource-config", str(config), *hf_overrides(hub)]
    assert gym_main([*base, "-i", "bad.jsonl"]) == 1
    assert "bad.jsonl:1: train rows need responses_create_params" in capsys.readouterr().err
    jsonl(workdir / "good.jsonl", ROW_V1)
    assert gym_main([*base, "-i", "good.jsonl", "++hf_collection_slug=ffffffffffffffffffffffff"]) == 1
    assert "collection acme/rl-environments-ffffffffffffffffffffffff does not exist" in capsys.readouterr().err
    assert not hub.calls("POST", "/commit/"), "nothing is committed when the checks fail"


@pytest.mark.timeout(120)
def test_private_repo_needs_the_token(hub: HubContractServer, tmp_path: Path):
    HfDatasetRegistry(hub.token, endpoint=hub.endpoint).upload(REPO, None, jsonl(tmp_path / "train.jsonl", ROW_V1))
    anonymous = HfDatasetRegistry(None, endpoint=hub.endpoint)
    with pytest.raises(DatasetNotFoundError, match="set hf_token"):
        anonymous.download(REPO, None, "train.jsonl", tmp_path / "out.jsonl")
    with pytest.raises(RegistryError, match="hf_token"):
        anonymous.upload(REPO, None, tmp_path / "train.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.timeout(120)
def test_download_dataset_source_from_the_hub(hub: HubContractServer, workdir: Path):
    registry = HfDatasetRegistry(hub.token, endpoint=hub.endpoint)
    registry.upload(REPO, None, jsonl(workdir / "up" / "train.jsonl", ROW_V1))
    registry.upload(REPO, None, jsonl(workdir / "up" / "validation.jsonl", ROW_V2))
    config = {"hf_token": hub.token, "hf_endpoint": hub.endpoint}
    by_split = DatasetConfig(
        name="v", type="validation", jsonl_fpath="data/v.jsonl", source={"type": "huggingface", "repo_id": REPO}
    )
    by_file = DatasetConfig(
        name="t",
        type="train",
        jsonl_fpath="data/t.jsonl",
        source={"type": "huggingface", "repo_id": REPO, "artifact_fpath": "train.jsonl"},
    )
    assert rows_of(download_dataset_source(by_split, config)) == [ROW_V2]
    assert rows_of(download_dataset_source(by_file, config)) == [ROW_V1]


@pytest.mark.timeout(60)
def test_an_unreachable_hub_is_one_registry_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(RegistryError, match="cannot reach http://127.0.0.1"):
        HfDatasetRegistry("token", endpoint=closed).list_versions(REPO)
