"""Which captured model call an agent's reference names, and which invocation owns each call.

An agent names its model calls loosely (:class:`~nemo_gym.observability.records.ModelCallRef`: the capture's call id,
or the model server plus the response id). :class:`CallIndex` resolves such a reference against the captured calls,
and only ever to exactly one call: none or several is reported, never guessed. :func:`join_model_call_observations`
applies that to an agent's observation bundle, so every reference ends either canonical (all three identities of the
call it names) or with a gap saying why not, and every captured call no invocation owns is a gap too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nemo_gym.observability.capture import ModelCallRecord
from nemo_gym.observability.records import (
    AgentInvocation,
    AgentObservationBundle,
    ContextCompactionObservation,
    ModelCallRef,
    ObservationGap,
)

__all__ = ["CallIndex", "join_model_call_observations"]

Identity = tuple[str | None, Any, str | None]
"""A call's ``(model_call_id, model_ref, response_id)``; ``model_ref`` a ``ModelServerRef`` or None."""

_JOIN_CODES = frozenset(
    {"model_call_reference_ambiguous", "model_call_reference_conflict", "model_call_reference_unmatched"}
)
_UNOWNED = "model_call_ownership_unavailable"


def _server(ref: Any) -> tuple[str, str] | None:
    return None if ref is None else (str(ref.type), str(ref.name))


class CallIndex:
    """Captured calls by call id and by (model server, response id), resolving references to positions."""

    def __init__(self, identities: Iterable[Identity]) -> None:
        self.identities = list(identities)
        self._by_id: dict[str, list[int]] = {}
        self._by_response: dict[tuple[str, str, str], list[int]] = {}
        for position, (call_id, model_ref, response_id) in enumerate(self.identities):
            if call_id:
                self._by_id.setdefault(call_id, []).append(position)
            server = _server(model_ref)
            if server is not None and response_id:
                self._by_response.setdefault((*server, response_id), []).append(position)

    def candidates(self, ref: ModelCallRef) -> list[int]:
        """Every call ``ref`` could name: by call id (narrowed by the server and response id it also gives), else by
        server and response id."""
        server = _server(ref.model_ref)
        if ref.model_call_id:
            return [
                position
                for position in self._by_id.get(ref.model_call_id, [])
                if (server is None or server == _server(self.identities[position][1]))
                and (ref.response_id is None or ref.response_id == self.identities[position][2])
            ]
        if server is not None and ref.response_id:
            return list(self._by_response.get((*server, ref.response_id), []))
        return []

    def unique(self, ref: ModelCallRef) -> int | None:
        found = self.candidates(ref)
        return found[0] if len(found) == 1 else None

    def canonical(self, position: int) -> ModelCallRef:
        call_id, model_ref, response_id = self.identities[position]
        return ModelCallRef(model_call_id=call_id, model_ref=model_ref, response_id=response_id)


def _gap(code: str, invocation_id: str | None, detail: str | None) -> ObservationGap:
    return ObservationGap(code=code, invocation_id=invocation_id, detail=detail)


def _unresolved(found: list[int], invocation_id: str, detail: str | None) -> ObservationGap:
    code = "model_call_reference_ambiguous" if found else "model_call_reference_unmatched"
    return _gap(code, invocation_id, detail)


def _label(index: CallIndex, position: int) -> str | None:
    call_id, _, response_id = index.identities[position]
    return call_id or response_id


def _adopt_declared_calls(invocations: list[AgentInvocation], calls: list[ModelCallRecord], index: CallIndex) -> None:
    """A call whose client declared its invocation (``client_session_id``) joins that invocation's references
    unless one of them already names it."""
    by_id = {invocation.invocation_id: invocation for invocation in invocations}
    for position, call in enumerate(calls):
        declared = getattr(call, "client_session_id", None)  # recorded by captures that keep the x-session-id header
        invocation = by_id.get(declared) if isinstance(declared, str) else None
        if invocation is None or not call.model_call_id:
            continue
        if any(position in index.candidates(ref) for ref in invocation.model_calls):
            continue
        invocation.model_calls.append(index.canonical(position))


