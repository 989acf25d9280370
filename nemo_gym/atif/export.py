"""``gym eval export --format atif``: a run's rollouts as one ATIF v1.7 file each, and a manifest of their hashes.

The folder (NeMo Gym 0.7's layout): ``<task>-<rollout>.json`` per rollout and ``manifest.jsonl``, one line per file
with its path, its task and rollout index and the sha256 of its bytes, so a reader can tell a file that changed.

Every row is converted and checked, and the folder appears whole or not at all (it is built beside the target and
renamed into place once every row passed): a half-exported run never looks like a finished one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.atif import DEFAULT_AGENT_VERSION
from nemo_gym.atif.from_rollout import is_index, rollout_to_trajectory
from nemo_gym.atif.schema import Trajectory
from nemo_gym.atif.strict_json import loads_object
from nemo_gym.errors import ConfigError
from nemo_gym.rollouts.outputs import materialized_inputs_path
from nemo_gym.row_fields import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY

MANIFEST_NAME = "manifest.jsonl"
MAX_LISTED = 5

Key = tuple[int, int]


@dataclass(frozen=True)
class ExportResult:
    output_dir: Path
    manifest_path: Path
    trajectories: int


def trajectory_bytes(trajectory: Trajectory) -> bytes:
    """The file's bytes: only the fields given, two-space indented, one final newline."""
    return (trajectory.model_dump_json(indent=2, exclude_unset=True) + "\n").encode()


def _lines(path: Path) -> list[tuple[int, bytes]]:
    with path.open("rb") as handle:
        return [(n, line) for n, line in enumerate(handle, 1) if line.strip()]


def _key(row: dict[str, Any], where: str) -> Key:
    task, rollout = row.get(TASK_INDEX_KEY), row.get(ROLLOUT_INDEX_KEY)
    if not (is_index(task) and is_index(rollout)):
        raise ConfigError(f"{where}: {TASK_INDEX_KEY} and {ROLLOUT_INDEX_KEY} must be non-negative integers")
    return task, rollout


def task_rows(path: Path) -> dict[Key, dict[str, Any]]:
    """A run's materialized inputs by (task, rollout)."""
    rows = {}
    for n, line in _lines(path):
        row = loads_object(line, f"{path}:{n}")
        rows[_key(row, f"{path}:{n}")] = row
    return rows


def _task_spans(path: Path) -> dict[Key, tuple[int, int]]:
    """Where each task row of the inputs file is (offset, length): a large run's rows are read when exported, one at
    a time, rather than all held at once."""
    spans: dict[Key, tuple[int, int]] = {}
    offset = 0
    with path.open("rb") as handle:
        for n, line in enumerate(handle, 1):
            if line.strip():
                spans[_key(loads_object(line, f"{path}:{n}"), f"{path}:{n}")] = (offset, len(line))
            offset += len(line)
    return spans


def _one_line(problems: list[str], what: str) -> str:
    more = f"; … {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    return f"{len(problems)} {what}: " + "; ".join(problems[:MAX_LISTED]) + more


def _manifest_line(task: int, rollout: int, name: str, data: bytes) -> bytes:
    entry = {
        "trajectory_path": name,
        TASK_INDEX_KEY: task,
        ROLLOUT_INDEX_KEY: rollout,
        "expected_sha256": hashlib.sha256(data).hexdigest(),
    }
    return orjson.dumps(entry, option=orjson.OPT_SORT_KEYS) + b"\n"


def export_atif(
    rollouts: Path,
    output_dir: Path,
    *,
    inputs: Path | None = None,
    session_id: str | None = None,
    agent_version: str = DEFAULT_AGENT_VERSION,
) -> ExportResult:
    """Write ``output_dir`` (which must not exist) from the rollouts file and the run's materialized inputs."""
    if not rollouts.is_file():
        raise ConfigError(f"--rollouts {rollouts}: no such file")
    if output_dir.exists():
        raise ConfigError(f"--output-dir {output_dir} already exists; an export goes to a new folder")
    inputs = inputs or materialized_inputs_path(rollouts)
    if not inputs.is_file():
        raise ConfigError(
            f"no materialized inputs at {inputs}: the export keeps each rollout's task row so it can be verified "
            "again (gym eval run writes that file beside --output); pass --inputs PATH"
        )
    tasks = _task_spans(inputs)
    session = session_id or rollouts.stem
    manifest: dict[Key, bytes] = {}
    problems: list[str] = []
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    try:
        with inputs.open("rb") as task_file:
            for n, line in _lines(rollouts):
                where = f"{rollouts}:{n}"
                try:
                    row = loads_object(line, where)
                    key = _key(row, where)
                    if key in manifest:
                        raise ConfigError(f"{where}: (task {key[0]}, rollout {key[1]}) appears twice")
                    if key not in tasks:
                        raise ConfigError(f"{where}: (task {key[0]}, rollout {key[1]}) is not in {inputs}")
                    offset, length = tasks[key]
                    task = loads_object(os.pread(task_file.fileno(), length, offset), f"{inputs}:{key}")
                    data = trajectory_bytes(
                        rollout_to_trajectory(row, task, session_id=session, agent_version=agent_version)
                    )
                except ConfigError as e:
                    problems.append(str(e) if str(e).startswith(where) else f"{where}: {e}")
                    continue
                name = f"{key[0]}-{key[1]}.json"
                (staging / name).write_bytes(data)  # written as it goes, so memory stays flat; renamed in at the end
                manifest[key] = _manifest_line(*key, name, data)
        if problems:
            raise ConfigError(_one_line(problems, "rollout(s) cannot be exported as ATIF"))
        if not manifest:
            raise ConfigError(f"{rollouts} holds no rollouts to export")
        (staging / MANIFEST_NAME).write_bytes(b"".join(line for _, line in sorted(manifest.items())))
        staging.chmod(0o755)
        os.rename(staging, output_dir)  # refuses a folder that appeared meanwhile, rather than mixing two exports
    except OSError as e:
        raise ConfigError(f"--output-dir {output_dir}: cannot write the export ({e.strerror})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(output_dir, output_dir / MANIFEST_NAME, len(manifest))
