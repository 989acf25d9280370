"""The task fields of a server's dataset rows, as the server declares them (NeMo Gym 0.7's ``nemo_gym.task_data``).

A resources server (or a self-contained agent) may ship ``task_data.py`` beside its ``app.py`` exporting
``TaskData``: a pydantic model, or any type ``pydantic.TypeAdapter`` accepts (a discriminated union). It describes
the task-owned fields of a row, written flat: the framework's keys (:data:`RESERVED_ROW_KEYS`, every ``_ng_*`` key)
are never part of it, and fields a row nests under ``verifier_metadata`` or ``task_data`` are lifted to the top
before validation, so one schema validates a flat row, a legacy row and a migrated one alike.

A field the server reads only from inside ``verifier_metadata`` carries
``json_schema_extra={"legacy_location": "verifier_metadata"}``; a row that has it only at the top level is reported
as misplaced, because the server would never see it. Such schema modules import only the standard library, pydantic
and other servers' ``task_data`` modules, so data tooling loads them without any server's requirements.
"""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter

from nemo_gym.episode_types import is_materialized_task_row

__all__ = [
    "LEGACY_METADATA_KEY",
    "RESERVED_ROW_KEYS",
    "TASK_DATA_ROW_KEY",
    "TaskDataSchemaError",
    "TaskDataValidationReport",
    "TaskDataValidator",
    "load_task_data_schema",
    "normalize_task_fields",
]

SCHEMA_FILE = "task_data.py"
SCHEMA_EXPORT = "TaskData"
LEGACY_METADATA_KEY = "verifier_metadata"
TASK_DATA_ROW_KEY = "task_data"
RESERVED_ROW_KEYS = frozenset({"responses_create_params", "agent_ref", "task_source"})
"""Row keys the framework owns, besides every ``_ng_*`` key (indices, rollout ids, failure fields)."""

_MAX_ERRORS_KEPT = 5


class TaskDataSchemaError(Exception):
    """A server's ``task_data.py`` exists but cannot be used: it fails to import or exports no usable ``TaskData``."""


