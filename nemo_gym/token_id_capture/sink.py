"""The capture of one model call: a request-scoped ``CaptureContext``, its parent decision, and the record it commits.

The model server's training-capture middleware (``observability/token_capture.py``) opens a context for a request
that came in under ``/ng-rollout/<id>/training-token-capture/``; ``resolve_parent`` decides once, before dispatch,
which recorded call the request continues; ``capture_tokens`` turns the finished answer into a ``TokenEntry`` and
``commit_entry`` writes it. A capture failure never fails the model call: it marks the rollout incomplete, so the
sample is masked instead of being trained with a hole. Untagged traffic has no context and costs one lookup.
"""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nemo_gym.token_id_capture.fingerprint import assistant_fingerprint
from nemo_gym.token_id_capture.lineage import stamp_continuation
from nemo_gym.token_id_capture.protocols import (
    CaptureLedger,
    LineageMatch,
    LineageResolution,
    LineageResolver,
    TokenSink,
)
from nemo_gym.token_id_capture.records import (
    UNRESOLVED_PARENT_REASON,
    ParentResolutionStatus,
    TokenEntry,
    extract_token_fields,
    response_to_output_items,
    stamp_lineage,
    strip_token_fields,
)

if TYPE_CHECKING:
    from nemo_gym.token_id_capture.staging.records import CaptureAdmission

logger = logging.getLogger(__name__)

NG_CAPTURE_FIELD = "ng_capture"
"""Engine-bound request field carrying the typed ``CaptureAdmission`` to a framework inference worker."""
NG_COMMIT_COORDS_FIELD = "ng_commit_coords"
"""Response field carrying the worker's token-free ``CommitCoords`` back."""

_NOT_ATTEMPTED = LineageResolution(ParentResolutionStatus.UNRESOLVED, reason="not_attempted")


@dataclass
class CaptureContext:
    """One in-flight captured call: who it belongs to, where its record goes, and what was decided about it."""

    rollout_id: str
    model_call_id: str
    token_sink: TokenSink | None
    """None: another process (a framework worker) stages the tokens; the context still names the call."""
    lineage_store: LineageResolver | CaptureLedger | None = None
    model: str = ""
    committed: bool = False
    delta_records: bool = False
    prefix_requested: bool = False
    """The model server asked the engine to reuse the parent's exact tokens (intent only)."""
    prefix_supplied: bool = False
    """The engine's prompt ids proved that it did."""
    parent_resolution: LineageResolution | None = None
    external_staging: bool = False
    admitted_at: float | None = None
    capture_admission: CaptureAdmission | None = None
    parent_staging_chain: list[str] = field(default_factory=list)
    parent_chain_hash: str = ""
    request_items: list[dict[str, Any]] | None = None
    external_commit_coords: dict[str, Any] | None = None
    external_worker_response_seen: bool = False
    answer_captured: bool = False
    """``capture_tokens`` already ran on this call's answer (the route's), so no later layer runs it again."""

    def _parent(self) -> LineageMatch | None:
        return None if self.parent_resolution is None else self.parent_resolution.match

    @property
    def parent_call_id(self) -> str | None:
        """The proven parent's call id (None for a root or an unresolved request)."""
        parent = self._parent()
        return None if parent is None else parent.model_call_id

    @property
    def parent_tokens(self) -> list[int]:
        """The proven parent's full token sequence, what prefix supply hands the engine ([] when there is none)."""
        parent = self._parent()
        return [] if parent is None else [*parent.cumulative_token_ids]


_CONTEXT: ContextVar[CaptureContext | None] = ContextVar("nemo_gym_token_capture_context", default=None)
_health: dict[str, int] = {"root": 0, "resolved": 0, "unresolved": 0, "capture_failures": 0}


def set_token_sink(context: CaptureContext) -> Token[CaptureContext | None]:
    """Make ``context`` the current call's; pass the returned token to ``reset_token_sink`` when the call ends."""
    return _CONTEXT.set(context)


def reset_token_sink(token: Token[CaptureContext | None]) -> None:
    _CONTEXT.reset(token)


def current_capture_context() -> CaptureContext | None:
    """The capture of the call being served, or None for traffic that is not captured."""
    return _CONTEXT.get()


def capture_health_snapshot() -> dict[str, Any]:
    """Counts of parent decisions and capture failures in this process, for metrics."""
    counts = dict(_health)
    return {"resolutions": {key: counts.pop(key) for key in ("root", "resolved", "unresolved")}, **counts}