def _resolve_compaction(
    compaction: ContextCompactionObservation, index: CallIndex, owners: dict[int, str], gaps: list[ObservationGap]
) -> None:
    """A compaction's calls must be its own invocation's; its before / after calls must not be another's."""
    resolved = []
    for ref in compaction.model_calls:
        found = index.candidates(ref)
        if len(found) != 1:
            gaps.append(
                _unresolved(found, compaction.invocation_id, f"model_calls:{ref.model_call_id or ref.response_id}")
            )
            resolved.append(ref)
            continue
        owner = owners.get(found[0])
        if owner != compaction.invocation_id:
            code = "model_call_reference_conflict" if owner is not None else _UNOWNED
            gaps.append(_gap(code, compaction.invocation_id, f"model_calls:{_label(index, found[0])}"))
            resolved.append(ref)
            continue
        resolved.append(index.canonical(found[0]))
    compaction.model_calls = resolved
    for field in ("before_model_call", "after_model_call"):
        ref = getattr(compaction, field)
        if ref is None:
            continue
        found = index.candidates(ref)
        if len(found) != 1:
            gaps.append(_unresolved(found, compaction.invocation_id, f"{field}:{ref.model_call_id or ref.response_id}"))
            continue
        owner = owners.get(found[0])
        if owner is not None and owner != compaction.invocation_id:
            gaps.append(
                _gap("model_call_reference_conflict", compaction.invocation_id, f"{field}:{_label(index, found[0])}")
            )
            continue
        setattr(compaction, field, index.canonical(found[0]))


def join_model_call_observations(
    bundle: AgentObservationBundle, calls: Iterable[ModelCallRecord]
) -> AgentObservationBundle:
    """A copy of ``bundle`` with its model call references resolved against the captured ``calls``.

    Each resolved reference becomes canonical and makes its invocation the call's owner; one that names no call or
    several, or a call another invocation already owns, stays as it was with a gap. Calls that no invocation owns are
    gaps of the bundle. Joining a joined bundle again gives the same result: the gaps of an earlier join are replaced.
    """
    captured = list(calls)
    index = CallIndex((call.model_call_id, call.model_ref, call.response_id) for call in captured)
    records: list[Any] = []
    for record in bundle.records:
        if isinstance(record, (AgentInvocation, ContextCompactionObservation)):
            record = record.model_copy(update={"model_calls": list(record.model_calls)})
        records.append(record)
    invocations = [record for record in records if isinstance(record, AgentInvocation)]
    _adopt_declared_calls(invocations, captured, index)

    gaps = [
        gap
        for gap in bundle.gaps
        if gap.code not in _JOIN_CODES
        and not (gap.code == _UNOWNED and gap.invocation_id is None and (gap.detail or "").startswith("capture:"))
    ]
    owners: dict[int, str] = {}
    for invocation in invocations:
        resolved = []
        for ref in invocation.model_calls:
            found = index.candidates(ref)
            if len(found) != 1:
                gaps.append(_unresolved(found, invocation.invocation_id, ref.model_call_id or ref.response_id))
                resolved.append(ref)
            elif found[0] in owners:
                gaps.append(_gap("model_call_reference_conflict", invocation.invocation_id, _label(index, found[0])))
                resolved.append(ref)
            else:
                owners[found[0]] = invocation.invocation_id
                resolved.append(index.canonical(found[0]))
        invocation.model_calls = resolved
    for record in records:
        if isinstance(record, ContextCompactionObservation):
            _resolve_compaction(record, index, owners, gaps)
    for position, call in enumerate(captured):
        if position not in owners:
            name = call.model_call_id or call.response_id or "unknown"
            gaps.append(_gap(_UNOWNED, None, f"capture:{name}:call_index={call.call_index}"))
    distinct: dict[tuple[str, str | None, str | None], ObservationGap] = {}
    for gap in gaps:
        distinct[gap.code, gap.invocation_id, gap.detail] = gap
    return bundle.model_copy(update={"records": records, "gaps": list(distinct.values())})
