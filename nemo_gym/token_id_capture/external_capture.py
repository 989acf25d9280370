"""External staging on the model server's side: tell the inference worker to stage an admitted call, take its
acknowledgement off the answer, and publish the call to the rollout's ledger once the served answer is final.

Why in three steps: the admission must ride the engine request (``prepare_request``); the worker's coordinates and
any token data must leave the answer before it is converted for the agent (``prepare_response``, for every answer
the worker returned); and the ledger row is keyed by the answer the client actually receives (its id and
fingerprints), so it is written last (``finalize_response``). Bad coordinates poison the call; they never turn a good
completion into a failed request. Backends differ only in how the admission travels.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

from nemo_gym.token_id_capture.config import ExternalStagingBackend
from nemo_gym.token_id_capture.fingerprint import FINGERPRINT_VERSION, assistant_fingerprint
from nemo_gym.token_id_capture.protocols import CaptureLedger
from nemo_gym.token_id_capture.records import TOKEN_FIELDS, response_to_output_items, strip_token_fields
from nemo_gym.token_id_capture.sink import (
    NG_CAPTURE_FIELD,
    NG_COMMIT_COORDS_FIELD,
    CaptureContext,
    current_capture_context,
    mark_external_staging_committed,
)
from nemo_gym.token_id_capture.staging.records import (
    INVALID_COMMIT_COORDS_REASON,
    WORKER_CAPTURE_FAILED_REASON,
    WORKER_MISSING_COMMIT_COORDS_REASON,
    CallRecord,
    CaptureAdmission,
    CaptureLedgerCommit,
    CommitCoords,
)

logger = logging.getLogger(__name__)


@runtime_checkable
class ExternalCaptureHandler(Protocol):
    """One backend's part of an externally staged call (see the module docstring for the order)."""

    def prepare_request(self, request_payload: dict[str, Any]) -> dict[str, Any]: ...

    def prepare_response(self, response_payload: dict[str, Any]) -> None:
        """Call for every completion the worker returned, even one without coordinates (that one then fails closed).
        Completions the model server makes up itself (a context-overflow stand-in) never pass here."""
        ...

    async def finalize_response(self, served_payload: dict[str, Any]) -> None: ...


_PRIVATE_TOP = {NG_COMMIT_COORDS_FIELD, "prompt_token_ids"}
_PRIVATE_CHOICE = {"logprobs", "token_ids"}
_PRIVATE_MESSAGE = {*TOKEN_FIELDS, "compact_prompt_token_ids"}


def _scrub(payload: dict[str, Any]) -> None:
    """Token ids, log-probs and coordinates stay between worker and model server, never reach the agent."""
    for key in _PRIVATE_TOP & payload.keys():
        del payload[key]
    choices = [choice for choice in payload.get("choices") or [] if isinstance(choice, dict)]
    for choice in choices:
        for key in _PRIVATE_CHOICE & choice.keys():
            del choice[key]
        message = choice.get("message")
        if isinstance(message, dict):
            for key in _PRIVATE_MESSAGE & message.keys():
                del message[key]


def _fingerprints(
    request_items: list[dict[str, Any]], answer_items: list[dict[str, Any]]
) -> tuple[str | None, str | None]:
    """(output, request + output) fingerprints; content that cannot be hashed abstains instead of failing."""
    try:
        return assistant_fingerprint(answer_items) or None, assistant_fingerprint(
            [*request_items, *answer_items]
        ) or None
    except (TypeError, ValueError):
        return None, None


