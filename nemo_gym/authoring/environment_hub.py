"""An environment on the Hugging Face Hub: ``gym env publish NAME`` uploads it, ``gym env fetch REPO_ID`` brings it back.

What travels is what another machine needs to run ``gym env start --environment NAME``: the folder
``environments/NAME`` (its ``config.yaml``, ``manifest.yaml``, README, fixtures) and, from the same search root, the
folders of the servers its config names and the data files its datasets point at. Servers and data the framework
itself ships (under its install root) stay out: every install has them. The repo mirrors a search root
(``environments/NAME/...``, ``resources_servers/IMPL/...``), so fetching into a directory makes that directory a root
the environment runs from, and :data:`INDEX_FILE` records what was published, by which framework version.

The repo is a Hub *dataset* repo, private unless asked otherwise: environments are data and configuration, and the
dataset registry (``datasets/storage/hf.py``) already speaks to dataset repos with the same token, endpoint and
organization settings, whose client and error messages are shared here.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from nemo_gym import INSTALL_DIR, __version__
from nemo_gym.assets import read_raw_yaml, resolve_selector
from nemo_gym.datasets.storage.hf import REPO_TYPE, HfDatasetRegistry
from nemo_gym.errors import ConfigError, RegistryError
from nemo_gym.registry import ENVIRONMENT_CONFIG_FILENAME
from nemo_gym.roots import candidate_paths

INDEX_FILE = "nemo_gym_environment.json"
"""At the repo's top: the environment's name, the framework version that published it, and what it holds."""
SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")
SKIPPED_PARTS = frozenset(
    {"__pycache__", ".venv", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules"}
)
"""Folders that are build or tool output, never part of what is published."""

__all__ = [
    "INDEX_FILE",
    "EnvironmentBundle",
    "collect_bundle",
    "fetch_environment",
    "publication_problems",
    "publish_environment",
]


@dataclass(frozen=True)
class EnvironmentBundle:
    """The files one environment publishes, by their path in the repo (relative to its search root)."""

    name: str
    root: Path
    files: dict[str, Path]
    servers: tuple[str, ...]
    """``<server type>/<implementation>`` folders published with it."""
    framework_servers: tuple[str, ...]
    """Those its config names that the framework ships, left out."""

    def index(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "nemo_gym_version": __version__,
            "servers": list(self.servers),
            "framework_servers": list(self.framework_servers),
            "files": sorted(self.files),
        }


def collect_bundle(name: str) -> EnvironmentBundle:
    """What ``gym env publish NAME`` uploads; ConfigError when the environment or a server it names is missing."""
    config_path = resolve_selector("environment", name)
    folder = config_path.parent
    name = folder.name  # a renamed environment is published under its new name
    root = folder.parent.parent
    files: dict[str, Path] = {}
    _add_tree(files, root, folder)
    servers: list[str] = []
    framework: list[str] = []
    raw = read_raw_yaml(config_path)
    for relative in _named_servers(raw):
        directory = next((c.resolve() for c in candidate_paths(relative) if c.is_dir()), None)
        if directory is None:
            raise ConfigError(f"{config_path}: server folder {relative} is not in any search root")
        if _is_framework(directory):
            framework.append(relative.as_posix())
            continue
        servers.append(relative.as_posix())
        _add_tree(files, directory.parent.parent, directory)  # from whichever root holds it, at the same place
    for data in _dataset_files(raw):
        path = next((c.resolve() for c in candidate_paths(data) if c.is_file()), None)
        if path is not None and not _is_framework(path):
            files.setdefault(PurePosixPath(data).as_posix(), path)
    return EnvironmentBundle(name, root, files, tuple(servers), tuple(framework))


def _is_framework(path: Path) -> bool:
    """A folder of the framework's own install root, outside its ``environments/`` (which is what is published)."""
    return path.is_relative_to(INSTALL_DIR) and not path.is_relative_to(INSTALL_DIR / "environments")


def _named_servers(raw: dict[str, Any]) -> Iterator[Path]:
    seen: set[Path] = set()
    for block in raw.values():
        for server_type in SERVER_TYPES:
            inner = block.get(server_type) if isinstance(block, dict) else None
            for implementation in inner if isinstance(inner, dict) else ():
                relative = Path(server_type) / str(implementation)
                if relative not in seen:
                    seen.add(relative)
                    yield relative


def _dataset_files(raw: dict[str, Any]) -> Iterator[str]:
    """The relative ``jsonl_fpath`` of every dataset the config's agents name (absolute ones are machine-local)."""
    for block in raw.values():
        agents = block.get("responses_api_agents") if isinstance(block, dict) else None
        for inner in agents.values() if isinstance(agents, dict) else ():
            datasets = inner.get("datasets") if isinstance(inner, dict) else None
            for dataset in datasets if isinstance(datasets, list) else ():
                path = dataset.get("jsonl_fpath") if isinstance(dataset, dict) else None
                if isinstance(path, str) and not PurePosixPath(path).is_absolute() and ".." not in Path(path).parts:
                    yield path


def _add_tree(files: dict[str, Path], root: Path, folder: Path) -> None:
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(root)
        if path.is_file() and not path.is_symlink() and not SKIPPED_PARTS.intersection(relative.parts):
            if path.suffix not in (".pyc", ".pyo"):
                files[relative.as_posix()] = path


PLACEHOLDER = "todo"
"""How a scaffold marks what its author must fill in (``gym env init`` writes ``TODO: your name``)."""


