"""Versioned dataset registries behind one interface, picked by ``--storage``.

Three backends store JSONL dataset files under a dataset name and a version:

* ``gitlab``: an MLflow model registry (GitLab's is the one NeMo Gym teams use), see :mod:`.mlflow`;
* ``hf``: the Hugging Face Hub, one dataset repo per dataset, versions as branches, see :mod:`.hf`;
* ``local``: a plain directory with the same ``<name>/<x.y.z>/<file>`` layout, for teams without a server, see
  :mod:`.local`.

What all of them share lives here: an upload checks the file before anything leaves the machine, and a download
writes a temporary file beside the target and renames it, so a target is either the old file or the whole new one,
and an existing target is only replaced when the caller asks for it.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Protocol, runtime_checkable

from nemo_gym.errors import RegistryError

Storage = Literal["gitlab", "hf", "local"]
STORAGES: tuple[str, ...] = ("gitlab", "hf", "local")

VERSION_PATTERN = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
MAX_REPORTED_PROBLEMS = 10
"""An upload that fails verification lists at most this many offending lines (and says how many more there are)."""

GITLAB_CREDENTIAL_KEYS = ("mlflow_tracking_uri", "mlflow_tracking_token")
HF_UPLOAD_CREDENTIAL_KEYS = ("hf_token", "hf_organization", "hf_collection_name", "hf_collection_slug")
LOCAL_REGISTRY_DIR_KEY = "local_dataset_registry_dir"
VERSIONED_STORAGE_KEY = "versioned_dataset_storage"
"""Which registry serves ``source: {type: gitlab, ...}`` datasets: ``gitlab`` (default, the MLflow server) or
``local`` (the directory registry), so a team without a server can keep the same dataset declarations."""


# RegistryError is defined in the one error tree (nemo_gym.errors) and re-exported here.


class DatasetNotFoundError(RegistryError):
    """The dataset, version or file is not in the registry."""


@runtime_checkable
class DatasetRegistry(Protocol):
    """What every backend offers. ``name`` is a dataset name (a Hub repo id for ``hf``); versions are ``x.y.z``."""

    storage: str

    def upload(
        self, name: str, version: str | None, file: Path, *, artifact: str | None = None, overwrite: bool = False
    ) -> str:
        """Store ``file`` as ``artifact`` (default: its file name) of ``name`` at ``version``; returns where it went."""
        ...

    def download(self, name: str, version: str | None, artifact: str, dest: Path, *, overwrite: bool = False) -> Path:
        """Fetch one stored file into ``dest`` atomically; refuses an existing ``dest`` unless ``overwrite``."""
        ...

    def delete(self, name: str, version: str | None = None) -> None:
        """Remove one version, or the whole dataset when ``version`` is None."""
        ...

    def list_versions(self, name: str) -> list[str]:
        """The stored versions of ``name``, oldest first; empty if the dataset does not exist."""
        ...


# ---------------------------------------------------------------------------------------------------------------------
# Checks shared by every backend


def validate_version(version: Any) -> str:
    """A version must be ``x.y.z`` (three non-negative integers), the format GitLab's model registry enforces."""
    text = str(version) if version is not None else ""
    if not VERSION_PATTERN.match(text):
        raise RegistryError(f"version {version!r} is not of the form x.y.z (e.g. 0.0.1)")
    return text


def version_key(version: str) -> tuple[int, ...]:
    """Sort key for ``x.y.z`` versions (numeric, so 0.0.10 comes after 0.0.9)."""
    return tuple(int(part) for part in version.split("."))


def validate_name(name: Any) -> str:
    """Dataset names become directory names and registry keys: letters, digits, ``.``, ``_`` and ``-`` only."""
    text = str(name) if name is not None else ""
    if not NAME_PATTERN.match(text) or text in (".", ".."):
        raise RegistryError(
            f"dataset name {name!r} must start with a letter or digit and contain only letters, digits, '.', '_', '-'"
        )
    return text