def mark_external_staging_committed(*, rollout_id: str, model_call_id: str) -> None:
    """The worker acknowledged this call; an acknowledgement for another call is refused, not applied."""
    context = _CONTEXT.get()
    if context is None:
        raise RuntimeError("no training-token capture is active")
    if (context.rollout_id, context.model_call_id) != (rollout_id, model_call_id):
        raise ValueError(
            f"acknowledgement for {rollout_id}/{model_call_id} does not match the active capture "
            f"{context.rollout_id}/{context.model_call_id}"
        )
    context.committed = True


async def _decide(context: CaptureContext, items: list[dict[str, Any]]) -> LineageResolution:
    if not assistant_fingerprint(items):
        return LineageResolution(ParentResolutionStatus.ROOT)
    if context.lineage_store is None:
        return LineageResolution(ParentResolutionStatus.UNRESOLVED, reason="resolver_unavailable")
    return await context.lineage_store.resolve(context.rollout_id, items)


async def resolve_parent(request_messages: list[Any] | None) -> None:
    """Decide, once and before dispatch, which recorded call this request continues (no-op without a context).

    With external staging the decision also admits the call: a proven parent gives a ``token_in`` admission, a request
    continuing nothing (or the first of a rollout with no ledger rows yet) a ``text`` root; anything else is recorded as
    a failure and the call runs unadmitted, since starting a new root there would train earlier generations as prompt.
    """
    context = _CONTEXT.get()
    if context is None or request_messages is None:
        return
    items = list(request_messages)
    context.request_items = items
    try:
        context.parent_resolution = await _decide(context, items)
    except Exception as error:
        if context.external_staging:
            raise RuntimeError(f"lineage resolution failed for rollout {context.rollout_id}") from error
        logger.warning("parent resolution failed for rollout %s", context.rollout_id, exc_info=True)
        context.parent_resolution = LineageResolution(ParentResolutionStatus.UNRESOLVED, reason="lookup_error")
    resolution = context.parent_resolution
    _health[resolution.status.value] += 1
    if resolution.match is not None:
        context.parent_staging_chain = list(resolution.match.staging_chain)
        context.parent_chain_hash = resolution.match.chain_hash
    if context.external_staging and context.capture_admission is None and context.lineage_store is not None:
        await _admit(context, resolution)


async def _admit(context: CaptureContext, resolution: LineageResolution) -> None:
    from nemo_gym.token_id_capture.staging.records import CaptureAdmission

    ledger = context.lineage_store
    if not isinstance(ledger, CaptureLedger):
        raise RuntimeError("external staging needs a CaptureLedger as the context's lineage store")
    rollout_id, model_call_id = context.rollout_id, context.model_call_id
    match = resolution.match
    try:
        if match is not None:
            context.capture_admission = CaptureAdmission(
                rollout_id=rollout_id,
                model_call_id=model_call_id,
                mode="token_in",
                parent_call_id=match.model_call_id,
                prev_len=match.prev_len,
                staging_chain=list(match.staging_chain),
                required_prefix_token_ids=[] if match.staging_chain else list(match.cumulative_token_ids),
                parent_chain_hash=match.chain_hash or None,
            )
            return
        if resolution.status == ParentResolutionStatus.ROOT or not await ledger.has_rows(context.rollout_id):
            context.capture_admission = CaptureAdmission(
                rollout_id=rollout_id, model_call_id=model_call_id, mode="text"
            )
            return
    except ValueError:
        logger.warning("call %s of rollout %s cannot be admitted", context.model_call_id, context.rollout_id)
    await ledger.record_failure(context.rollout_id, context.model_call_id, UNRESOLVED_PARENT_REASON)


async def register_call_intent() -> None:
    """Tell a sink that supports it (``begin_call``) that this call is about to be generated."""
    context = _CONTEXT.get()
    begin = getattr(context.token_sink, "begin_call", None) if context is not None else None
    if context is not None and begin is not None:
        await begin(context.rollout_id, context.model_call_id)


def _payload(response: Any) -> dict[str, Any] | None:
    if hasattr(response, "model_dump"):
        dumped = response.model_dump(mode="json")
        return dumped if isinstance(dumped, dict) else None
    return response if isinstance(response, dict) else None


