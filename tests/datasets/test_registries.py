"""Dataset registries: the local directory registry, a real MLflow tracking server, and the shared checks.

The MLflow tests start ``mlflow server`` on loopback once for the module (SQLite store, proxied artifacts) and run
upload -> download -> remove round trips through the library and through the ``gym`` / legacy ``ng_*`` commands.
The Hugging Face backend is tested against a contract server in ``test_registries_hf.py``.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from nemo_gym.cli.flags import quote
from nemo_gym.cli.legacy import main as legacy_main
from nemo_gym.cli.main import main as gym_main
from nemo_gym.config_types import DatasetConfig
from nemo_gym.datasets.storage import (
    DatasetRegistry,
    RegistryError,
    download_dataset_source,
    get_registry,
    validate_version,
    verify_upload_file,
)
from nemo_gym.datasets.storage.base import validate_artifact, write_atomically
from nemo_gym.datasets.storage.local import LocalDatasetRegistry
from tests.datasets.mlflow_server import mlflow_server_missing, running_mlflow_server
from tests.datasets.registry_helpers import (
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

# ---------------------------------------------------------------------------------------------------------------------
# Shared checks


@pytest.mark.parametrize("version", ["0.0.1", "1.20.300"])
def test_versions_are_x_y_z(version: str):
    assert validate_version(version) == version


@pytest.mark.parametrize("version", ["0.1", "v0.0.1", "0.0.1-rc1", "01.0.0", "", None, "1.0.0.0"])
def test_other_versions_are_rejected(version):
    with pytest.raises(RegistryError, match="x.y.z"):
        validate_version(version)


@pytest.mark.parametrize("artifact", ["../x.jsonl", "/abs.jsonl", "a//b.jsonl", "a/./b.jsonl", "", "a\\b.jsonl"])
def test_artifact_paths_stay_inside_the_version(artifact: str):
    with pytest.raises(RegistryError):
        validate_artifact(artifact)


def test_upload_verification_lists_every_bad_line(tmp_path: Path):
    path = jsonl(
        tmp_path / "d.jsonl", ROW_V1, {"question": "no params"}, "not json", "[1]", {"responses_create_params": 5}
    )
    with pytest.raises(RegistryError) as error:
        verify_upload_file(path, "train")
    message = str(error.value)
    assert "4 invalid row(s)" in message and "nothing was uploaded" in message
    for line in (2, 3, 4, 5):
        assert f"{path}:{line}:" in message
    assert f"{path}:1:" not in message


def test_only_train_rows_need_create_params(tmp_path: Path):
    path = jsonl(tmp_path / "d.jsonl", {"question": "raw benchmark row"}, {"question": "another"})
    assert verify_upload_file(path, "validation") == 2
    assert verify_upload_file(path, None) == 2
    with pytest.raises(RegistryError, match="train rows need responses_create_params"):
        verify_upload_file(path, "train")
    with pytest.raises(RegistryError, match="no rows"):
        verify_upload_file(write(tmp_path / "empty.jsonl", "\n"), "validation")


def test_a_failed_download_leaves_the_target_untouched(tmp_path: Path):
    dest = write(tmp_path / "data.jsonl", "old\n")

    def broken(temporary: Path) -> None:
        temporary.write_text("half a fi")
        raise OSError("connection reset")

    with pytest.raises(OSError, match="connection reset"):
        write_atomically(dest, True, broken)
    assert dest.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["data.jsonl"]


def test_unknown_storage_is_an_error():
    with pytest.raises(RegistryError, match="unknown dataset storage 's3'"):
        get_registry("s3", {})


def test_missing_gitlab_credentials_name_the_env_yaml_keys():
    with pytest.raises(RegistryError) as error:
        get_registry("gitlab", {"mlflow_tracking_uri": "http://127.0.0.1:1"})
    message = str(error.value)
    assert "\n" not in message
    assert "mlflow_tracking_token" in message and "env.yaml" in message and "mlflow_tracking_uri:" in message


@pytest.mark.timeout(60)
def test_cli_missing_credentials_is_one_line(workdir: Path, capsys):
    jsonl(workdir / "train.jsonl", ROW_V1)
    assert gym_main(["dataset", "upload", "--storage", "gitlab", "--name", "d", "--revision", "0.0.1", "-i",
                     "train.jsonl"]) == 1  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "mlflow_tracking_uri and mlflow_tracking_token" in err and "env.yaml" in err
    assert gym_main(["dataset", "upload", "-i", "train.jsonl", "+hf_token=t"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "hf_organization, hf_collection_name and hf_collection_slug" in err and "env.yaml" in err


# ---------------------------------------------------------------------------------------------------------------------
# Local directory registry


def test_local_round_trip(tmp_path: Path):
    registry = LocalDatasetRegistry(tmp_path / "registry")
    assert isinstance(registry, DatasetRegistry)
    registry_round_trip(registry, "multineedle", tmp_path)


def test_local_layout_and_index(tmp_path: Path):
    registry = LocalDatasetRegistry(tmp_path / "registry")
    registry.upload("ds", "0.0.10", jsonl(tmp_path / "train.jsonl", ROW_V1))
    registry.upload("ds", "0.0.9", jsonl(tmp_path / "train.jsonl", ROW_V2))
    assert (tmp_path / "registry" / "ds" / "0.0.10" / "train.jsonl").is_file()
    index = json.loads((tmp_path / "registry" / "ds" / "index.json").read_text())
    assert list(index["versions"]) == ["0.0.9", "0.0.10"]
    entry = index["versions"]["0.0.10"]["files"]["train.jsonl"]
    assert entry["size"] == (tmp_path / "registry" / "ds" / "0.0.10" / "train.jsonl").stat().st_size
    assert len(entry["sha256"]) == 64
    assert registry.list_versions("ds") == ["0.0.9", "0.0.10"]
    assert registry.list_artifacts("ds", "0.0.9") == ["train.jsonl"]


def test_local_download_detects_a_corrupted_file(tmp_path: Path):
    registry = LocalDatasetRegistry(tmp_path / "registry")
    registry.upload("ds", "0.0.1", jsonl(tmp_path / "train.jsonl", ROW_V1))
    write(tmp_path / "registry" / "ds" / "0.0.1" / "train.jsonl", "tampered\n")
    with pytest.raises(RegistryError, match="sha256"):
        registry.download("ds", "0.0.1", "train.jsonl", tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_local_rejects_unsafe_names(tmp_path: Path):
    registry = LocalDatasetRegistry(tmp_path / "registry")
    for name in ("../escape", "a/b", ".hidden", ""):
        with pytest.raises(RegistryError, match="dataset name"):
            registry.upload(name, "0.0.1", jsonl(tmp_path / "t.jsonl", ROW_V1))


def test_local_registry_dir_defaults_under_cache_dir(tmp_path: Path):
    assert LocalDatasetRegistry.from_config({"cache_dir": str(tmp_path)}).root == tmp_path / "dataset_registry"
    chosen = LocalDatasetRegistry.from_config({"cache_dir": "x", "local_dataset_registry_dir": str(tmp_path / "r")})
    assert chosen.root == tmp_path / "r"


def test_download_dataset_source_from_the_local_registry(workdir: Path):
    LocalDatasetRegistry(workdir / "reg").upload("env_a", "0.0.1", jsonl(workdir / "up" / "train.jsonl", ROW_V1))
    config = {"versioned_dataset_storage": "local", "local_dataset_registry_dir": str(workdir / "reg")}
    dataset = DatasetConfig(
        name="train",
        type="train",
        jsonl_fpath="data/train.jsonl",
        source={"type": "gitlab", "dataset_name": "env_a", "version": "0.0.1", "artifact_fpath": "train.jsonl"},
    )
    assert download_dataset_source(dataset, config) == workdir / "data" / "train.jsonl"
    assert rows_of(workdir / "data" / "train.jsonl") == [ROW_V1]
    with pytest.raises(RegistryError, match="already exists"):
        download_dataset_source(dataset, config)


@pytest.mark.timeout(60)
def test_collate_download_fetches_from_the_local_registry(workdir: Path, capsys):
    from tests.datasets.conftest import env_config

    LocalDatasetRegistry(workdir / "reg").upload("remote", "0.0.1", jsonl(workdir / "up" / "train.jsonl", ROW_V1))
    source = "{type: gitlab, dataset_name: remote, version: 0.0.1, artifact_fpath: train.jsonl}"
    datasets = (
        f"      - {{name: train, type: train, jsonl_fpath: data/remote/train.jsonl, license: MIT, source: {source}}}\n"
    )
    write(workdir / "configs" / "remote.yaml", env_config("remote", datasets))
    code = gym_main(["dataset", "collate", "-c", "configs/remote.yaml", "--mode", "train_preparation", "-o", "o",
                     "--download", "+versioned_dataset_storage=local",
                     "+local_dataset_registry_dir=" + quote(workdir / "reg")])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert rows_of(workdir / "data" / "remote" / "train.jsonl") == [ROW_V1]
    assert [row["responses_create_params"] for row in rows_of(workdir / "o" / "train.jsonl")] == [
        ROW_V1["responses_create_params"]
    ]


@pytest.mark.timeout(60)
def test_local_cli_round_trip(workdir: Path, capsys, monkeypatch: pytest.MonkeyPatch):
    root = ["+local_dataset_registry_dir=" + quote(workdir / "reg")]
    jsonl(workdir / "v1.jsonl", ROW_V1)
    jsonl(workdir / "v2.jsonl", ROW_V2)
    upload = ["dataset", "upload", "--storage", "local", "--name", "ds", "--artifact", "train.jsonl", *root]
    assert gym_main([*upload, "--revision", "0.0.1", "-i", "v1.jsonl"]) == 0
    assert "gym dataset download --storage local --name ds --revision 0.0.1" in capsys.readouterr().out
    assert gym_main([*upload, "--revision", "0.0.2", "-i", "v2.jsonl"]) == 0
    capsys.readouterr()
    assert gym_main(["dataset", "versions", "--storage", "local", "--name", "ds", *root]) == 0
    assert capsys.readouterr().out.split() == ["0.0.1", "0.0.2"]

    download = ["dataset", "download", "--storage", "local", "--name", "ds", "--artifact", "train.jsonl", *root]
    assert gym_main([*download, "--revision", "0.0.1", "-o", "out/a.jsonl"]) == 0
    assert gym_main([*download, "--revision", "0.0.2", "--output-dir", "out"]) == 0
    assert (rows_of(workdir / "out" / "a.jsonl"), rows_of(workdir / "out" / "train.jsonl")) == ([ROW_V1], [ROW_V2])
    capsys.readouterr()
    assert gym_main([*download, "--revision", "0.0.2", "-o", "out/a.jsonl"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert gym_main([*download, "--revision", "0.0.2", "-o", "out/a.jsonl", "--overwrite"]) == 0
    assert rows_of(workdir / "out" / "a.jsonl") == [ROW_V2]

    rm = ["dataset", "rm", "--storage", "local", "--name", "ds", *root]
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert gym_main(rm) == 1
    assert "pass --yes" in capsys.readouterr().err

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Terminal())
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert gym_main([*rm, "--revision", "0.0.1"]) == 1
    assert "cancelled" in capsys.readouterr().err
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert gym_main([*rm, "--revision", "0.0.1"]) == 0
    assert LocalDatasetRegistry(workdir / "reg").list_versions("ds") == ["0.0.2"]
    assert gym_main([*rm, "--yes"]) == 0
    assert LocalDatasetRegistry(workdir / "reg").list_versions("ds") == []
    assert gym_main([*rm, "--yes"]) == 1
    assert "not in the local registry" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------------
# A real MLflow tracking server


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory):
    reason = mlflow_server_missing()
    if reason:
        pytest.skip(reason)
    with running_mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mlflow_round_trip(mlflow_uri: str, tmp_path: Path):
    from nemo_gym.datasets.storage.mlflow import MlflowDatasetRegistry

    registry = get_registry("gitlab", {"mlflow_tracking_uri": mlflow_uri, "mlflow_tracking_token": "unused"})
    assert isinstance(registry, MlflowDatasetRegistry) and not registry.gitlab
    registry_round_trip(registry, "multineedle", tmp_path)
    assert "MLFLOW_TRACKING_TOKEN" not in os.environ, "the token is only set while talking to the server"


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mlflow_legacy_commands_with_env_yaml(mlflow_uri: str, workdir: Path, capsys, monkeypatch):
    env_yaml = write(workdir / "env.yaml", f"mlflow_tracking_uri: {mlflow_uri}\nmlflow_tracking_token: unused\n")
    monkeypatch.setenv("NEMO_GYM_ENV_YAML", str(env_yaml))
    jsonl(workdir / "data" / "train.jsonl", ROW_V1)
    for version in ("0.0.1", "0.0.2"):
        assert legacy_main(["ng_upload_dataset_to_gitlab", "+dataset_name=legacy_ds", f"+version={version}",
                            "+input_jsonl_fpath=data/train.jsonl"]) == 0  # fmt: skip
    assert "gym dataset upload --storage gitlab" in capsys.readouterr().err  # the deprecation notice
    assert legacy_main(["ng_download_dataset_from_gitlab", "+dataset_name=legacy_ds", "+version=0.0.2",
                        "+artifact_fpath=train.jsonl", "+output_fpath=out/train.jsonl"]) == 0  # fmt: skip
    assert rows_of(workdir / "out" / "train.jsonl") == [ROW_V1]
    capsys.readouterr()
    assert gym_main(["dataset", "versions", "--name", "legacy_ds"]) == 0
    assert capsys.readouterr().out.split() == ["0.0.1", "0.0.2"]
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert legacy_main(["ng_delete_dataset_from_gitlab", "+dataset_name=legacy_ds"]) == 1
    assert "pass --yes" in capsys.readouterr().err
    assert legacy_main(["ng_delete_dataset_from_gitlab", "+dataset_name=legacy_ds", "--yes"]) == 0
    assert (
        get_registry("gitlab", {"mlflow_tracking_uri": mlflow_uri, "mlflow_tracking_token": "x"}).list_versions(
            "legacy_ds"
        )
        == []
    )


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mlflow_download_dataset_source_picks_data_source(mlflow_uri: str, workdir: Path):
    config = {"mlflow_tracking_uri": mlflow_uri, "mlflow_tracking_token": "unused", "data_source": "gitlab"}
    get_registry("gitlab", config).upload("src_ds", "1.0.0", jsonl(workdir / "up" / "all.jsonl", ROW_V2))
    with pytest.warns(DeprecationWarning):
        dataset = DatasetConfig(
            name="train",
            type="train",
            jsonl_fpath="data/train.jsonl",
            gitlab_identifier={"dataset_name": "src_ds", "version": "1.0.0", "artifact_fpath": "all.jsonl"},
            huggingface_identifier={"repo_id": "acme/not-used-here"},
        )
    assert download_dataset_source(dataset, config) == workdir / "data" / "train.jsonl"
    assert rows_of(workdir / "data" / "train.jsonl") == [ROW_V2]


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The Hub contract server of test_registries_hf.py, the target of ``gym dataset migrate``."""
    with running_hub(tmp_path, monkeypatch) as server:
        yield server


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_migrate_moves_a_dataset_from_mlflow_to_the_hub(mlflow_uri: str, hub, workdir: Path, capsys, monkeypatch):
    config = resources_server_config(workdir)
    jsonl(workdir / "train.jsonl", ROW_V1)
    gitlab_keys = [f"+mlflow_tracking_uri={quote(mlflow_uri)}", "+mlflow_tracking_token=unused"]
    gitlab = get_registry("gitlab", {"mlflow_tracking_uri": mlflow_uri, "mlflow_tracking_token": "unused"})
    gitlab.upload("my_env", "0.0.1", workdir / "train.jsonl")
    migrate = ["dataset", "migrate", "-i", "train.jsonl", "--resource-config", str(config)]
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert gym_main([*migrate, *hf_overrides(hub), *gitlab_keys]) == 1
    assert "pass --yes" in capsys.readouterr().err
    assert REPO not in hub.repos, "the question comes before the upload"
    assert gym_main([*migrate, *hf_overrides(hub), *gitlab_keys, "+delete_from_gitlab=true", "--yes"]) == 1
    assert "delete_from_gitlab cannot be set" in capsys.readouterr().err
    assert gym_main([*migrate, *hf_overrides(hub), *gitlab_keys, "--yes"]) == 0
    assert "Deleted dataset 'my_env' from the gitlab registry" in capsys.readouterr().out
    assert hub.files(REPO)["train.jsonl"] == (workdir / "train.jsonl").read_bytes()
    assert gitlab.list_versions("my_env") == []
