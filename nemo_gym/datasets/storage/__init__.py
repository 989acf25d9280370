"""Pick a dataset registry backend (``--storage``) and fetch declared dataset sources.

The interface and what every backend shares are in :mod:`.base`; each backend imports its client library only when
chosen here, so commands that never touch a registry do not pay for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_gym.config.datasets import DatasetConfig, GitlabDatasetSource, HuggingFaceDatasetSource
from nemo_gym.datasets.storage.base import (
    HF_UPLOAD_CREDENTIAL_KEYS,
    STORAGES,
    VERSIONED_STORAGE_KEY,
    DatasetNotFoundError,
    DatasetRegistry,
    require_keys,
    validate_version,
    verify_upload_file,
)
from nemo_gym.errors import RegistryError

__all__ = [
    "HF_UPLOAD_CREDENTIAL_KEYS",
    "STORAGES",
    "VERSIONED_STORAGE_KEY",
    "DatasetNotFoundError",
    "DatasetRegistry",
    "RegistryError",
    "download_dataset_source",
    "get_registry",
    "require_keys",
    "validate_version",
    "verify_upload_file",
]


def get_registry(storage: str, global_config: Mapping[str, Any]) -> DatasetRegistry:
    """The registry for ``storage`` (``gitlab``, ``hf`` or ``local``), configured from the global config.

    Backends import their client library only here, so commands that never touch a registry do not pay for it.
    """
    if storage == "local":
        from nemo_gym.datasets.storage.local import LocalDatasetRegistry

        return LocalDatasetRegistry.from_config(global_config)
    if storage == "gitlab":
        from nemo_gym.datasets.storage.mlflow import MlflowDatasetRegistry

        return MlflowDatasetRegistry.from_config(global_config)
    if storage in ("hf", "huggingface"):
        from nemo_gym.datasets.storage.hf import HfDatasetRegistry

        return HfDatasetRegistry.from_config(global_config)
    raise RegistryError(f"unknown dataset storage {storage!r}; choose one of: {', '.join(STORAGES)}")


def download_dataset_source(
    dataset: DatasetConfig, global_config: Mapping[str, Any], *, root: Path | None = None, overwrite: bool = False
) -> Path:
    """Fetch a declared dataset from its ``source:`` (or legacy identifier) into its ``jsonl_fpath``.

    With both legacy identifiers set, ``data_source`` (``gitlab`` or ``huggingface``, default ``huggingface``) picks
    one. A relative ``jsonl_fpath`` is taken relative to ``root`` (default: the working directory).
    """
    source = _pick_source(dataset, str(global_config.get("data_source") or "huggingface"))
    dest = Path(dataset.jsonl_fpath).expanduser()
    if not dest.is_absolute():
        dest = (root or Path.cwd()) / dest
    if isinstance(source, GitlabDatasetSource):
        storage = str(global_config.get(VERSIONED_STORAGE_KEY) or "gitlab")
        if storage not in ("gitlab", "local"):
            raise RegistryError(f"{VERSIONED_STORAGE_KEY} must be gitlab or local, got {storage!r}")
        registry = get_registry(storage, global_config)
        return registry.download(source.dataset_name, source.version, source.artifact_fpath, dest, overwrite=overwrite)
    from nemo_gym.datasets.storage.hf import HfDatasetRegistry

    hf = HfDatasetRegistry.from_config(global_config)
    if source.artifact_fpath:
        return hf.download(source.repo_id, None, source.artifact_fpath, dest, overwrite=overwrite)
    return hf.download_split(source.repo_id, None, dataset.type, dest, overwrite=overwrite)


def _pick_source(dataset: DatasetConfig, data_source: str) -> GitlabDatasetSource | HuggingFaceDatasetSource:
    gitlab, hf = dataset.gitlab_identifier, dataset.huggingface_identifier
    if gitlab is not None and hf is not None:
        if data_source not in ("gitlab", "huggingface"):
            raise RegistryError(f"data_source must be gitlab or huggingface, got {data_source!r}")
        if data_source == "gitlab":
            return GitlabDatasetSource(type="gitlab", **gitlab.model_dump())
        return HuggingFaceDatasetSource(type="huggingface", **hf.model_dump())
    if dataset.source is None:
        raise RegistryError(f"dataset {dataset.name!r} declares no `source:` to download {dataset.jsonl_fpath} from")
    return dataset.source
