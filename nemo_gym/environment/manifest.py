"""An environment's ``manifest.yaml`` (NeMo Gym 0.7's format): what it is, who made it, how it is scored, which
servers and datasets it wires together.

The config (``config.yaml`` beside it) says how to run an environment; the manifest says what a catalog, a publisher
or ``gym env validate`` needs to know about it without composing anything. Every manifest NeMo Gym 0.7 ships loads
with :class:`EnvironmentManifest`; a manifest that does not gets one :class:`~nemo_gym.errors.UserError` line naming
the file and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from nemo_gym.config.datasets import Domain
from nemo_gym.errors import UserError

__all__ = [
    "MANIFEST_FILENAME",
    "EnvironmentManifest",
    "ManifestDataset",
    "ManifestError",
    "ManifestReward",
    "dump_manifest",
    "find_manifest",
    "load_manifest",
    "manifest_json_schema",
    "manifest_paths",
]

MANIFEST_FILENAME = "manifest.yaml"

Kind = Literal["environment", "benchmark"]
IntegrationProfile = Literal[
    "custom-gym-verifier",  # our resources server verifies; a Gym agent runs the loop
    "custom-gym-agent-loop",  # a Gym agent of its own runs a multi-step loop
    "external-agent-loop",  # an outside agent harness runs the loop
    "external-rollout-driver",  # an outside callable drives whole rollouts
]
DatasetKind = Literal["train", "validation", "example", "benchmark"]
PromptSource = Literal["template", "prepared", "agent"]
_NON_SPDX_LICENSES = ("internal", "proprietary", "unknown")
_NEEDED_BY_PROFILE: dict[str, tuple[str, ...]] = {
    "custom-gym-verifier": ("model_server", "resources_server"),
    "custom-gym-agent-loop": ("model_server",),
    "external-agent-loop": (),
    "external-rollout-driver": ("rollout_driver",),
}


class ManifestError(UserError):
    """A manifest that cannot be read or does not follow the format; the message names the file and the key."""


class _Strict(BaseModel):
    """Unknown keys are typos here, not extensions: a catalog that silently drops them would mislead."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class ManifestReward(_Strict):
    range: tuple[float, float] = Field(description="Lowest and highest reward the verifier gives, inclusive.")
    higher_is_better: bool

    @model_validator(mode="after")
    def _ordered(self) -> ManifestReward:
        low, high = self.range
        if not low <= high:
            raise ValueError(f"range must be [lower, upper], got [{low}, {high}]")
        return self


class ManifestDataset(_Strict):
    name: str = Field(min_length=1)
    type: DatasetKind
    jsonl_fpath: str = Field(min_length=1, description="Relative to the repository root, as in config.yaml.")
    prepare_script: str | None = Field(default=None, min_length=1, description="Builds the file; benchmarks need one.")
    prompt_config: str | None = Field(default=None, min_length=1)
    num_repeats: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _benchmark_has_script(self) -> ManifestDataset:
        if self.type == "benchmark" and self.prepare_script is None:
            raise ValueError("a benchmark dataset needs prepare_script")
        return self


class AdoptedFrom(_Strict):
    """Where an environment was brought in from, and when it was last reconciled with it."""

    source: str = Field(pattern=r"^\S+$", min_length=1)
    ref: str = Field(pattern=r"^\S+$", min_length=1)
    reconciled: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$", description="ISO date, YYYY-MM-DD.")

    @field_validator("reconciled", mode="before")
    @classmethod
    def _date_text(cls, value: Any) -> Any:
        return value.isoformat() if hasattr(value, "isoformat") else value  # YAML reads a bare date as a date


