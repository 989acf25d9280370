"""Publish a dataset to the Hugging Face Hub, optionally moving it off the GitLab registry (``gym dataset migrate``).

The repo id and collection are derived from the resources server the dataset belongs to, so every team's datasets
land in the same place. A migration asks its question before anything is uploaded (a "no" leaves both registries as
they were) and deletes the GitLab copy only after the upload succeeded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym.datasets.storage.base import HF_UPLOAD_CREDENTIAL_KEYS, require_keys, verify_upload_file
from nemo_gym.datasets.storage.cli_configs import (
    UploadJsonlDatasetHuggingFaceConfig,
    UploadJsonlDatasetHuggingFaceMaybeDeleteConfig,
)
from nemo_gym.errors import ConfigError, RegistryError

Confirm = Callable[[str], None]
"""Asks the user a yes/no question and raises (a :class:`ConfigError`) unless the answer is yes."""


@dataclass(frozen=True)
class HubUpload:
    """What :func:`upload_to_hub` did, for the caller to report."""

    source: Path
    rows: int
    split: str
    repo_id: str
    url: str
    collection: str
    added_to_collection: bool
    deleted_from_gitlab: str | None


def describe_versions(versions: list[str]) -> str:
    """``"2 versions: 0.0.1, 0.0.2"``, for questions and messages about a dataset's versions."""
    if not versions:
        return "no versions"
    return f"{len(versions)} version{'s' if len(versions) > 1 else ''}: {', '.join(versions)}"


def upload_to_hub(config: Mapping[str, Any], *, migrate: bool, confirm: Confirm) -> HubUpload:
    """Upload ``input_jsonl_fpath`` to its Hub repo; with ``migrate`` (or ``delete_from_gitlab``) then delete the
    dataset from the GitLab registry, after ``confirm`` agreed, which it is asked before the upload starts."""
    from nemo_gym.datasets.storage import get_registry
    from nemo_gym.datasets.storage.hf import HfDatasetRegistry, collection_slug, hf_repo_id, resources_server_identity

    require_keys(config, HF_UPLOAD_CREDENTIAL_KEYS, "hf")
    settings: UploadJsonlDatasetHuggingFaceConfig | UploadJsonlDatasetHuggingFaceMaybeDeleteConfig
    if migrate:
        settings = UploadJsonlDatasetHuggingFaceConfig.model_validate(config)
        delete_from_gitlab = True
    else:
        settings = UploadJsonlDatasetHuggingFaceMaybeDeleteConfig.model_validate(config)
        delete_from_gitlab = bool(settings.delete_from_gitlab)
    directory, domain = resources_server_identity(Path(settings.resource_config_path).expanduser())
    name = settings.dataset_name or directory
    repo_id = hf_repo_id(settings.hf_organization, settings.hf_dataset_prefix, domain, name)
    slug = collection_slug(settings.hf_organization, settings.hf_collection_name, settings.hf_collection_slug)
    source = Path(settings.input_jsonl_fpath).expanduser()
    rows = verify_upload_file(source, settings.split)
    gitlab = None
    if delete_from_gitlab:
        gitlab = get_registry("gitlab", config)
        gitlab_versions = gitlab.list_versions(name)
        if not gitlab_versions:
            raise ConfigError(f"dataset {name!r} is not in the gitlab registry, so there is nothing to migrate")
        confirm(
            f"After uploading to {repo_id}, delete dataset {name!r} ({describe_versions(gitlab_versions)}) from "
            "the gitlab registry?"
        )
    hub = HfDatasetRegistry.from_config(config)
    hub.ensure_collection(slug)
    url = hub.upload(
        repo_id,
        settings.revision,
        source,
        artifact=config.get("artifact_fpath") or None,
        overwrite=bool(config.get("overwrite")),
        create_pr=settings.create_pr,
        commit_message=settings.commit_message,
        commit_description=settings.commit_description,
    )
    added = hub.add_to_collection(repo_id, slug)
    if gitlab is not None:
        try:
            gitlab.delete(name)
        except RegistryError as exc:
            raise RegistryError(
                f"uploaded to {repo_id} ({url}), but deleting {name!r} from gitlab failed: {exc}"
            ) from exc
    return HubUpload(
        source=source,
        rows=rows,
        split=str(settings.split),
        repo_id=repo_id,
        url=str(url),
        collection=slug,
        added_to_collection=added,
        deleted_from_gitlab=name if gitlab is not None else None,
    )
