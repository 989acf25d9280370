"""Worker-side capture: turn an admitted call's finished generation into one staged delta, stage it, then
acknowledge it with token-free ``CommitCoords``.

Why the order: a call becomes a parent (resolvable by the next request) only once its coordinates reach the model
server, and the worker returns them only after ``StagingSink.stage`` succeeded, so no child can be admitted on top of
tokens that are not durable. A staging or extraction failure never fails the completion: it returns
``capture_failed`` coordinates, which poison the rollout. Lifecycle misuse (completing twice, a prefix that
contradicts the admission) is a caller bug and raises ``CaptureError``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_gym.token_id_capture.staging.digest import (
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    build_staging_delta,
    compute_chain_hash,
    compute_extras_digest,
    compute_staging_digest,
    hash_token_ids,
)
from nemo_gym.token_id_capture.staging.protocols import CaptureAdapter, StagingSink, WeightVersionProvider
from nemo_gym.token_id_capture.staging.records import CaptureAdmission, CommitCoords, StagedCallRecord, StageResult

logger = logging.getLogger(__name__)


class CaptureError(Exception):
    """The capture lifecycle was used wrongly by its caller."""


class StreamingUnsupportedError(CaptureError):
    """Staging takes complete answers only."""


@dataclass
class ActiveCall:
    """An admitted call: its admission, the policy version it runs under, and the exact prefix its prompt must have."""

    @property
    def model_call_id(self) -> str:
        """Shortcut to the admitted call's id."""
        return self.admission.model_call_id

    @property
    def rollout_id(self) -> str:
        """Shortcut to the id of the rollout the call belongs to."""
        return self.admission.rollout_id

    admission: CaptureAdmission
    weight_version: int
    prefix_token_ids: list[int] = field(default_factory=list)
    completed: bool = field(default=False, init=False)


class RolloutTokenCapture:
    """Builds, stages and acknowledges exact per-call token deltas on an inference worker."""

    def __init__(
        self, *, sink: StagingSink, weight_version_fn: WeightVersionProvider, adapter: CaptureAdapter | None = None
    ) -> None:
        self._sink = sink
        self._weight_version_fn = weight_version_fn
        self._adapter = adapter
        self._completion_lock = threading.Lock()  # only the completed flag; stages of different calls may overlap

    def begin_call(
        self,
        admission: CaptureAdmission,
        *,
        prefix_token_ids: list[int] | None = None,
        stream: bool = False,
        weight_version: int | None = None,
    ) -> ActiveCall:
        """Admit a call; ``prefix_token_ids`` is required when the admission names its prefix by ``staging_chain``."""
        if not isinstance(admission, CaptureAdmission):
            raise TypeError("admission must be a CaptureAdmission")
        where = f"call {admission.model_call_id} of rollout {admission.rollout_id}"
        if stream:
            raise StreamingUnsupportedError(f"{where}: staging does not take streamed answers")
        prefix = _resolved_prefix(admission, prefix_token_ids, where)
        version = self._weight_version_fn() if weight_version is None else weight_version
        if type(version) is not int or version < 0:
            raise CaptureError(f"{where}: weight_version must be a non-negative int, got {version!r}")
        return ActiveCall(admission=admission, weight_version=version, prefix_token_ids=prefix)

    def complete_call(
        self,
        call: ActiveCall,
        *,
        prompt_token_ids: list[int],
        generated_token_ids: list[int],
        generated_logprobs: list[float],
        extras: dict[str, Any] | None = None,
        attachments: Mapping[str, Any] | None = None,
    ) -> CommitCoords:
        """Stage the call's delta, then return its coordinates (``capture_failed`` ones if anything went wrong)."""
        self._claim(call)
        try:
            record = _staged_record(call, prompt_token_ids, generated_token_ids, generated_logprobs, extras)
        except (TypeError, ValueError, OverflowError):
            logger.exception("cannot build the staged delta of call %s of %s", call.model_call_id, call.rollout_id)
            return _failed(call)
        try:
            # ``attachments`` is passed only when given, so a text-only sink without the keyword still works.
            result = (
                self._sink.stage(record) if attachments is None else self._sink.stage(record, attachments=attachments)
            )
            if not isinstance(result, StageResult):
                raise TypeError(f"StagingSink.stage returned {type(result).__name__}, not a StageResult")
        except Exception:
            logger.exception("staging failed for call %s of rollout %s", call.model_call_id, call.rollout_id)
            return _failed(call)
        if not result.ok:
            logger.warning(
                "the staging sink refused call %s of %s: %s", call.model_call_id, call.rollout_id, result.error
            )
            return _failed(call)
        staged = record.model_dump(include=_ACKNOWLEDGED_RECORD_FIELDS)
        return _coords(call, staging_key=result.staging_key, **staged)

    def complete_call_from_response(
        self, call: ActiveCall, response_payload: Any, *, attachments: Mapping[str, Any] | None = None
    ) -> CommitCoords:
        """Read ids, log-probs and extras with the adapter, then ``complete_call``; unreadable answers fail the capture."""
        adapter = self._adapter
        if adapter is None:
            raise CaptureError("complete_call_from_response needs a CaptureAdapter")
        material: dict[str, Any] = {}
        try:
            material["generated_token_ids"], material["generated_logprobs"] = adapter.extract_generation(
                response_payload
            )
            material["prompt_token_ids"] = adapter.extract_prompt_ids(response_payload)
            material["extras"] = adapter.extract_extras(response_payload)
        except Exception:
            # An engine's own exception types surface here; they poison this call, never the completion.
            logger.exception("cannot read the tokens of call %s of rollout %s", call.model_call_id, call.rollout_id)
            self._claim(call)
            return _failed(call)
        return self.complete_call(call, attachments=attachments, **material)

    def fail_call(self, call: ActiveCall, *, reason: str) -> CommitCoords:
        """Give up on an admitted call before it was staged."""
        self._claim(call)
        logger.warning("capture of call %s of rollout %s failed: %s", call.model_call_id, call.rollout_id, reason)
        return _failed(call)

    @property
    def adapter(self) -> CaptureAdapter | None:
        """The engine adapter used by ``complete_call_from_response`` (``None`` when not given)."""
        return self._adapter

    def _claim(self, call: ActiveCall) -> None:
        with self._completion_lock:
            if call.completed:
                raise CaptureError(f"call {call.model_call_id} of rollout {call.rollout_id} was already completed")
            call.completed = True


