"""``gym eval reverify --atif-manifest DIR``: score an ATIF export again and say where a reward differs.

The export is read back strictly: each file's sha256 must match the manifest, each file must be ATIF v1.7, and its
manifest entry must name the file's own task and rollout. Each trajectory then becomes a stored rollout again (its
agent's output rebuilt from the steps by :mod:`nemo_gym.atif.to_response`, the reward it was exported with, the task
row kept in its ``extra``), and the rows go through ``gym eval reverify``'s own path to the resources servers. What
comes back is compared with the exported rewards: a difference is a line naming the file and both rewards.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import orjson
from pydantic import ValidationError

from nemo_gym.atif.export import MANIFEST_NAME, Key
from nemo_gym.atif.from_rollout import OURS, UnsupportedRollout, is_index
from nemo_gym.atif.schema import Trajectory
from nemo_gym.atif.strict_json import loads_object
from nemo_gym.atif.to_response import trajectory_response
from nemo_gym.config.datasets import AGENT_REF_KEY
from nemo_gym.errors import ConfigError
from nemo_gym.jsonl import iter_jsonl
from nemo_gym.row_fields import REWARD_TOLERANCE, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY


@dataclass(frozen=True)
class ExportedTrajectory:
    path: Path
    key: Key
    trajectory: Trajectory

    @property
    def ours(self) -> dict[str, Any]:
        mine = (self.trajectory.extra or {}).get(OURS)
        return mine if isinstance(mine, dict) else {}

    @property
    def reward(self) -> float | None:
        """The reward it was exported with; None for a file another exporter wrote (NeMo Gym 0.7's keeps none)."""
        reward = self.ours.get("reward")
        return float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None


def manifest_file(path: Path) -> Path:
    """``--atif-manifest`` names the export's folder or its ``manifest.jsonl``."""
    manifest = path / MANIFEST_NAME if path.is_dir() else path
    if not manifest.is_file():
        raise ConfigError(f"--atif-manifest {path}: no {MANIFEST_NAME} there (the folder gym eval export wrote)")
    return manifest


def _validation_line(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "the document"
    more = f" (and {error.error_count() - 1} more problem(s))" if error.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def _entry(manifest: Path, n: int, line: bytes) -> tuple[Path, Key, str]:
    where = f"{manifest}:{n}"
    entry = loads_object(line, where)
    name, digest = entry.get("trajectory_path"), entry.get("expected_sha256")
    task, rollout = entry.get(TASK_INDEX_KEY), entry.get(ROLLOUT_INDEX_KEY)
    if not isinstance(name, str) or not isinstance(digest, str):
        raise ConfigError(f"{where}: an entry needs trajectory_path and expected_sha256 strings")
    if not (is_index(task) and is_index(rollout)):
        raise ConfigError(f"{where}: {TASK_INDEX_KEY} and {ROLLOUT_INDEX_KEY} must be non-negative integers")
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise ConfigError(f"{where}: trajectory_path {name!r} must stay inside the export's folder")
    return manifest.parent / relative, (task, rollout), digest


def load_export(path: Path) -> list[ExportedTrajectory]:
    """Every trajectory the manifest lists, checked (hash, schema, identity); the first problem is the error."""
    manifest = manifest_file(path)
    loaded: list[ExportedTrajectory] = []
    seen: set[Key] = set()
    with manifest.open("rb") as handle:
        lines = [(n, line) for n, line in enumerate(handle, 1) if line.strip()]
    for n, line in lines:
        file, key, digest = _entry(manifest, n, line)
        if key in seen:
            raise ConfigError(f"{manifest}:{n}: (task {key[0]}, rollout {key[1]}) is listed twice")
        seen.add(key)
        try:
            data = file.read_bytes()
        except OSError as e:
            raise ConfigError(f"{file}: cannot read it ({e.strerror}); {manifest} lists it") from None
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise ConfigError(f"{file}: sha256 is {actual}, the manifest says {digest}: the file changed after export")
        try:
            trajectory = Trajectory.model_validate(loads_object(data, str(file)))
        except ValidationError as e:
            raise ConfigError(f"{file}: not ATIF v1.7: {_validation_line(e)}") from None
        exported = ExportedTrajectory(file, key, trajectory)
        ours = exported.ours
        if TASK_INDEX_KEY in ours and (ours.get(TASK_INDEX_KEY), ours.get(ROLLOUT_INDEX_KEY)) != key:
            raise ConfigError(f"{file}: the file is not (task {key[0]}, rollout {key[1]}) as {manifest} says")
        if "reward" in ours and exported.reward is None:
            raise ConfigError(f"{file}: extra.{OURS}.reward: {ours['reward']!r} is not a number")
        loaded.append(exported)
    if not loaded:
        raise ConfigError(f"{manifest} lists no trajectories")
    return loaded


def write_stored_rollouts(
    exported: list[ExportedTrajectory], rollouts: Path, inputs: Path, tasks: dict[Key, dict[str, Any]] | None = None
) -> None:
    """The trajectories as the rollouts and task rows ``gym eval reverify`` reads. The task rows are the ones kept
    in the files, or ``tasks`` (the run's materialized inputs, ``--inputs``), which a file of another exporter needs.
    """
    rows: list[dict[str, Any]] = []
    with rollouts.open("wb") as out_rollouts:
        for item in exported:
            task = item.ours.get("task") if tasks is None else tasks.get(item.key)
            if not isinstance(task, dict):
                where = f"extra.{OURS}.task: no task row kept" if tasks is None else "not in --inputs"
                raise ConfigError(f"{item.path}: (task {item.key[0]}, rollout {item.key[1]}) {where}; pass the run's "
                                  "materialized inputs with --inputs")  # fmt: skip
            rows.append(task | {TASK_INDEX_KEY: item.key[0], ROLLOUT_INDEX_KEY: item.key[1]})
            try:
                response = trajectory_response(item.trajectory)
            except UnsupportedRollout as e:
                raise ConfigError(f"{item.path}: {e}") from None
            index = {TASK_INDEX_KEY: item.key[0], ROLLOUT_INDEX_KEY: item.key[1]}
            row = index | {
                AGENT_REF_KEY: {"name": item.trajectory.agent.name},
                "reward": item.reward,
                "responses_create_params": task.get("responses_create_params"),
                "response": response,
            }
            out_rollouts.write(orjson.dumps(row) + b"\n")
    inputs.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))


def reward_mismatches(exported: list[ExportedTrajectory], reverified: Path) -> tuple[list[str], int]:
    """One line per trajectory whose new reward differs from the one it was exported with, and how many were
    compared (a trajectory without an exported reward is not)."""
    files = {item.key: item for item in exported}
    lines = []
    compared = 0
    for _, row in iter_jsonl(reverified):
        item = files[(int(row[TASK_INDEX_KEY]), int(row[ROLLOUT_INDEX_KEY]))]
        before, now = item.reward, float(row["reward"])
        if before is None:
            continue
        compared += 1
        if abs(before - now) > REWARD_TOLERANCE:
            lines.append(
                f"reward mismatch: {item.path} (task {item.key[0]}, rollout {item.key[1]}): "
                f"exported {before:g}, verifier now {now:g}"
            )
    return lines, compared