def validate_artifact(artifact: Any) -> str:
    """An artifact is a relative POSIX path inside a version (``train.jsonl``, ``multineedle/train.jsonl``)."""
    text = str(artifact) if artifact is not None else ""
    path = PurePosixPath(text)
    if not text or path.is_absolute() or "\\" in text or any(part in ("", ".", "..") for part in text.split("/")):
        raise RegistryError(f"artifact path {artifact!r} must be a relative path like train.jsonl or a/train.jsonl")
    return text


def verify_upload_file(path: Path, split: str | None = "train") -> int:
    """Check a JSONL file before it is uploaded; returns its number of rows.

    Every non-blank line must be a JSON object; rows of a ``train`` split must also carry valid
    ``responses_create_params``, since training reads nothing else. All offending lines are reported as file:line.
    """
    from nemo_gym.datasets.validation import CREATE_PARAMS_KEY, create_params_problem, iter_checked_lines

    if not path.is_file():
        raise RegistryError(f"input file {path} does not exist")
    rows = 0
    problems: list[str] = []
    for line in iter_checked_lines(path):
        problem, row = line.problem, line.row
        if row is not None and split == "train":  # a row that parsed has no problem yet
            if CREATE_PARAMS_KEY not in row:
                problem = f"train rows need {CREATE_PARAMS_KEY}"
            else:
                problem = create_params_problem(row[CREATE_PARAMS_KEY])
        if problem is not None:
            problems.append(f"{path}:{line.number}: {problem}")
        else:
            rows += 1
    if problems:
        shown = problems[:MAX_REPORTED_PROBLEMS]
        more = len(problems) - len(shown)
        tail = f"\n  ... and {more} more" if more else ""
        raise RegistryError(
            f"{len(problems)} invalid row(s) in {path}; nothing was uploaded:\n  " + "\n  ".join(shown) + tail
        )
    if rows == 0:
        raise RegistryError(f"{path} has no rows; nothing was uploaded")
    return rows


def check_target(dest: Path, overwrite: bool) -> Path:
    """Refuse a download target that is a directory, or that exists when ``overwrite`` is off (before any transfer)."""
    dest = dest.expanduser()
    if dest.is_dir():
        raise RegistryError(f"{dest} is a directory; give a file path to download into")
    if dest.exists() and not overwrite:
        raise RegistryError(f"{dest} already exists; pass --overwrite (+overwrite=true) to replace it")
    return dest


def write_atomically(dest: Path, overwrite: bool, fill: Callable[[Path], object]) -> Path:
    """Have ``fill`` write a temporary file beside ``dest``, then rename it over ``dest`` in one step.

    Refuses an existing ``dest`` unless ``overwrite``, before any transfer starts. If ``fill`` fails, the temporary
    file is removed and ``dest`` is untouched.
    """
    dest = check_target(dest, overwrite)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    os.close(fd)
    temporary = Path(temporary_name)
    try:
        fill(temporary)
        os.replace(temporary, dest)
    finally:
        temporary.unlink(missing_ok=True)
    return dest


def missing_keys_error(backend: str, missing: list[str], hint: str = "") -> RegistryError:
    """The one-line error for missing credentials: which env.yaml keys to set."""
    keys = " and ".join([", ".join(missing[:-1]), missing[-1]] if len(missing) > 1 else missing)
    them = "them" if len(missing) > 1 else "it"
    return RegistryError(
        f"the {backend} dataset registry needs {keys}: set {them} in env.yaml{hint}, or pass +key=value on the command line"
    )


def require_keys(config: Mapping[str, Any], keys: tuple[str, ...], backend: str, hint: str = "") -> dict[str, str]:
    """The values of ``keys``; all missing ones are named in one :func:`missing_keys_error`."""
    missing = [key for key in keys if config.get(key) in (None, "")]
    if missing:
        raise missing_keys_error(backend, missing, hint)
    return {key: str(config[key]) for key in keys}