class _WorkerCaptureHandler:
    """The steps every backend shares; subclasses only attach the admission to the engine request."""

    backend = "worker"

    def _attach(self, request_payload: dict[str, Any], admission: CaptureAdmission) -> dict[str, Any]:
        raise NotImplementedError

    def prepare_request(self, request_payload: dict[str, Any]) -> dict[str, Any]:
        """Admitted calls get their admission; an unadmitted one (already poisoned) goes out as plain traffic."""
        context = current_capture_context()
        if context is None or not context.external_staging:
            return request_payload
        if request_payload.get("stream"):
            raise ValueError("external staging needs non-streaming engine requests")
        request_payload["stream"] = False
        request_payload.pop("stream_options", None)
        if context.capture_admission is None:
            return request_payload
        return self._attach(request_payload, context.capture_admission)

    def prepare_response(self, response_payload: dict[str, Any]) -> None:
        context = current_capture_context()
        if context is None or not context.external_staging:
            return
        context.external_commit_coords = response_payload.pop(NG_COMMIT_COORDS_FIELD, None)
        context.external_worker_response_seen = True
        _scrub(response_payload)

    async def finalize_response(self, served_payload: dict[str, Any]) -> None:
        context = current_capture_context()
        if context is None or not context.external_staging or context.lineage_store is None:
            return
        ledger = context.lineage_store
        if not isinstance(ledger, CaptureLedger):
            raise ValueError("external staging needs a CaptureLedger as the context's lineage store")
        admission = context.capture_admission
        if admission is None or not context.external_worker_response_seen:
            return  # unadmitted (already poisoned), or no worker answer: the middleware records the uncommitted call
        try:
            await self._commit(served_payload, context, ledger, admission)
        except Exception:
            logger.exception(
                "%s acknowledgement failed for call %s of %s", self.backend, context.model_call_id, context.rollout_id
            )
            try:
                await ledger.record_failure(context.rollout_id, context.model_call_id, INVALID_COMMIT_COORDS_REASON)
            except Exception:
                logger.exception("could not poison call %s of rollout %s", context.model_call_id, context.rollout_id)

    async def _commit(
        self, served: dict[str, Any], context: CaptureContext, ledger: CaptureLedger, admission: CaptureAdmission
    ) -> None:
        """Check the coordinates against the admission, then publish the ledger row (the call becomes a parent)."""
        raw = context.external_commit_coords
        if raw is None:
            await ledger.record_failure(context.rollout_id, context.model_call_id, WORKER_MISSING_COMMIT_COORDS_REASON)
            return
        coords = CommitCoords.model_validate(raw)
        if (coords.rollout_id, coords.model_call_id) != (context.rollout_id, context.model_call_id):
            raise ValueError(f"coordinates of {coords.rollout_id}/{coords.model_call_id} reached another call")
        if coords.disposition == "capture_failed":
            await ledger.record_failure(context.rollout_id, context.model_call_id, WORKER_CAPTURE_FAILED_REASON)
            return
        if (coords.parent_call_id, coords.prev_len) != (admission.parent_call_id, admission.prev_len):
            raise ValueError(f"coordinates of {coords.model_call_id} do not match its admission")
        response_id = str(served.get("id") or "")
        if not response_id:
            raise ValueError(f"the answer served for {coords.model_call_id} has no id")
        answer_items, _ = strip_token_fields(response_to_output_items(served))
        request_items = list(context.request_items or [])
        output_fingerprint, continuation_fingerprint = _fingerprints(request_items, answer_items)
        record = CallRecord(
            model_call_id=coords.model_call_id,
            parent_call_id=coords.parent_call_id,
            prev_len=coords.prev_len,
            delta_len=coords.delta_len,
            cum_len=coords.cum_len,
            weight_version=coords.weight_version,
            digest=coords.digest or "",
            extras_digest=coords.extras_digest or "",
            staging_key=coords.staging_key or "",
            mode=admission.mode,
            admitted_at=context.admitted_at,
            chain_hash=coords.chain_hash or "",
            cumulative_hash=coords.cumulative_hash or "",
            response_id=response_id,
            output_fingerprint=output_fingerprint,
            continuation_fingerprint=continuation_fingerprint,
            fingerprint_version=FINGERPRINT_VERSION,
        )
        await ledger.record(
            CaptureLedgerCommit(
                rollout_id=context.rollout_id,
                record=record,
                staging_chain=(*context.parent_staging_chain, record.staging_key),
                request_items=request_items,
                response_items=answer_items,
            )
        )
        mark_external_staging_committed(rollout_id=coords.rollout_id, model_call_id=coords.model_call_id)


class VLLMWorkerCaptureHandler(_WorkerCaptureHandler):
    """vLLM: the admission rides ``ng_capture``; the worker needs the chosen tokens' ids and log-probs."""

    backend = "vLLM"

    def _attach(self, request_payload: dict[str, Any], admission: CaptureAdmission) -> dict[str, Any]:
        extra: dict[str, Any] = {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True}
        if admission.mode == "token_in":  # empty when the worker reads the prefix from the staging chain
            extra["required_prefix_token_ids"] = [*admission.required_prefix_token_ids]
        return {**request_payload, **extra, NG_CAPTURE_FIELD: admission.model_dump(mode="json")}


class MegatronWorkerCaptureHandler(_WorkerCaptureHandler):
    """Megatron Inference: the admission rides inside ``offload_params``; the worker resolves the prefix itself."""

    backend = "Megatron"

    def _attach(self, request_payload: dict[str, Any], admission: CaptureAdmission) -> dict[str, Any]:
        if request_payload.get("n") not in (None, 1):
            raise ValueError("Megatron token capture needs n=1")
        params = request_payload.get("offload_params") or {}
        if not isinstance(params, dict):
            raise ValueError("offload_params must be an object")
        offload = {**params, NG_CAPTURE_FIELD: admission.model_dump(mode="json")}
        return {**request_payload, "offload_params": offload, "logprobs": True, "top_logprobs": 0}


def make_external_capture_handler(backend: ExternalStagingBackend) -> ExternalCaptureHandler:
    """The handler of the configured ``external_staging_backend``."""
    handlers: dict[str, type[_WorkerCaptureHandler]] = {
        "vllm_worker": VLLMWorkerCaptureHandler,
        "megatron_worker": MegatronWorkerCaptureHandler,
    }
    if backend not in handlers:
        raise ValueError(f"unknown external staging backend {backend!r}")
    return handlers[backend]()