def publication_problems(bundle: EnvironmentBundle) -> list[str]:
    """What keeps an environment from being published, as NeMo Gym 0.7's ``gym env publish`` checks before anything
    runs: it has a manifest that loads and names it, and none of the scaffold's placeholders is left (a TODO
    description or author, licensing ``unknown``)."""
    from nemo_gym.environment.manifest import MANIFEST_FILENAME, ManifestError, load_manifest

    path = bundle.root / "environments" / bundle.name / MANIFEST_FILENAME
    if not path.is_file():
        return [
            f"environment {bundle.name!r} has no {MANIFEST_FILENAME} ({path}); gym env init --environment writes one"
        ]
    try:
        manifest = load_manifest(path)
    except ManifestError as e:
        return [str(e)]
    problems = []
    if manifest.name != bundle.name:
        problems.append(f"{path}: name is {manifest.name!r}, the folder is {bundle.name!r}")
    placeholders = [
        key
        for key, left in (
            ("description", manifest.description.casefold().startswith(PLACEHOLDER)),
            ("authors", any(author.casefold().startswith(PLACEHOLDER) for author in manifest.authors)),
            ("licensing", manifest.licensing == "unknown"),
        )
        if left
    ]
    if placeholders:
        problems.append(f"{path}: fill in {', '.join(placeholders)} before publishing (placeholders left)")
    return problems


def publish_environment(
    bundle: EnvironmentBundle,
    hub: HfDatasetRegistry,
    repo_id: str,
    *,
    revision: str | None = None,
    private: bool = True,
    create_pr: bool = False,
) -> str:
    """Commit the bundle and its index to ``repo_id`` (created if missing) in one commit, to ``main`` or to the
    branch ``revision`` (created from ``main``); returns the commit or pull request URL."""
    if not hub.token:
        raise RegistryError("publishing an environment needs hf_token: set it in env.yaml")
    from huggingface_hub import CommitOperationAdd

    index = json.dumps(bundle.index(), indent=2).encode() + b"\n"
    operations = [CommitOperationAdd(path_in_repo=INDEX_FILE, path_or_fileobj=index)]
    operations += [
        CommitOperationAdd(path_in_repo=key, path_or_fileobj=str(path)) for key, path in bundle.files.items()
    ]
    api = hub.api()
    with hub.errors(repo_id, revision):
        api.create_repo(repo_id, repo_type=REPO_TYPE, private=private, exist_ok=True)
        if revision and revision != "main" and not create_pr:
            branches = {ref.name for ref in api.list_repo_refs(repo_id, repo_type=REPO_TYPE).branches}
            if revision not in branches:
                api.create_branch(repo_id, branch=revision, repo_type=REPO_TYPE, exist_ok=True)
        info = api.create_commit(
            repo_id,
            operations,
            commit_message=f"Publish environment {bundle.name} (nemo-gym {__version__})",
            repo_type=REPO_TYPE,
            revision=revision,
            create_pr=create_pr,
        )
    return str(getattr(info, "pr_url", None) or getattr(info, "commit_url", None) or info)


@dataclass(frozen=True)
class FetchedEnvironment:
    name: str
    root: Path
    files: tuple[str, ...]


def fetch_environment(
    hub: HfDatasetRegistry, repo_id: str, dest_root: Path, *, revision: str | None = None, overwrite: bool = False
) -> FetchedEnvironment:
    """Download a published environment into ``dest_root`` (a search root: ``environments/NAME`` lands under it).

    Nothing is written unless the repo holds an environment (its :data:`INDEX_FILE`) and no file it would write exists
    with other contents, unless ``overwrite``."""
    from huggingface_hub import snapshot_download

    dest_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nemo_gym_env_fetch_", dir=dest_root) as staging:
        with hub.errors(repo_id, revision):
            snapshot_download(
                repo_id,
                repo_type=REPO_TYPE,
                revision=revision,
                token=hub.token,
                endpoint=hub.endpoint,
                local_dir=staging,
            )
        index_path = Path(staging) / INDEX_FILE
        if not index_path.is_file():
            raise RegistryError(
                f"{repo_id} holds no environment: it has no {INDEX_FILE} (publish with gym env publish)"
            )
        index = json.loads(index_path.read_text(encoding="utf-8"))
        name, listed = str(index.get("name") or ""), [str(f) for f in index.get("files") or []]
        unsafe = [f for f in listed if PurePosixPath(f).is_absolute() or ".." in PurePosixPath(f).parts]
        if not name or unsafe or not all((Path(staging) / f).is_file() for f in listed):
            raise RegistryError(f"{repo_id}: {INDEX_FILE} does not describe the repo's files (republish it)")
        clashes = [
            f
            for f in listed
            if (dest_root / f).exists() and (dest_root / f).read_bytes() != (Path(staging) / f).read_bytes()
        ]
        if clashes and not overwrite:
            raise ConfigError(
                f"{len(clashes)} file(s) of {repo_id} already exist in {dest_root} with other contents (first: "
                f"{clashes[0]}); pass --overwrite to replace them, or fetch into another --output-dir"
            )
        for relative in listed:
            target = dest_root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(staging) / relative, target.with_name(target.name + ".part"))
            os.replace(target.with_name(target.name + ".part"), target)
    if not (dest_root / "environments" / name / ENVIRONMENT_CONFIG_FILENAME).is_file():
        raise RegistryError(f"{repo_id} has no environments/{name}/{ENVIRONMENT_CONFIG_FILENAME}")
    return FetchedEnvironment(name, dest_root.resolve(), tuple(listed))
