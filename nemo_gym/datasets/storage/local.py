"""The ``local`` dataset registry: versioned datasets in a plain directory, for teams without a registry server.

Layout (the same name/version/file shape as the GitLab registry, so dataset declarations carry over)::

    <root>/<name>/index.json           which versions and files exist, with their sha256 and size
    <root>/<name>/<x.y.z>/<artifact>   the stored files

The root is ``local_dataset_registry_dir`` (default ``<cache_dir>/dataset_registry``); pointing it at a shared
filesystem makes it a team registry. Every change holds an exclusive lock on ``<root>/.lock`` and writes files and
the index by rename, so concurrent uploads from several machines cannot leave a half-written file or index behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.datasets.storage.base import (
    LOCAL_REGISTRY_DIR_KEY,
    DatasetNotFoundError,
    RegistryError,
    validate_artifact,
    validate_name,
    validate_version,
    version_key,
    write_atomically,
)
from nemo_gym.jsonl import write_json_atomic

INDEX_FILENAME = "index.json"
LOCK_FILENAME = ".lock"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class LocalDatasetRegistry:
    """A directory of versioned datasets (see the module docstring for the layout)."""

    storage = "local"

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().resolve()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LocalDatasetRegistry:
        configured = config.get(LOCAL_REGISTRY_DIR_KEY)
        if configured:
            return cls(Path(str(configured)))
        return cls(Path(str(config.get("cache_dir") or "cache")) / "dataset_registry")

    # -- public API -----------------------------------------------------------------------------------------------

    def upload(
        self, name: str, version: str | None, file: Path, *, artifact: str | None = None, overwrite: bool = False
    ) -> str:
        name, version = validate_name(name), validate_version(version)
        artifact = validate_artifact(artifact or file.name)
        if not file.is_file():
            raise RegistryError(f"input file {file} does not exist")
        with self._locked():
            index = self._read_index(name)
            files = index["versions"].setdefault(version, {"created_at": _now(), "files": {}})["files"]
            if artifact in files and not overwrite:
                raise RegistryError(
                    f"{name} {version} already has {artifact}; versions are meant to stay fixed. Upload a new version, "
                    "or pass --overwrite (+overwrite=true) to replace the file"
                )
            target = self._version_dir(name, version) / artifact
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(target, True, lambda temporary: shutil.copyfile(file, temporary))
            files[artifact] = {"sha256": sha256_of(target), "size": target.stat().st_size, "uploaded_at": _now()}
            self._write_index(name, index)
        return str(target)

    def download(self, name: str, version: str | None, artifact: str, dest: Path, *, overwrite: bool = False) -> Path:
        name, version, artifact = validate_name(name), validate_version(version), validate_artifact(artifact)
        entry = self._file_entry(name, version, artifact)
        stored = self._version_dir(name, version) / artifact
        if not stored.is_file():
            raise DatasetNotFoundError(f"{stored} is listed in the local registry index but missing on disk")

        def fill(temporary: Path) -> None:
            shutil.copyfile(stored, temporary)
            if sha256_of(temporary) != entry["sha256"]:
                raise RegistryError(f"{stored} does not match the sha256 recorded at upload; the registry is corrupt")

        return write_atomically(dest, overwrite, fill)

    def delete(self, name: str, version: str | None = None) -> None:
        name = validate_name(name)
        with self._locked():
            index = self._read_index(name)
            if not index["versions"]:
                raise DatasetNotFoundError(f"dataset {name!r} is not in the local registry at {self.root}")
            if version is None:
                shutil.rmtree(self.root / name)
                return
            version = validate_version(version)
            if version not in index["versions"]:
                raise DatasetNotFoundError(f"dataset {name!r} has no version {version} (has: {self._listed(index)})")
            del index["versions"][version]
            shutil.rmtree(self._version_dir(name, version), ignore_errors=True)
            if index["versions"]:
                self._write_index(name, index)
            else:
                shutil.rmtree(self.root / name)

    def list_versions(self, name: str) -> list[str]:
        return sorted(self._read_index(validate_name(name))["versions"], key=version_key)

    def list_artifacts(self, name: str, version: str) -> list[str]:
        """The files stored in one version, sorted."""
        index = self._read_index(validate_name(name))
        version = validate_version(version)
        if version not in index["versions"]:
            raise DatasetNotFoundError(f"dataset {name!r} has no version {version} (has: {self._listed(index)})")
        return sorted(index["versions"][version]["files"])

    # -- internals ------------------------------------------------------------------------------------------------

    def _version_dir(self, name: str, version: str) -> Path:
        return self.root / name / version

    def _index_path(self, name: str) -> Path:
        return self.root / name / INDEX_FILENAME

    def _read_index(self, name: str) -> dict[str, Any]:
        path = self._index_path(name)
        if not path.is_file():
            return {"name": name, "versions": {}}
        try:
            index = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError as e:
            raise RegistryError(f"the local registry index {path} is not valid JSON ({e})") from e
        if not isinstance(index, dict) or not isinstance(index.get("versions"), dict):
            raise RegistryError(f"the local registry index {path} has no `versions` mapping")
        return index

    def _write_index(self, name: str, index: dict[str, Any]) -> None:
        index["versions"] = {v: index["versions"][v] for v in sorted(index["versions"], key=version_key)}
        write_json_atomic(self._index_path(name), index)

    def _file_entry(self, name: str, version: str, artifact: str) -> dict[str, Any]:
        index = self._read_index(name)
        if not index["versions"]:
            raise DatasetNotFoundError(f"dataset {name!r} is not in the local registry at {self.root}")
        if version not in index["versions"]:
            raise DatasetNotFoundError(f"dataset {name!r} has no version {version} (has: {self._listed(index)})")
        files = index["versions"][version]["files"]
        if artifact not in files:
            have = ", ".join(sorted(files)) or "none"
            raise DatasetNotFoundError(f"{name} {version} has no file {artifact!r} (has: {have})")
        return files[artifact]

    @staticmethod
    def _listed(index: dict[str, Any]) -> str:
        return ", ".join(sorted(index["versions"], key=version_key)) or "none"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """An exclusive lock on the registry root (POSIX advisory lock; a no-op where fcntl is missing)."""
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            yield
            return
        with open(self.root / LOCK_FILENAME, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
