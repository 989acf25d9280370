"""``gym dataset upload / download / rm / migrate / versions``: versioned datasets in a registry.

``--storage`` picks the registry: ``hf`` (the Hugging Face Hub, default for upload and download), ``gitlab`` (an
MLflow model registry, GitLab's in practice; default for rm) or ``local`` (a directory, for teams without a server).
Legacy names: ``ng_upload_dataset_to_gitlab`` / ``ng_download_dataset_from_gitlab`` = ``--storage gitlab``,
``ng_upload_dataset_to_hf`` / ``ng_download_dataset_from_hf`` = the hf default, ``ng_delete_dataset_from_gitlab`` =
``rm``, ``ng_gitlab_to_hf_dataset`` = ``migrate``. Every flag is sugar for a ``+key=value`` override, so the legacy
spellings (``+dataset_name=... +version=...``) keep working.
"""

from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath
from typing import Any

from nemo_gym.cli.command import Command, Invocation
from nemo_gym.cli.flags import Flag, quote
from nemo_gym.cli.output import console
from nemo_gym.errors import ConfigError

STORAGE_FLAG = Flag(
    ("--storage",),
    "registry: hf (Hugging Face Hub, default), gitlab (MLflow model registry) or local",
    metavar="hf|gitlab|local",
)
REVISION_FLAG = Flag(
    ("--revision",),
    "version x.y.z (gitlab, local) or branch (hf); sets `version` and `revision`",
    override_key="version",
    metavar="REV",
)
NAME_FLAG = Flag(
    ("--name",),
    "dataset name (hf upload: defaults to the resources server's directory name)",
    override_key="dataset_name",
    metavar="NAME",
)
ARTIFACT_FLAG = Flag(
    ("--artifact",),
    "file inside the version (upload default: the input's file name)",
    override_key="artifact_fpath",
    metavar="FILE",
)
SPLIT_FLAG = Flag(
    ("--split",),
    "train, validation or test (upload default train: rows need responses_create_params)",
    override_key="split",
    metavar="SPLIT",
)
CREATE_PR_FLAG = Flag(
    ("--create-pr",), "hf: open a pull request instead of committing", override_key="create_pr", switch=True
)
RESOURCE_CONFIG_FLAG = Flag(
    ("--resource-config",),
    "hf: config of the resources server the data is for (its domain and directory name the repo)",
    override_key="resource_config_path",
    metavar="PATH",
)
OVERWRITE_FLAG = Flag(("--overwrite",), "replace an existing file", override_key="overwrite", switch=True)
YES_FLAG = Flag(("--yes", "-y"), "delete without asking (needed when not on a terminal)", switch=True)

UPLOAD_FLAGS = (
    STORAGE_FLAG,
    Flag(("--input", "-i"), "JSONL file to upload", override_key="input_jsonl_fpath", metavar="PATH"),
    NAME_FLAG, REVISION_FLAG, SPLIT_FLAG, CREATE_PR_FLAG, RESOURCE_CONFIG_FLAG, ARTIFACT_FLAG, OVERWRITE_FLAG,
    Flag(("--delete-from-gitlab",), "hf: afterwards delete the dataset from the GitLab registry",
         override_key="delete_from_gitlab", switch=True),
    YES_FLAG,
)  # fmt: skip
DOWNLOAD_FLAGS = (
    STORAGE_FLAG,
    Flag(("--repo-id",), "hf: dataset repo id (org/name)", override_key="repo_id", metavar="ORG/NAME"),
    NAME_FLAG, REVISION_FLAG, ARTIFACT_FLAG,
    Flag(("--output", "-o"), "file to write", override_key="output_fpath", metavar="PATH"),
    Flag(("--output-dir",), "directory to write into (hf without --artifact/--split: every split)",
         override_key="output_dirpath", metavar="DIR"),
    Flag(("--split",), "hf: download a split (train, validation, test) instead of one --artifact",
         override_key="split", metavar="SPLIT"),
    OVERWRITE_FLAG,
)  # fmt: skip
RM_FLAGS = (
    Flag(("--storage",), "registry: gitlab (default) or local", metavar="gitlab|local"),
    NAME_FLAG,
    Flag(("--revision",), "delete only this version x.y.z", override_key="version", metavar="X.Y.Z"),
    YES_FLAG,
)  # fmt: skip
MIGRATE_FLAGS = (
    Flag(("--input", "-i"), "JSONL file to upload to the Hub", override_key="input_jsonl_fpath", metavar="PATH"),
    NAME_FLAG, REVISION_FLAG, SPLIT_FLAG, CREATE_PR_FLAG, RESOURCE_CONFIG_FLAG, ARTIFACT_FLAG, YES_FLAG,
)  # fmt: skip
VERSIONS_FLAGS = (
    STORAGE_FLAG,
    NAME_FLAG,
    Flag(("--repo-id",), "hf: dataset repo id (org/name)", override_key="repo_id", metavar="ORG/NAME"),
)