class EnvironmentManifest(_Strict):
    """One environment or benchmark. Server fields name instances of the config beside it (``config_path``)."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, title="NeMo Gym environment manifest")

    name: str = Field(min_length=1)
    version: str = Field(min_length=1, description="Version of the composition; semantic versioning recommended.")
    experimental: bool = True
    kind: Kind
    integration_profile: IntegrationProfile
    domain: Domain
    description: str = Field(min_length=1)
    modality: str = Field(min_length=1, description="e.g. text, multimodal, audio")
    licensing: str = Field(default="unknown", description="An SPDX expression, or internal, proprietary, unknown.")
    authors: list[str] = Field(min_length=1)
    reward: ManifestReward
    determinism: Literal["seeded", "stochastic", "unknown"] = "unknown"
    config_path: str = Field(default="config.yaml", min_length=1, description="Relative to the manifest's folder.")
    dataset_owner: str | None = None
    resources_server: str | None = Field(description="Instance name in the config; null when there is none.")
    agent_server: str = Field(min_length=1)
    datasets: list[ManifestDataset] = Field(min_length=1)
    model_server: str | None = None
    rollout_driver: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    grading_mode: str | None = None
    session_model: Literal["episode", "step"] | None = None
    state: Literal["none", "per_session"] | None = None
    sandbox: str | None = None
    canonical_split: str | None = None
    prompt_source: PromptSource = "template"
    standard_prompt_config: str | None = None
    adopted_from: AdoptedFrom | None = None
    lifecycle: Literal["active", "deprecated"] = "active"

    @field_validator("authors")
    @classmethod
    def _distinct_authors(cls, authors: list[str]) -> list[str]:
        if len(set(authors)) != len(authors):
            raise ValueError("authors are listed more than once")
        return authors

    @field_validator("licensing")
    @classmethod
    def _spdx(cls, licensing: str) -> str:
        if licensing in _NON_SPDX_LICENSES:
            return licensing
        from packaging.licenses import InvalidLicenseExpression, canonicalize_license_expression

        try:
            return str(canonicalize_license_expression(licensing))
        except InvalidLicenseExpression:
            raise ValueError(f"{licensing!r} is not an SPDX expression, nor one of {_NON_SPDX_LICENSES}") from None

    @model_validator(mode="after")
    def _consistent(self) -> EnvironmentManifest:
        needed = list(_NEEDED_BY_PROFILE[self.integration_profile])
        if self.kind == "benchmark":
            needed.append("canonical_split")
            if self.prompt_source == "template":
                needed.append("standard_prompt_config")
        missing = [name for name in needed if getattr(self, name) is None]
        if missing:
            raise ValueError(f"a {self.kind} with profile {self.integration_profile} needs {', '.join(missing)}")
        if self.rollout_driver is not None and self.integration_profile != "external-rollout-driver":
            raise ValueError("rollout_driver belongs to the external-rollout-driver profile only")
        if self.prompt_source == "prepared" and self.standard_prompt_config is not None:
            raise ValueError("prepared prompts take no standard_prompt_config")
        if self.prompt_source != "template" and any(d.prompt_config is not None for d in self.datasets):
            raise ValueError(f"a dataset's prompt_config needs prompt_source template, not {self.prompt_source}")
        names = [dataset.name for dataset in self.datasets]
        if len(set(names)) != len(names):
            raise ValueError("dataset names repeat")
        if self.kind == "benchmark" and not any(dataset.type == "benchmark" for dataset in self.datasets):
            raise ValueError("a benchmark needs a dataset of type benchmark")
        return self


def _one_line(path: Path, error: ValidationError) -> str:
    """Every problem of a manifest on one line: ``FILE: key.path: message; ...``."""
    problems = []
    for item in error.errors(include_url=False):
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        problems.append(f"{key}: {item['msg']}")
    return f"{path}: " + "; ".join(problems)


def load_manifest(path: str | Path) -> EnvironmentManifest:
    """The manifest at ``path``, checked; a :class:`ManifestError` naming the file (and key) otherwise."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ManifestError(f"{path}: cannot read the manifest ({error.strerror or error})") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ManifestError(f"{path}: not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: a manifest is a YAML mapping of keys, got {type(data).__name__}")
    try:
        return EnvironmentManifest.model_validate(data)
    except ValidationError as error:
        raise ManifestError(_one_line(path, error)) from None


def dump_manifest(manifest: EnvironmentManifest, path: str | Path) -> Path:
    """Write ``manifest`` as YAML in its field order, leaving out unset optional keys and defaults 0.7 leaves out, so
    that load and dump round-trip."""
    data = manifest.model_dump(mode="json", exclude_none=True)
    data["resources_server"] = manifest.resources_server  # required even when null
    for key, default in (("config_path", "config.yaml"), ("prompt_source", "template")):
        if data.get(key) == default:
            del data[key]
    path = Path(path)
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def manifest_json_schema() -> dict[str, Any]:
    """The JSON Schema of a manifest (draft 2020-12), for editors and ``gym env schema``."""
    schema = EnvironmentManifest.model_json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "environment-manifest.schema.json",
        **schema,
    }


def manifest_paths(root: str | Path) -> list[Path]:
    """Every ``environments/<name>/manifest.yaml`` under a search root, sorted by name."""
    return sorted((Path(root) / "environments").glob(f"*/{MANIFEST_FILENAME}"))


def find_manifest(name: str) -> Path:
    """The manifest of the environment ``--environment NAME`` selects (same roots, same did-you-mean)."""
    from nemo_gym.assets import resolve_selector

    path = resolve_selector("environment", name).parent / MANIFEST_FILENAME
    if not path.is_file():
        raise ManifestError(f"{path}: environment {name!r} has no {MANIFEST_FILENAME}")
    return path
