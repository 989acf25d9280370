"""A flat dataset row as a materialized task: its identity (task set + task id) and its input (NeMo Gym 0.7).

The task id is the row's own ``task_id``, ``problem_id`` or ``instance_id`` when it has one, else its task index
(``_ng_task_index``, or the ``task_index`` given): stable while the dataset's rows keep their order, whatever their
text. Routing fields (``agent_ref``, ``task_source``, ``skills_ref``) and the collector's ``_ng_*`` fields are not
part of the task. The source row is not changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_gym.episode_types import TaskId
from nemo_gym.row_fields import TASK_INDEX_KEY

__all__ = ["TASK_ID_FIELDS", "materialize_task"]

TASK_ID_FIELDS = ("task_id", "problem_id", "instance_id")
"""Row fields that name a task, in the order they are looked for."""
_ROUTING_FIELDS = frozenset({"agent_ref", "task_source", "skills_ref"})


def materialize_task(row: Mapping[str, Any], *, taskset: str, task_index: int | None = None) -> dict[str, Any]:
    """``{"task_id": {"taskset", "task_id"}, "task_input": {...}}`` for a flat row (a ``ValueError`` for a row that
    is already materialized, or one with no id and no usable task index)."""
    if "task_input" in row or isinstance(row.get("task_id"), Mapping):
        raise ValueError("this row is already a materialized task (it has task_input or a task_id object)")
    named = next((str(row[key]) for key in TASK_ID_FIELDS if row.get(key) is not None), None)
    if named is None:
        index = row.get(TASK_INDEX_KEY, task_index)
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise ValueError(f"a row without {'/'.join(TASK_ID_FIELDS)} needs a task index (>= 0), got {index!r}")
        named = str(index)
    task_input = {k: v for k, v in row.items() if k not in _ROUTING_FIELDS and not k.startswith("_ng_")}
    return {"task_id": TaskId(taskset=taskset, task_id=named).model_dump(), "task_input": task_input}