def _resolved_prefix(admission: CaptureAdmission, given: list[int] | None, where: str) -> list[int]:
    """The prefix the call's prompt must start with: the caller's ids, else the admission's inline ones."""
    well_formed = given is None or (
        isinstance(given, list) and all(type(token) is int and token >= 0 for token in given)
    )
    if not well_formed:
        raise CaptureError(f"{where}: prefix_token_ids must be a list of non-negative ints")
    inline = list(admission.required_prefix_token_ids)
    if admission.mode == "text":
        problem = "a text root takes no prefix" if given else None
    elif given is None:
        problem = None if inline else "a staging_chain admission needs the caller's resolved prefix_token_ids"
    elif len(given) != admission.prev_len or (inline and inline != given):
        problem = f"prefix_token_ids disagree with the admission (prev_len {admission.prev_len})"
    else:
        problem = None
    if problem is not None:
        raise CaptureError(f"{where}: {problem}")
    if admission.mode == "text":
        return []
    return inline if given is None else list(given)


def _staged_record(
    call: ActiveCall, prompt: list[int], generated: list[int], log_probs: list[float], extras: dict[str, Any] | None
) -> StagedCallRecord:
    admission = call.admission
    if admission.mode == "token_in" and prompt[: admission.prev_len] != call.prefix_token_ids:
        raise ValueError("the engine's prompt does not start with the admitted prefix")
    ids, mask, delta_log_probs = build_staging_delta(
        prompt_token_ids=prompt,
        generated_token_ids=generated,
        generated_log_probs=log_probs,
        prev_len=admission.prev_len,
    )
    fields: dict[str, Any] = {
        "schema_version": admission.schema_version,
        "digest_version": STAGING_DIGEST_VERSION,
        "extras_digest_version": EXTRAS_DIGEST_VERSION,
        "rollout_id": admission.rollout_id,
        "model_call_id": admission.model_call_id,
        "parent_call_id": admission.parent_call_id,
        "mode": admission.mode,
        "prev_len": admission.prev_len,
        "delta_len": len(ids),
        "cum_len": admission.prev_len + len(ids),
        "weight_version": call.weight_version,
        "token_ids_delta": ids,
        "token_mask_delta": mask,
        "generation_log_probs_delta": delta_log_probs,
        "extras_digest": compute_extras_digest(extras),
        "chain_hash": compute_chain_hash(admission.parent_chain_hash, ids),
        "cumulative_hash": hash_token_ids([*prompt, *generated]),
    }
    return StagedCallRecord(**fields, digest=compute_staging_digest(**fields), extras=extras)


# What a successful acknowledgement copies from the staged record (identity and lengths come from the admission).
_ACKNOWLEDGED_RECORD_FIELDS = {"delta_len", "cum_len", "digest", "extras_digest", "chain_hash", "cumulative_hash"}
_ADMISSION_IDENTITY_FIELDS = {"rollout_id", "model_call_id", "parent_call_id", "prev_len"}


def _coords(call: ActiveCall, **outcome: Any) -> CommitCoords:
    """Coordinates naming the admitted call, completed by ``outcome`` (lengths, digests, disposition)."""
    identity = call.admission.model_dump(include=_ADMISSION_IDENTITY_FIELDS)
    return CommitCoords(**identity, weight_version=call.weight_version, **outcome)


def _failed(call: ActiveCall) -> CommitCoords:
    """A ``capture_failed`` acknowledgement: no delta, so the cumulative length stays at the prefix."""
    return _coords(call, delta_len=0, cum_len=call.admission.prev_len, disposition="capture_failed")


def install_capture(
    serving_layer: Any,
    *,
    sink: StagingSink,
    weight_version_fn: WeightVersionProvider,
    adapter: CaptureAdapter | None = None,
) -> RolloutTokenCapture:
    """Build a ``RolloutTokenCapture`` and hand it to ``serving_layer.install_token_capture``."""
    install = getattr(serving_layer, "install_token_capture", None)
    refusals = (
        (isinstance(sink, StagingSink), f"{type(sink).__name__} is not a StagingSink"),
        (callable(weight_version_fn), "weight_version_fn must be callable"),
        (callable(install), f"{type(serving_layer).__name__} has no install_token_capture(capture)"),
    )
    for acceptable, message in refusals:
        if not acceptable:
            raise TypeError(message)
    capture = RolloutTokenCapture(sink=sink, weight_version_fn=weight_version_fn, adapter=adapter)
    serving_layer.install_token_capture(capture)
    return capture


class CaptureHost:
    """The smallest serving layer ``install_capture`` accepts: it just holds the capture."""

    token_capture: RolloutTokenCapture | None = None

    def install_token_capture(self, capture: RolloutTokenCapture) -> None:
        """Keep ``capture`` as this host's ``token_capture``."""
        self.token_capture = capture