def load_task_data_schema(server_dir: Path) -> TypeAdapter[Any] | None:
    """A ``TypeAdapter`` for ``<server_dir>/task_data.py``'s ``TaskData``; ``None`` when the server ships no schema."""
    source = Path(server_dir) / SCHEMA_FILE
    if not source.is_file():
        return None
    module_name = f"_nemo_gym_task_data_{Path(server_dir).resolve().name}"
    spec = importlib.util.spec_from_file_location(module_name, source)
    if spec is None or spec.loader is None:
        raise TaskDataSchemaError(f"{source}: Python cannot load this file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # pydantic resolves the module's forward references through sys.modules
    try:
        spec.loader.exec_module(module)
        schema = getattr(module, SCHEMA_EXPORT, None)
    except Exception as error:
        # A module that failed half way is not left importable under its temporary name.
        del sys.modules[module_name]
        raise TaskDataSchemaError(f"{source}: importing it failed: {type(error).__name__}: {error}") from error
    if schema is None:
        raise TaskDataSchemaError(f"{source} defines no `{SCHEMA_EXPORT}`: export the row schema under that name")
    try:
        return TypeAdapter(schema)
    except Exception as error:
        raise TaskDataSchemaError(
            f"{source}: `{SCHEMA_EXPORT}` is not a type pydantic can validate: {error}"
        ) from error


def _reserved(key: str) -> bool:
    return key in RESERVED_ROW_KEYS or key.startswith("_ng_")


def normalize_task_fields(row: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The task-owned fields of ``row``, flat, and the keys found twice with different values.

    Framework keys are dropped; the contents of ``verifier_metadata`` and ``task_data`` (when they are objects) are
    lifted to the top. A key found twice with the same value is kept once; with different values the first (top-level)
    value stays and the key is reported, since the row is ambiguous. A container that is not an object is left in
    place for the schema to reject.
    """
    fields = {key: value for key, value in row.items() if not _reserved(key)}
    conflicts: list[str] = []
    for container in (LEGACY_METADATA_KEY, TASK_DATA_ROW_KEY):
        if not isinstance(fields.get(container), Mapping):
            continue
        for key, value in fields.pop(container).items():
            if key not in fields:
                fields[key] = value
            elif fields[key] != value:
                conflicts.append(key)
    return fields, conflicts


def _core_schema_models(schema: Any, definitions: dict[str, Any] | None = None) -> list[type[BaseModel]]:
    """The pydantic models a schema type is made of, read from its adapter's public core schema: itself, or the
    members of a union however nested (not the models its fields hold)."""
    if not isinstance(schema, dict):
        return []
    kind = schema.get("type")
    if kind == "model":
        cls = schema.get("cls")
        return [cls] if isinstance(cls, type) and issubclass(cls, BaseModel) else []
    if kind == "definitions":
        found = {d["ref"]: d for d in schema.get("definitions", ()) if isinstance(d, dict) and "ref" in d}
        return _core_schema_models(schema.get("schema"), found)
    if kind == "definition-ref":
        return _core_schema_models((definitions or {}).get(schema.get("schema_ref", "")), definitions)
    if kind == "union":
        choices = [c[0] if isinstance(c, tuple) else c for c in schema.get("choices", ())]
    elif kind == "tagged-union":
        choices = list(schema.get("choices", {}).values())
    else:
        choices = [schema.get("schema")]  # nullable, default, validator wrappers: the schema inside
    return [model for choice in choices for model in _core_schema_models(choice, definitions)]


def _legacy_fields(adapter: TypeAdapter[Any]) -> frozenset[str]:
    """Fields marked ``legacy_location: verifier_metadata``: the server reads them only from there today."""
    marked = set()
    for model in _core_schema_models(adapter.core_schema):
        for name, info in model.model_fields.items():
            extra = info.json_schema_extra
            if isinstance(extra, dict) and extra.get("legacy_location") == LEGACY_METADATA_KEY:
                marked.add(name)
    return frozenset(marked)


@dataclass
class TaskDataValidationReport:
    """What validating one dataset file against one server's schema found."""

    server_name: str
    dataset_fpath: str
    rows: int = 0
    error_rows: int = 0
    errors: list[str] = field(default_factory=list)
    unknown_keys: Counter[str] = field(default_factory=Counter)
    conflicting_keys: Counter[str] = field(default_factory=Counter)
    misplaced_keys: Counter[str] = field(default_factory=Counter)

    @property
    def clean(self) -> bool:
        """No invalid row, and no key that is ambiguous, misplaced or unknown to the schema."""
        return not (self.error_rows or self.unknown_keys or self.conflicting_keys or self.misplaced_keys)

    def _fail(self, index: int, message: str) -> None:
        self.error_rows += 1
        if len(self.errors) < _MAX_ERRORS_KEPT:
            self.errors.append(f"{index}: {message}")

    def summary(self) -> str:
        """A few lines for a person: the failing rows (the first few) and each kind of suspicious key."""
        lines = [
            f"{self.dataset_fpath}: {self.error_rows} of {self.rows} rows do not match the task_data schema of "
            f"`{self.server_name}`."
        ]
        lines += [f"  row {error}" for error in self.errors]
        if self.error_rows > len(self.errors):
            lines.append(f"  ({self.error_rows - len(self.errors)} more rows fail)")
        for counts, meaning in (
            (self.conflicting_keys, "found twice with different values (top level and a nested container)"),
            (self.misplaced_keys, "read from verifier_metadata by the server but found only at the top level"),
            (self.unknown_keys, "not declared by the schema (a typo, or a field the schema lacks)"),
        ):
            if counts:
                listed = ", ".join(f"{key} ({count} rows)" for key, count in sorted(counts.items()))
                lines.append(f"  keys {meaning}: {listed}")
        return "\n".join(lines)


class TaskDataValidator:
    """Validates rows one at a time against a server's ``TaskData``, adding what it finds to ``report``."""

    def __init__(self, server_name: str, adapter: TypeAdapter[Any], dataset_fpath: str) -> None:
        self._adapter = adapter
        self._legacy = _legacy_fields(adapter)
        self.report = TaskDataValidationReport(server_name=server_name, dataset_fpath=dataset_fpath)

    def _flatten_materialized(self, index: int, row: Mapping[str, Any]) -> dict[str, Any] | None:
        """A materialized task's fields (its ``task_input``, with ``task_input.task_data`` lifted); None if malformed."""
        task_input = row.get("task_input")
        if not isinstance(task_input, Mapping):
            self.report._fail(index, f"task_input must be an object, not {type(task_input).__name__}")
            return None
        nested = task_input.get(TASK_DATA_ROW_KEY, {})
        if not isinstance(nested, Mapping):
            self.report._fail(index, f"task_input.task_data must be an object, not {type(nested).__name__}")
            return None
        flat = dict(nested)
        for key, value in task_input.items():
            if key == TASK_DATA_ROW_KEY:
                continue
            if key in flat and flat[key] != value:
                self.report.conflicting_keys[key] += 1
            else:
                flat[key] = value
        return flat

    def validate_row(self, row_index: int, row: dict[str, Any]) -> None:
        """Check one row; the outcome goes to ``report``, nothing is raised for a bad row."""
        self.report.rows += 1
        subject: Mapping[str, Any] = row
        migrated = TASK_DATA_ROW_KEY in row
        if is_materialized_task_row(row):
            flat = self._flatten_materialized(row_index, row)
            if flat is None:
                return
            migrated = migrated or TASK_DATA_ROW_KEY in row["task_input"]
            subject = flat
        if self._legacy and not migrated:
            nested = subject.get(LEGACY_METADATA_KEY)
            inside = set(nested) if isinstance(nested, Mapping) else set()
            for key in (self._legacy & subject.keys()) - inside:
                self.report.misplaced_keys[key] += 1
        fields, conflicts = normalize_task_fields(subject)
        self.report.conflicting_keys.update(conflicts)
        try:
            validated = self._adapter.validate_python(fields)
        except Exception as error:
            self.report._fail(row_index, " ".join(str(error).split())[:400])
            return
        if isinstance(validated, BaseModel):  # with extra="allow" the undeclared keys land in __pydantic_extra__
            self.report.unknown_keys.update((validated.__pydantic_extra__ or {}).keys())