# ---------------------------------------------------------------------------------------------------------------------
# Helpers


def _storage(invocation: Invocation, default: str, allowed: tuple[str, ...] = ("hf", "gitlab", "local")) -> str:
    storage = invocation.get("storage") or default
    if storage == "huggingface":
        storage = "hf"
    if storage not in allowed:
        raise ConfigError(f"--storage {storage!r} is not one of: {', '.join(allowed)}")
    return storage


def _config(invocation: Invocation) -> dict[str, Any]:
    """The composed config as a plain dict; ``--revision`` also sets ``revision`` (the Hub's name for it)."""
    from nemo_gym.config.tree import plain_dict
    from nemo_gym.global_config import parse_global_config_dict

    tokens = list(invocation.overrides)
    revision = invocation.get("revision")
    if revision is not None and not any(t.lstrip("+").startswith("revision=") for t in tokens):
        tokens.append(f"+revision={quote(revision)}")
    config = parse_global_config_dict(tokens, dummy_model=True)
    return plain_dict(config)


def _confirm(question: str, yes: bool) -> None:
    """Ask on a terminal; elsewhere only ``--yes`` may delete, so a script never deletes by accident."""
    if yes:
        return
    if not sys.stdin or not sys.stdin.isatty():
        raise ConfigError(f"{question} Not asking in a non-interactive session: pass --yes to confirm")
    answer = input(f"{question} [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise ConfigError("cancelled; nothing was deleted")


# ---------------------------------------------------------------------------------------------------------------------
# upload


def upload(invocation: Invocation) -> int:
    storage = _storage(invocation, "hf")
    config = _config(invocation)
    if storage == "hf":
        return _upload_hf(config, invocation, always_delete_from_gitlab=False)
    from nemo_gym.datasets.storage import get_registry, verify_upload_file
    from nemo_gym.datasets.storage.cli_configs import UploadJsonlDatasetGitlabConfig

    registry = get_registry(storage, config)
    settings = UploadJsonlDatasetGitlabConfig.model_validate(config)
    source = Path(settings.input_jsonl_fpath).expanduser()
    rows = verify_upload_file(source, config.get("split") or "train")
    artifact = config.get("artifact_fpath") or source.name
    where = registry.upload(
        settings.dataset_name, settings.version, source, artifact=artifact, overwrite=bool(config.get("overwrite"))
    )
    console.print(f"Uploaded {source} ({rows} row(s)) to {where}", markup=False)
    console.print(
        f"Download it with: gym dataset download --storage {storage} --name {settings.dataset_name} "
        f"--revision {settings.version} --artifact {artifact} --output {source.name}",
        markup=False,
    )
    return 0


def _upload_hf(config: dict[str, Any], invocation: Invocation, always_delete_from_gitlab: bool) -> int:
    from nemo_gym.datasets.storage.hub_upload import upload_to_hub

    yes = bool(invocation.get("yes"))
    done = upload_to_hub(config, migrate=always_delete_from_gitlab, confirm=lambda question: _confirm(question, yes))
    console.print(
        f"Uploaded {done.source} ({done.rows} row(s), split {done.split}) to {done.repo_id}: {done.url}", markup=False
    )
    console.print(
        f"{'Added to' if done.added_to_collection else 'Already in'} collection {done.collection}", markup=False
    )
    if done.deleted_from_gitlab is not None:
        console.print(f"Deleted dataset {done.deleted_from_gitlab!r} from the gitlab registry", markup=False)
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# download


def download(invocation: Invocation) -> int:
    storage = _storage(invocation, "hf")
    config = _config(invocation)
    overwrite = bool(config.get("overwrite"))
    if storage == "hf":
        return _download_hf(config, overwrite)
    from nemo_gym.datasets.storage import get_registry
    from nemo_gym.datasets.storage.cli_configs import DownloadJsonlDatasetGitlabConfig

    registry = get_registry(storage, config)
    if not config.get("output_fpath") and config.get("output_dirpath") and config.get("artifact_fpath"):
        config["output_fpath"] = str(Path(config["output_dirpath"]) / PurePosixPath(config["artifact_fpath"]).name)
    settings = DownloadJsonlDatasetGitlabConfig.model_validate(config)
    written = registry.download(
        settings.dataset_name,
        settings.version,
        settings.artifact_fpath,
        Path(settings.output_fpath),
        overwrite=overwrite,
    )
    console.print(
        f"Downloaded {settings.dataset_name} {settings.version} {settings.artifact_fpath} to {written}", markup=False
    )
    return 0


def _download_hf(config: dict[str, Any], overwrite: bool) -> int:
    from nemo_gym.datasets.storage.cli_configs import DownloadJsonlDatasetHuggingFaceConfig
    from nemo_gym.datasets.storage.hf import HfDatasetRegistry

    settings = DownloadJsonlDatasetHuggingFaceConfig.model_validate(config)
    revision = config.get("revision") or None
    hf = HfDatasetRegistry.from_config(config)
    written: dict[str, Path] = {}
    directory = Path(settings.output_dirpath or ".")  # the config sets exactly one of output_fpath / output_dirpath
    if settings.artifact_fpath:
        dest = Path(settings.output_fpath or directory / PurePosixPath(settings.artifact_fpath).name)
        written[settings.artifact_fpath] = hf.download(
            settings.repo_id, revision, settings.artifact_fpath, dest, overwrite=overwrite
        )
    elif settings.split:
        dest = Path(settings.output_fpath or directory / f"{settings.split}.jsonl")
        written[settings.split] = hf.download_split(
            settings.repo_id, revision, settings.split, dest, overwrite=overwrite
        )
    else:
        written = hf.download_all_splits(settings.repo_id, revision, directory, overwrite=overwrite)
    for what, path in written.items():
        console.print(f"Downloaded {settings.repo_id} {what} to {path}", markup=False)
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# rm, migrate, versions


def rm(invocation: Invocation) -> int:
    from nemo_gym.datasets.storage import DatasetNotFoundError, get_registry, validate_version
    from nemo_gym.datasets.storage.cli_configs import DeleteJsonlDatasetGitlabConfig

    storage = _storage(invocation, "gitlab", ("gitlab", "local"))
    config = _config(invocation)
    registry = get_registry(storage, config)
    settings = DeleteJsonlDatasetGitlabConfig.model_validate(config)
    version = validate_version(config["version"]) if config.get("version") is not None else None
    versions = registry.list_versions(settings.dataset_name)
    if not versions:
        raise DatasetNotFoundError(f"dataset {settings.dataset_name!r} is not in the {storage} registry")
    if version is not None and version not in versions:
        raise DatasetNotFoundError(
            f"dataset {settings.dataset_name!r} has no version {version} (has: {', '.join(versions)})"
        )
    from nemo_gym.datasets.storage.hub_upload import describe_versions

    name = settings.dataset_name
    what = f"version {version} of dataset {name!r}" if version else f"dataset {name!r} ({describe_versions(versions)})"
    _confirm(f"Delete {what} from the {storage} registry?", bool(invocation.get("yes")))
    registry.delete(name, version)
    console.print(f"Deleted {what} from the {storage} registry", markup=False)
    return 0


def migrate(invocation: Invocation) -> int:
    """Upload to the Hub, then delete the GitLab copy (asked up front, before anything is uploaded)."""
    return _upload_hf(_config(invocation), invocation, always_delete_from_gitlab=True)


def versions(invocation: Invocation) -> int:
    from nemo_gym.datasets.storage import get_registry

    storage = _storage(invocation, "gitlab")
    config = _config(invocation)
    name = config.get("repo_id") if storage == "hf" and config.get("repo_id") else config.get("dataset_name")
    if not name:
        raise ConfigError("name the dataset: --name NAME (hf: --repo-id ORG/NAME)")
    found = get_registry(storage, config).list_versions(str(name))
    if not found:
        console.print(f"{name}: no versions in the {storage} registry", markup=False)
    for version in found:
        console.print(version, markup=False)
    return 0


COMMANDS: tuple[Command, ...] = (
    Command(
        "dataset",
        "upload",
        "check a JSONL file and upload it to a dataset registry (--storage hf|gitlab|local)",
        upload,
        UPLOAD_FLAGS,
        examples=(
            "example: gym dataset upload --storage gitlab --name multineedle --revision 0.0.1 -i data/train.jsonl",
            "example: gym dataset upload --storage hf -i data/train.jsonl "
            "--resource-config resources_servers/my_env/configs/my_env.yaml",
        ),
    ),
    Command(
        "dataset",
        "download",
        "download a dataset file from a registry (atomic; refuses to overwrite without --overwrite)",
        download,
        DOWNLOAD_FLAGS,
        examples=(
            "example: gym dataset download --storage gitlab --name multineedle --revision 0.0.1 "
            "--artifact train.jsonl -o data/train.jsonl",
            "example: gym dataset download --repo-id org/Nemotron-RL-math-my_env --split train -o data/train.jsonl",
        ),
    ),
    Command(
        "dataset",
        "rm",
        "delete a dataset (or one --revision of it) from the gitlab or local registry",
        rm,
        RM_FLAGS,
        examples=("example: gym dataset rm --name old_dataset --yes",),
    ),
    Command(
        "dataset",
        "migrate",
        "upload a dataset to the Hugging Face Hub, then delete it from the gitlab registry",
        migrate,
        MIGRATE_FLAGS,
        examples=(
            "example: gym dataset migrate -i data/train.jsonl "
            "--resource-config resources_servers/my_env/configs/my_env.yaml",
        ),
    ),
    Command(
        "dataset",
        "versions",
        "list the versions of a dataset in a registry",
        versions,
        VERSIONS_FLAGS,
        examples=("example: gym dataset versions --storage local --name multineedle",),
    ),
)
