"""Infer which ledger row is the rollout's terminal call when nothing named it, from parent links alone.

A harness retries and branches, so a ledger is a forest. The walk starts at the earliest-admitted root that has
children (or the earliest root), and at each step prefers children that themselves continue: an abandoned retry is
a childless sibling. Two continuing siblings are a real ambiguity and select nothing. Tokens are not read here;
``verify_and_linearize`` checks the chosen chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nemo_gym.token_id_capture.staging.records import (
    TERMINAL_AMBIGUOUS,
    TERMINAL_DUPLICATE_CALL_ID,
    TERMINAL_NO_RECORDS,
    TERMINAL_NO_ROOT,
    TERMINAL_ORPHANED_ROW,
    TERMINAL_SELECTED,
    CallRecord,
)


@dataclass(frozen=True)
class TerminalSelection:
    """The inferred terminal call, or None and the reason."""

    terminal_model_call_id: str | None
    reason: str


def select_terminal_call(records: Sequence[CallRecord]) -> TerminalSelection:
    """Follow parent links from the preferred root to a single leaf (see the module docstring)."""
    if not records:
        return TerminalSelection(None, TERMINAL_NO_RECORDS)
    by_id = {record.model_call_id: record for record in records}
    if len(by_id) != len(records):
        return TerminalSelection(None, TERMINAL_DUPLICATE_CALL_ID)
    children: dict[str, list[CallRecord]] = {}
    for record in records:
        if record.parent_call_id is not None:
            if record.parent_call_id not in by_id:
                return TerminalSelection(None, TERMINAL_ORPHANED_ROW)
            children.setdefault(record.parent_call_id, []).append(record)
    roots = [record for record in records if record.parent_call_id is None]
    if not roots:
        return TerminalSelection(None, TERMINAL_NO_ROOT)
    position = {record.model_call_id: index for index, record in enumerate(records)}

    def continuing(candidates: list[CallRecord]) -> list[CallRecord]:
        with_children = [record for record in candidates if record.model_call_id in children]
        return with_children or candidates

    def admission_order(record: CallRecord) -> tuple[bool, float, int]:
        stamped = record.admitted_at is not None
        return (not stamped, record.admitted_at or 0.0, position[record.model_call_id])

    node = min(continuing(roots), key=admission_order)
    while node.model_call_id in children:
        preferred = continuing(children[node.model_call_id])
        if len(preferred) > 1:
            return TerminalSelection(None, TERMINAL_AMBIGUOUS)
        node = preferred[0]
    return TerminalSelection(node.model_call_id, TERMINAL_SELECTED)
