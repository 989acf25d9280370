"""Agent skills: a directory of skill directories (each with a ``SKILL.md``) handed to an agent at rollout time.

Skills follow the Agent Skills layout that Codex CLI and Claude Code read: a skill is a directory whose ``SKILL.md``
starts with YAML frontmatter (``name``, ``description``, optional ``metadata.version``). A run names one directory of
them (``skills.path``); the dataset stays the same across skill variants. A :class:`SkillsRef` stamps results with the
path and a content hash, so two versions of a skill edited in place at one path stay apart.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import yaml
from pydantic import BaseModel, Field

from nemo_gym.config import roots as _roots
from nemo_gym.errors import ConfigError as _ConfigError

__all__ = [
    "SKILL_MD_FILENAME",
    "SkillMetadata",
    "SkillsConfig",
    "SkillsError",
    "SkillsRef",
    "hash_skill_dir",
    "load_skill_directory",
    "parse_skill_md",
    "stage_skills",
]

SKILL_MD_FILENAME = "SKILL.md"
_HASH_LENGTH = 12


class SkillsError(_ConfigError, ValueError):
    """A skills directory or ``SKILL.md`` that cannot be used (also a ``ValueError``, as in NeMo Gym)."""


class SkillMetadata(BaseModel):
    name: str
    description: str | None = None
    version: str | None = None


class SkillsRef(BaseModel):
    """The skills a run used: ``path`` as configured, ``hash`` over the directory's files, each skill's metadata."""

    path: str
    hash: str
    skills: list[SkillMetadata]


class SkillsConfig(BaseModel):
    path: str = Field(description="A directory of skill directories, each with a SKILL.md.")


def _resolve(path: str) -> Path:
    """``path`` looked up like other config paths (search roots, cwd, install root); the first candidate if absent."""
    return _roots.find_path(path) or _roots.candidate_paths(path)[0]


def hash_skill_dir(root: Path) -> str:
    """A short sha256 over every file's relative path and bytes, in path order (renames change it too)."""
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()[:_HASH_LENGTH]


def parse_skill_md(skill_md: Path) -> SkillMetadata:
    """The frontmatter of a ``SKILL.md`` (a leading BOM is allowed); a missing ``name`` or bad YAML is a SkillsError."""
    lines = skill_md.read_text(encoding="utf-8-sig", errors="replace").splitlines()
    if not lines or lines[0].strip() != "---":
        raise SkillsError(f"{skill_md}: no YAML frontmatter; start the file with '---', then name: and description:")
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        raise SkillsError(f"{skill_md}: the YAML frontmatter has no closing '---' line")
    try:
        data = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as e:
        raise SkillsError(f"{skill_md}: malformed YAML frontmatter: {e}") from None
    if not isinstance(data, dict):
        raise SkillsError(f"{skill_md}: the frontmatter must be a mapping, not {type(data).__name__}")
    if not data.get("name"):
        raise SkillsError(f"{skill_md}: the frontmatter needs a 'name'")
    metadata = data.get("metadata")
    version = metadata.get("version") if isinstance(metadata, dict) else None
    return SkillMetadata(
        name=str(data["name"]), description=data.get("description"), version=None if version is None else str(version)
    )


def load_skill_directory(path: str) -> SkillsRef:
    """Read every skill under ``path``; a missing directory, a subdirectory without ``SKILL.md`` or no skill at all
    is a SkillsError naming ``skills.path``."""
    root = _resolve(path)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is a file, not a directory of skill directories"
        raise SkillsError(f"skills.path={path!r}: {root} {what}")
    skills = []
    for skill_dir in sorted(d for d in root.iterdir() if d.is_dir()):
        if not (skill_dir / SKILL_MD_FILENAME).is_file():
            raise SkillsError(f"skills.path={path!r}: {skill_dir} has no {SKILL_MD_FILENAME}")
        skills.append(parse_skill_md(skill_dir / SKILL_MD_FILENAME))
    if not skills:
        raise SkillsError(f"skills.path={path!r}: {root} holds no skill directory (each needs a {SKILL_MD_FILENAME})")
    return SkillsRef(path=path, hash=hash_skill_dir(root), skills=skills)


def stage_skills(path: str, dest_skills_dir: Path) -> None:
    """Copy the skills directory ``path`` to ``dest_skills_dir`` (which must not exist), where an agent's CLI finds
    them (``<CLAUDE_CONFIG_DIR>/skills``, ``<CODEX_HOME>/skills``)."""
    root = _resolve(path)
    if not root.is_dir():
        raise SkillsError(
            f"cannot stage skills from {path!r}: {root} is not a directory (on a cluster it must be on storage the "
            "agent can read)"
        )
    shutil.copytree(root, dest_skills_dir)
