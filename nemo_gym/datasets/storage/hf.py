"""The ``hf`` dataset registry: one Hugging Face Hub dataset repo per dataset, versions as branches.

Repos are named ``<hf_organization>/<hf_dataset_prefix>-<domain>-<dataset name>`` (the domain comes from the
resources server the data belongs to), created private, and added to the collection
``<hf_organization>/<slugified hf_collection_name>-<hf_collection_slug>``. A file is committed under its own name
(or ``artifact``), to ``main`` or to the branch named by ``revision``, directly or as a pull request (``create_pr``).

Downloads take either one named file or a split. A split is found the way the Hub's dataset viewer finds it: the
JSONL files whose name has the split's word in it (``train``, ``validation``/``val``/``dev``, ``test``), or the only
JSONL file of a repo whose files name no split at all (that one is ``train``).

Settings (env.yaml): ``hf_token`` (needed to upload, and to download private repos), ``hf_organization``,
``hf_collection_name``, ``hf_collection_slug``, optional ``hf_dataset_prefix`` and ``hf_endpoint`` (a Hub mirror or
a test server; default: ``HF_ENDPOINT`` or huggingface.co).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from nemo_gym.datasets.storage.base import (
    VERSION_PATTERN,
    DatasetNotFoundError,
    RegistryError,
    check_target,
    validate_artifact,
    version_key,
    write_atomically,
)

REPO_TYPE = "dataset"
SPLIT_WORDS: dict[str, tuple[str, ...]] = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test", "testing", "eval", "evaluation"),
}
ALL_SPLITS = tuple(SPLIT_WORDS)


def slugify(text: str) -> str:
    """Lower-case words joined by ``-``, the way the Hub slugs collection titles."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def hf_repo_id(organization: str, prefix: str, domain: str, dataset_name: str) -> str:
    return f"{organization}/{prefix}-{domain.lower()}-{dataset_name}"


def collection_slug(organization: str, collection_name: str, slug: str) -> str:
    return f"{organization}/{slugify(collection_name)}-{slug}"


def resources_server_identity(resource_config_path: Path) -> tuple[str, str]:
    """``(directory name, domain)`` of the resources server a config file declares: they name the Hub repo."""
    if not resource_config_path.is_file():
        raise RegistryError(f"resource_config_path {resource_config_path} does not exist")
    try:
        data = yaml.safe_load(resource_config_path.read_text()) or {}
    except yaml.YAMLError as e:
        raise RegistryError(f"{resource_config_path} is not valid YAML ({e})") from e
    for block in data.values() if isinstance(data, dict) else ():
        servers = block.get("resources_servers") if isinstance(block, dict) else None
        if not isinstance(servers, dict):
            continue
        for implementation, inner in servers.items():
            domain = inner.get("domain") if isinstance(inner, dict) else None
            if domain:
                parts = resource_config_path.resolve().parts
                directory = (
                    parts[parts.index("resources_servers") + 1]
                    if "resources_servers" in parts[:-1]
                    else str(implementation)
                )
                return directory, str(domain)
    raise RegistryError(f"{resource_config_path} declares no resources server with a `domain:`")


def split_files(files: list[str], split: str) -> list[str]:
    """The JSONL files of ``files`` that belong to ``split`` (see the module docstring), sorted."""
    jsonl = sorted(f for f in files if f.endswith(".jsonl"))
    words = SPLIT_WORDS.get(split, (split,))

    def words_of(path: str) -> set[str]:
        return set(re.split(r"[^a-z0-9]+", path[: -len(".jsonl")].lower()))

    matching = [f for f in jsonl if words_of(f) & set(words)]
    if matching or split != "train":
        return matching
    known = {word for split_words in SPLIT_WORDS.values() for word in split_words}
    unnamed = [f for f in jsonl if not words_of(f) & known]
    return unnamed if len(unnamed) == 1 and len(jsonl) == 1 else []


