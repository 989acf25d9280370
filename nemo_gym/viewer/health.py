"""A run's rollout health reports (``quality_summary.json``, ``rollout_verdicts.jsonl``), as the viewer shows them.

The reports sit in the run's folder, which other runs may share: they are shown only when the summary names this
run's rollouts file. Both are read again when they change (``gym eval health-check`` run while the viewer is open).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.health.run import QUALITY_SUMMARY_FILENAME, ROLLOUT_VERDICTS_FILENAME

Key = tuple[Any, Any]


class RunHealth:
    """The health reports of the rollouts file ``path``, when there are reports of it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.summary_path = path.with_name(QUALITY_SUMMARY_FILENAME)
        self.verdicts_path = path.with_name(ROLLOUT_VERDICTS_FILENAME)
        self._loaded: tuple[tuple[float, float], dict[str, Any] | None, dict[Key, dict[str, Any]]] | None = None
        self._lock = threading.Lock()

    def _load(self) -> tuple[dict[str, Any] | None, dict[Key, dict[str, Any]]]:
        try:
            stamp = (self.summary_path.stat().st_mtime, self.verdicts_path.stat().st_mtime)
        except FileNotFoundError:
            return None, {}
        with self._lock:
            if self._loaded is None or self._loaded[0] != stamp:
                self._loaded = (stamp, *self._read())
            return self._loaded[1], self._loaded[2]

    def _read(self) -> tuple[dict[str, Any] | None, dict[Key, dict[str, Any]]]:
        try:
            summary = orjson.loads(self.summary_path.read_bytes())
        except orjson.JSONDecodeError:
            return None, {}
        run = summary.get("run") if isinstance(summary, dict) else None
        if not isinstance(run, dict) or self.path.name not in (run.get("rollouts_files") or []):
            return None, {}  # the reports of another run in the same folder
        verdicts: dict[Key, dict[str, Any]] = {}
        with self.verdicts_path.open("rb") as lines:
            for line in lines:
                try:
                    row = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(row, dict):
                    verdicts[(row.get("_ng_task_index"), row.get("_ng_rollout_index"))] = row
        return run, verdicts

    def overview(self) -> dict[str, Any] | None:
        """Verdict counts and the checks that found something (with how often), or None without reports."""
        run, _ = self._load()
        if run is None:
            return None
        issues = {check: n for check, n in (run.get("issues") or {}).items() if n}
        return {"verdicts": run.get("verdicts") or {}, "issues": issues, "ignored": run.get("ignored_checks") or []}

    def of_rollout(self, task: Any, rollout: Any) -> dict[str, Any] | None:
        """One rollout's verdict row (``verdict``, ``findings``, ``unobserved``), or None."""
        _, verdicts = self._load()
        return verdicts.get((task, rollout))