async def capture_tokens(response: Any, request_messages: list[Any] | None = None) -> None:
    """Record the finished answer's tokens for the current call (a pydantic model or its JSON dict).

    No token ids on an answer this process should capture is a hole in the chain, not traffic to skip: the rollout
    is marked incomplete. Calls a framework worker stages (external staging) are left to that worker.
    """
    context = _CONTEXT.get()
    if context is None or context.external_staging:
        return
    context.answer_captured = True
    try:
        payload = _payload(response)
        tokens = None if payload is None else extract_token_fields(payload)
        if payload is None or tokens is None:
            unusable = f"a {type(response).__name__}" if payload is None else "without token ids"
            await _missing(context, f"the answer is {unusable}")
            return
        items, token_item_index = strip_token_fields(response_to_output_items(payload))
        if context.parent_resolution is None and request_messages is not None:
            await resolve_parent(request_messages)
        # The served payload's own id is recorded as is (never minted), so it matches what the client saw.
        served_id = str(payload.get("id") or "") or None
        columns = {name: tokens[name] for name in _ENTRY_TOKEN_COLUMNS}
        entry = TokenEntry(
            **columns,
            output_items=items,
            token_item_index=token_item_index,
            model=context.model or str(payload.get("model") or ""),
            response_id=served_id,
            rollout_id=context.rollout_id,
            model_call_id=context.model_call_id,
            prefix_supplied=context.prefix_supplied,
            prefix_requested=context.prefix_requested,
            created_at=time.time(),
        )
        if request_messages is not None:
            stamp_continuation(entry, list(request_messages))
    except Exception:
        await _failed(context, "build")
        return
    await commit_entry(entry, parent_resolution=context.parent_resolution)


_ENTRY_TOKEN_COLUMNS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts")


async def commit_entry(entry: TokenEntry, *, parent_resolution: LineageResolution | None = None) -> None:
    """Stamp the parent decision on a finished entry and write it to the current call's sink (never raises).

    Engine-side capture that already holds the arrays calls this directly (after ``stamp_continuation``, or the
    entry can never be found as a parent). With ``delta_records`` a resolved entry keeps only the prompt tokens after
    its parent's sequence, when its prompt provably starts with them.
    """
    context = _CONTEXT.get()
    if context is None:
        return
    if (entry.rollout_id, entry.model_call_id) != (context.rollout_id, context.model_call_id):
        logger.warning("a token entry for another call reached the capture of %s", context.model_call_id)
        await _mark_incomplete(context)
        return
    if context.token_sink is None:
        context.committed = True
        return
    try:
        resolution = parent_resolution or context.parent_resolution or _NOT_ATTEMPTED
        parent = resolution.match
        cumulative = None
        parent_tokens = list(parent.cumulative_token_ids) if parent is not None else []
        prompt = list(entry.prompt_token_ids)
        if (
            context.delta_records
            and not entry.prompt_is_delta
            and parent_tokens
            and prompt[: len(parent_tokens)] == (parent_tokens)
        ):
            cumulative = [*prompt, *entry.generation_token_ids]
            entry.prompt_token_ids = prompt[len(parent_tokens) :]
            entry.prompt_is_delta = True
        stamp_lineage(
            entry,
            parent.model_call_id if parent is not None else None,
            parent_resolution=resolution.status,
            cumulative=cumulative,
        )
        entry.parent_resolution_reason = resolution.reason
        await context.token_sink.put(entry)
        context.committed = True
    except Exception:
        await _failed(context, "write")


async def _failed(context: CaptureContext, stage: str) -> None:
    _health["capture_failures"] += 1
    where = f"call {context.model_call_id} (rollout {context.rollout_id})"
    logger.warning("training-token capture could not %s the record of %s", stage, where, exc_info=True)
    await _mark_incomplete(context)


async def _missing(context: CaptureContext, why: str) -> None:
    """A call this process should have recorded produced nothing; already committed or sink-less calls are fine."""
    if context.committed or context.token_sink is None:
        return
    logger.warning("no token ids for call %s of rollout %s: %s", context.model_call_id, context.rollout_id, why)
    await _mark_incomplete(context)


async def _mark_incomplete(context: CaptureContext) -> None:
    mark = getattr(context.token_sink, "mark_incomplete", None)
    if mark is None:
        logger.error(
            "the sink of rollout %s cannot mark it incomplete; a lost call may go unnoticed", context.rollout_id
        )
        return
    try:
        await mark(context.rollout_id, context.model_call_id)
    except Exception:
        logger.warning("could not mark rollout %s incomplete", context.rollout_id, exc_info=True)
