"""The configs of the dataset registry commands (``gym dataset upload / download / rm``, GitLab and Hugging Face).

Each is validated from the composed config by the command that uses it; ``+h`` prints its fields.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from omegaconf import DictConfig
from pydantic import Field, model_validator

from nemo_gym.config.command_config import BaseNeMoGymCLIConfig
from nemo_gym.config.datasets import JsonlDatasetGitlabIdentifer, JsonlDatasetHuggingFaceIdentifer


class UploadJsonlDatasetGitlabConfig(BaseNeMoGymCLIConfig):
    """Upload a local jsonl dataset artifact to Gitlab.

    Examples:

        gym dataset upload --storage gitlab +dataset_name=example_multi_step +version=0.0.1 \
+input_jsonl_fpath=data/train.jsonl
    """

    dataset_name: str = Field(description="The dataset name.")
    version: str = Field(description="The version, as x.y.z.")
    input_jsonl_fpath: str = Field(description="The local JSONL file to upload.")


class DownloadJsonlDatasetGitlabConfig(JsonlDatasetGitlabIdentifer, BaseNeMoGymCLIConfig):
    """Download a JSONL dataset from GitLab Model Registry.

    Examples:

        gym dataset download --storage gitlab +dataset_name=example_multi_step +version=0.0.1 \
+artifact_fpath=train.jsonl +output_fpath=data/train.jsonl
    """

    dataset_name: str = Field(description="The dataset name.")
    output_fpath: str = Field(description="Where to write the downloaded file.")


class DeleteJsonlDatasetGitlabConfig(BaseNeMoGymCLIConfig):
    """Delete a dataset from GitLab Model Registry (prompts for confirmation).

    Examples:

        gym dataset rm +dataset_name=old_dataset
    """

    dataset_name: str = Field(description="The dataset name.")


class BaseUploadJsonlDatasetHuggingFaceConfig(BaseNeMoGymCLIConfig):
    """Upload a JSONL dataset to HuggingFace Hub with automatic naming based on domain and resources server.

    Examples:

        gym dataset upload +dataset_name=my_dataset +input_jsonl_fpath=data/train.jsonl \
+resource_config_path=resources_servers/example_multi_step/configs/example_multi_step.yaml
    """

    hf_token: str = Field(description="Hugging Face token with write access.")
    hf_organization: str = Field(description="Organization that owns the dataset repo.")
    hf_collection_name: str = Field(description="Collection the dataset is added to.")
    hf_collection_slug: str = Field(description="Slug suffix of the collection.")
    hf_dataset_prefix: str = Field(default="Nemotron-RL", description="Prefix of the repo name.")
    dataset_name: str | None = Field(
        default=None, description="Dataset name; defaults to the resources server directory name."
    )
    input_jsonl_fpath: str = Field(description="The local JSONL file to upload.")
    resource_config_path: str = Field(description="Config of the resources server the data belongs to.")
    split: Literal["train", "validation", "test"] = Field(default="train", description="Dataset split.")
    create_pr: bool = Field(default=False, description="Open a pull request instead of committing directly.")
    revision: str | None = Field(default=None, description="Branch or revision to commit to.")
    commit_message: str | None = Field(default=None, description="Commit message.")
    commit_description: str | None = Field(default=None, description="Commit description.")


class UploadJsonlDatasetHuggingFaceMaybeDeleteConfig(BaseUploadJsonlDatasetHuggingFaceConfig):
    """Upload a JSONL dataset to HuggingFace Hub with optional GitLab deletion after successful upload."""

    delete_from_gitlab: bool | None = Field(default=False, description="Delete the GitLab copy after uploading.")


class UploadJsonlDatasetHuggingFaceConfig(BaseUploadJsonlDatasetHuggingFaceConfig):
    """Upload a JSONL dataset to HuggingFace Hub and automatically delete from GitLab after successful upload.

    This command always deletes the dataset from GitLab after uploading; use ``gym dataset upload`` for optional
    deletion.
    """

    forbidden_fields: ClassVar[set[str]] = {"delete_from_gitlab"}

    @model_validator(mode="before")
    @classmethod
    def check_forbidden_fields(cls, data: Any) -> Any:
        if isinstance(data, (dict, DictConfig)):
            given = sorted(f for f in cls.forbidden_fields if f in data)
            if given:
                raise ValueError(f"{', '.join(given)} cannot be set for this command: it always deletes from GitLab")
        return data


class DownloadJsonlDatasetHuggingFaceConfig(JsonlDatasetHuggingFaceIdentifer, BaseNeMoGymCLIConfig):
    """Download a JSONL dataset from HuggingFace Hub to local filesystem.

    Examples:

        gym dataset download +repo_id=NVIDIA/NeMo-Gym-Math-example_multi_step-v1 +artifact_fpath=train.jsonl \
+output_fpath=data/train.jsonl
    """

    output_fpath: str | None = Field(default=None, description="Write one file here.")
    output_dirpath: str | None = Field(default=None, description="Write every split into this directory.")
    split: Literal["train", "validation", "test"] | None = Field(default=None, description="Split to download.")
    hf_token: str | None = Field(default=None, description="Hugging Face token for private repos.")

    @model_validator(mode="after")
    def _check_targets(self) -> DownloadJsonlDatasetHuggingFaceConfig:
        if (self.output_fpath is None) == (self.output_dirpath is None):
            raise ValueError("set exactly one of output_fpath / output_dirpath")
        if self.artifact_fpath is not None and self.split is not None:
            raise ValueError("artifact_fpath and split are mutually exclusive")
        if self.output_fpath is not None and self.artifact_fpath is None and self.split is None:
            raise ValueError("output_fpath without artifact_fpath needs a split")
        return self
