"""The shape of datasets and their rows: the ``datasets:`` entries of a server block and the domain of a server.

A dataset entry names a JSONL file of rows (``type`` train / validation / example) and optionally where to fetch it
(``source:``, or the legacy ``gitlab_identifier`` / ``huggingface_identifier``). Each row names the agent that serves
it under :data:`AGENT_REF_KEY`.
"""

from __future__ import annotations

import warnings
from enum import Enum
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, Field, model_validator

AGENT_REF_KEY = "agent_ref"
"""Row key naming the agent server that serves a dataset row (``{"type": ..., "name": ...}``)."""


class Domain(Enum):
    """The capability a resources server primarily evaluates or trains.

    Pick the single most specific value (prefer ``math`` or ``coding`` over ``agent``); ``other`` is the catch-all.
    """

    MATH = "math"
    CODING = "coding"
    AGENT = "agent"
    KNOWLEDGE = "knowledge"
    INSTRUCTION_FOLLOWING = "instruction_following"
    LONG_CONTEXT = "long_context"
    SAFETY = "safety"
    GAMES = "games"
    TRANSLATION = "translation"
    E2E = "e2e"
    RLHF = "rlhf"
    OTHER = "other"


DatasetType = Union[Literal["train"], Literal["validation"], Literal["example"]]  # noqa: UP007

LicenseType = Union[  # noqa: UP007 (NeMo Gym spells these as Union)
    Literal["Apache 2.0"],
    Literal["MIT"],
    Literal["Creative Commons Attribution 4.0 International"],
    Literal["Creative Commons Attribution-ShareAlike 4.0 International"],
    Literal["NVIDIA Internal Use Only, Do Not Distribute"],
    Literal["NVIDIA Evaluation Dataset License Agreement"],
    Literal["TBD"],
    Literal["GNU General Public License v3.0"],
]


class JsonlDatasetGitlabIdentifer(BaseModel):
    dataset_name: str
    version: str
    artifact_fpath: str


class JsonlDatasetHuggingFaceIdentifer(BaseModel):
    repo_id: str = Field(description="The repo id.")
    artifact_fpath: str | None = None


class GitlabDatasetSource(BaseModel):
    """A ``source:`` block naming a dataset artifact kept in the GitLab model registry."""

    type: Literal["gitlab"]
    dataset_name: str
    version: str
    artifact_fpath: str


class HuggingFaceDatasetSource(BaseModel):
    """A ``source:`` block naming a dataset repository on the Hugging Face Hub."""

    type: Literal["huggingface"]
    repo_id: str
    artifact_fpath: str | None = None


DatasetSource = Annotated[GitlabDatasetSource | HuggingFaceDatasetSource, Field(discriminator="type")]


class DatasetConfig(BaseModel):
    name: str
    type: DatasetType
    jsonl_fpath: str
    num_repeats: int = Field(default=1, ge=1)
    source: DatasetSource | None = None
    gitlab_identifier: JsonlDatasetGitlabIdentifer | None = None
    huggingface_identifier: JsonlDatasetHuggingFaceIdentifer | None = None
    license: LicenseType | None = None

    @model_validator(mode="after")
    def _reconcile_sources(self) -> DatasetConfig:
        """Reconcile the unified ``source:`` with the legacy ``*_identifier`` fields.

        ``source:`` is mutually exclusive with the legacy identifiers. Both legacy identifiers may be set together (a
        gitlab-primary / huggingface-fallback pair chosen at download time by ``data_source``). A single legacy
        identifier warns and is mirrored into ``source``; a ``source:`` is mirrored back into the matching legacy field
        so code that still reads ``gitlab_identifier`` / ``huggingface_identifier`` keeps working.
        """
        legacy = [f for f in ("gitlab_identifier", "huggingface_identifier") if getattr(self, f) is not None]
        if self.source is not None:
            if legacy:
                raise ValueError(
                    f"dataset {self.name!r}: set either `source:` or the legacy {' / '.join(legacy)}, not both"
                )
            if isinstance(self.source, GitlabDatasetSource):
                self.gitlab_identifier = JsonlDatasetGitlabIdentifer(
                    dataset_name=self.source.dataset_name,
                    version=self.source.version,
                    artifact_fpath=self.source.artifact_fpath,
                )
            else:
                self.huggingface_identifier = JsonlDatasetHuggingFaceIdentifer(
                    repo_id=self.source.repo_id, artifact_fpath=self.source.artifact_fpath
                )
            return self
        if legacy:
            warnings.warn(
                f"dataset {self.name!r}: {' and '.join(legacy)} is deprecated; use a `source:` block "
                "(type: gitlab | huggingface) instead",
                DeprecationWarning,
                stacklevel=2,
            )
        gitlab, hf = self.gitlab_identifier, self.huggingface_identifier
        if gitlab is not None and hf is None:
            self.source = GitlabDatasetSource(type="gitlab", **gitlab.model_dump())
        elif hf is not None and gitlab is None:
            self.source = HuggingFaceDatasetSource(type="huggingface", **hf.model_dump())
        return self


class BenchmarkDatasetConfig(BaseModel):
    name: str
    type: Literal["benchmark"]
    jsonl_fpath: Path
    prepare_script: Path
    prompt_config: Path | None = None
    num_repeats: int = Field(default=1, ge=1)