class HfDatasetRegistry:
    """Datasets on the Hugging Face Hub. ``name`` is a repo id (``org/repo``; a bare repo name gets the org)."""

    storage = "hf"

    def __init__(self, token: str | None = None, *, endpoint: str | None = None, organization: str | None = None):
        self.token = token or None
        self.endpoint = endpoint.rstrip("/") if endpoint else None
        self.organization = organization

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> HfDatasetRegistry:
        return cls(
            config.get("hf_token") or None,
            endpoint=config.get("hf_endpoint") or None,
            organization=config.get("hf_organization") or None,
        )

    # -- public API -----------------------------------------------------------------------------------------------

    def upload(
        self,
        name: str,
        version: str | None,
        file: Path,
        *,
        artifact: str | None = None,
        overwrite: bool = False,
        create_pr: bool = False,
        commit_message: str | None = None,
        commit_description: str | None = None,
        private: bool = True,
    ) -> str:
        """Commit ``file`` to ``main`` or to the version branch; returns the commit (or pull request) URL.

        A new version branch starts from ``main``. A version branch that already exists keeps its files unless
        ``overwrite``, as in the other registries; ``main`` is the moving head and a pull request only proposes, so
        neither is guarded.
        """
        repo_id = self.repo_id(name)
        artifact = validate_artifact(artifact or file.name)
        if not self.token:
            raise RegistryError("the hf dataset registry needs hf_token to upload: set it in env.yaml")
        if not file.is_file():
            raise RegistryError(f"input file {file} does not exist")
        api = self.api()
        with self.errors(repo_id, version):
            from huggingface_hub.errors import HfHubHTTPError

            try:
                api.create_repo(repo_id, repo_type=REPO_TYPE, private=private, exist_ok=True)
            except HfHubHTTPError as e:
                # A contributor without write access to the org may still open a pull request on an existing repo.
                if not (create_pr and getattr(e.response, "status_code", None) == 403):
                    raise
            if version and version != "main" and not create_pr:
                branches = {ref.name for ref in api.list_repo_refs(repo_id, repo_type=REPO_TYPE).branches}
                if version not in branches:
                    api.create_branch(repo_id, branch=version, repo_type=REPO_TYPE, exist_ok=True)
                elif not overwrite and api.file_exists(repo_id, artifact, repo_type=REPO_TYPE, revision=version):
                    raise RegistryError(
                        f"{repo_id} {version} already has {artifact}; versions are meant to stay fixed. Upload a new "
                        "version, or pass --overwrite (+overwrite=true) to replace the file"
                    )
            info = api.upload_file(
                path_or_fileobj=str(file),
                path_in_repo=artifact,
                repo_id=repo_id,
                repo_type=REPO_TYPE,
                revision=version,
                create_pr=create_pr,
                commit_message=commit_message or f"Upload {artifact}",
                commit_description=commit_description,
            )
        return str(getattr(info, "pr_url", None) or getattr(info, "commit_url", None) or info)

    def download(self, name: str, version: str | None, artifact: str, dest: Path, *, overwrite: bool = False) -> Path:
        repo_id, artifact = self.repo_id(name), validate_artifact(artifact)
        check_target(dest, overwrite)
        with self.errors(repo_id, version):
            return write_atomically(
                dest, overwrite, lambda temporary: self._fetch(repo_id, version, artifact, temporary)
            )

    def download_split(
        self, name: str, version: str | None, split: str, dest: Path, *, overwrite: bool = False
    ) -> Path:
        """Download every file of ``split`` into one JSONL file (concatenated in name order)."""
        repo_id = self.repo_id(name)
        check_target(dest, overwrite)
        with self.errors(repo_id, version):
            files = self.api().list_repo_files(repo_id, repo_type=REPO_TYPE, revision=version)
            chosen = split_files(files, split)
            if not chosen:
                listed = ", ".join(sorted(files)) or "none"
                raise DatasetNotFoundError(f"{repo_id} has no JSONL file for split {split!r} (files: {listed})")
            return write_atomically(
                dest, overwrite, lambda temporary: self._concatenate(repo_id, version, chosen, temporary)
            )

    def download_all_splits(
        self, name: str, version: str | None, dest_dir: Path, *, overwrite: bool = False
    ) -> dict[str, Path]:
        """Every split the repo has, each as ``<dest_dir>/<split>.jsonl``."""
        repo_id = self.repo_id(name)
        with self.errors(repo_id, version):
            files = self.api().list_repo_files(repo_id, repo_type=REPO_TYPE, revision=version)
        found = {split: split_files(files, split) for split in ALL_SPLITS}
        found = {split: chosen for split, chosen in found.items() if chosen}
        if not found:
            raise DatasetNotFoundError(f"{repo_id} has no JSONL files for any split (files: {', '.join(files)})")
        for split in found:
            check_target(dest_dir / f"{split}.jsonl", overwrite)
        written = {}
        with self.errors(repo_id, version):
            for split, chosen in found.items():
                written[split] = write_atomically(
                    dest_dir / f"{split}.jsonl",
                    overwrite,
                    functools.partial(self._concatenate, repo_id, version, chosen),
                )
        return written

    def delete(self, name: str, version: str | None = None) -> None:
        repo_id = self.repo_id(name)
        api = self.api()
        with self.errors(repo_id, version):
            if version is None:
                api.delete_repo(repo_id, repo_type=REPO_TYPE)
            else:
                api.delete_branch(repo_id, branch=version, repo_type=REPO_TYPE)

    def list_versions(self, name: str) -> list[str]:
        repo_id = self.repo_id(name)
        from huggingface_hub.errors import RepositoryNotFoundError

        try:
            with self.errors(repo_id, None):
                refs = self.api().list_repo_refs(repo_id, repo_type=REPO_TYPE)
        except DatasetNotFoundError as e:
            if isinstance(e.__cause__, RepositoryNotFoundError):
                return []
            raise
        names = {ref.name for ref in [*refs.branches, *refs.tags]}
        return sorted((n for n in names if VERSION_PATTERN.match(n)), key=version_key)

    def ensure_collection(self, slug: str) -> None:
        """Fail before uploading when the collection the dataset should join does not exist."""
        self._collection(slug)

    def add_to_collection(self, repo_id: str, slug: str) -> bool:
        """Add the repo to an existing collection unless it is there already; True if it was added."""
        if any(item.item_id == repo_id for item in self._collection(slug).items):
            return False
        with self.errors(repo_id, None):
            self.api().add_collection_item(slug, item_id=repo_id, item_type=REPO_TYPE, exists_ok=True)
        return True

    def _collection(self, slug: str) -> Any:
        api = self.api()
        from huggingface_hub.errors import HfHubHTTPError

        try:
            return api.get_collection(slug)
        except HfHubHTTPError as e:
            if getattr(e.response, "status_code", None) == 404:
                raise RegistryError(
                    f"Hub collection {slug} does not exist: create it on the Hub, or fix hf_collection_name / "
                    "hf_collection_slug in env.yaml"
                ) from e
            raise RegistryError(f"reading Hub collection {slug} failed: {_first_line(e)}") from e

    def repo_id(self, name: str) -> str:
        if "/" in name:
            return name
        if not self.organization:
            raise RegistryError(f"{name!r} is not a repo id (org/name) and hf_organization is not set in env.yaml")
        return f"{self.organization}/{name}"

    # -- the Hub client and its errors (public: environment publishing shares them), then internals ---------------

    def api(self) -> Any:
        """The Hub client with this registry's endpoint and token (environment publishing uses it too)."""
        try:
            from huggingface_hub import HfApi
        except ImportError as e:
            raise RegistryError(
                f"the hf dataset registry needs huggingface_hub: pip install 'nemo-gym[registries]' ({e})"
            ) from e
        return HfApi(endpoint=self.endpoint, token=self.token)

    def _fetch(self, repo_id: str, version: str | None, artifact: str, temporary: Path) -> None:
        from huggingface_hub import hf_hub_download

        with tempfile.TemporaryDirectory(prefix="nemo_gym_download_", dir=temporary.parent) as staging:
            local = hf_hub_download(
                repo_id,
                artifact,
                repo_type=REPO_TYPE,
                revision=version,
                token=self.token,
                endpoint=self.endpoint,
                local_dir=staging,
            )
            os.replace(local, temporary)

    def _concatenate(self, repo_id: str, version: str | None, files: list[str], temporary: Path) -> None:
        if len(files) == 1:
            self._fetch(repo_id, version, files[0], temporary)
            return
        with temporary.open("wb") as out:
            for name in files:
                part = temporary.with_name(f"{temporary.name}.{PurePosixPath(name).name}")
                try:
                    self._fetch(repo_id, version, name, part)
                    data = part.read_bytes()
                finally:
                    part.unlink(missing_ok=True)
                out.write(data if data.endswith(b"\n") or not data else data + b"\n")

    @contextlib.contextmanager
    def errors(self, repo_id: str, version: str | None) -> Iterator[None]:
        """Hub client errors as one-line registry errors naming the repo and revision (for every caller of
        :meth:`api`)."""
        try:
            from huggingface_hub.errors import (
                EntryNotFoundError,
                HfHubHTTPError,
                LocalEntryNotFoundError,
                RepositoryNotFoundError,
                RevisionNotFoundError,
            )
        except ImportError as e:
            raise RegistryError(
                f"the hf dataset registry needs huggingface_hub>=0.24: pip install 'nemo-gym[registries]' ({e})"
            ) from e
        where = f"{repo_id}" + (f" at revision {version}" if version else "")
        try:
            yield
        except RepositoryNotFoundError as e:
            hint = "" if self.token else " (for a private repo, set hf_token in env.yaml)"
            raise DatasetNotFoundError(f"Hub dataset repo {repo_id} not found{hint}") from e
        except RevisionNotFoundError as e:
            raise DatasetNotFoundError(f"Hub dataset repo {repo_id} has no revision {version!r}") from e
        except LocalEntryNotFoundError as e:
            # hf_hub_download says this when it could not reach the Hub at all (and had no cached copy).
            raise RegistryError(
                f"cannot reach {self.endpoint or 'the Hugging Face Hub'} to download from {where}"
            ) from e
        except EntryNotFoundError as e:
            raise DatasetNotFoundError(f"{where}: file not found ({_first_line(e)})") from e
        except HfHubHTTPError as e:
            raise RegistryError(f"Hub request for {where} failed: {_first_line(e)}") from e
        except Exception as e:
            # Transport errors (refused connection, timeout) come from the HTTP library underneath, whichever it is.
            if type(e).__module__.split(".")[0] not in ("httpx", "httpx2", "httpcore", "requests", "urllib3"):
                raise
            where_hub = self.endpoint or "the Hugging Face Hub"
            raise RegistryError(f"cannot reach {where_hub} for {where}: {_first_line(e)}") from e


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
