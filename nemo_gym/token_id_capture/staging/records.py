"""Versioned wire records of worker-owned token staging: what the model server admits, what the worker stages and
acknowledges, and the token-free ledger and receipt a trainer verifies against.

Why strict models: these cross process and project boundaries (model server, inference worker, trainer), so every
record refuses unknown fields and checks its own invariants (a root is a text call with no prefix, a child names
its parent and extends exactly its length, lengths add up, a staged record's digest matches its contents).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, model_validator

from nemo_gym.token_id_capture.records import (
    LEDGER_ROW_MISSING_CHAIN_HASH_REASON,
    LEDGER_ROW_MISSING_RESPONSE_ID_REASON,
    UNCOMMITTED_CALL_REASON,
    UNRESOLVED_PARENT_REASON,
)
from nemo_gym.token_id_capture.staging.digest import (
    EMPTY_EXTRAS_DIGEST,
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
    compute_extras_digest,
    compute_staging_digest,
)

__all__ = [
    "INVALID_COMMIT_COORDS_REASON",
    "LEDGER_ROW_MISSING_CHAIN_HASH_REASON",
    "LEDGER_ROW_MISSING_RESPONSE_ID_REASON",
    "UNCOMMITTED_CALL_REASON",
    "UNRESOLVED_PARENT_REASON",
    "WORKER_CAPTURE_FAILED_REASON",
    "WORKER_MISSING_COMMIT_COORDS_REASON",
    "CallRecord",
    "CaptureAdmission",
    "CaptureLedgerCommit",
    "CommitCoords",
    "ManifestFailure",
    "RolloutManifest",
    "RolloutReceipt",
    "StageResult",
    "StagedCallBaseSnapshot",
    "StagedCallRecord",
    "StagedCallSnapshot",
    "staging_key",
]

CaptureDisposition = Literal["staged", "capture_failed"]
CaptureMode = Literal["token_in", "text"]
Identifier = Annotated[StrictStr, Field(min_length=1)]
Count = Annotated[StrictInt, Field(ge=0)]
DigestHex = Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]

WORKER_MISSING_COMMIT_COORDS_REASON = "worker_response_missing_commit_coordinates"
WORKER_CAPTURE_FAILED_REASON = "worker_capture_failed"
INVALID_COMMIT_COORDS_REASON = "invalid_worker_commit_coordinates"

TERMINAL_SELECTED = "selected"
TERMINAL_NO_RECORDS = "no_records"
TERMINAL_DUPLICATE_CALL_ID = "duplicate_call_id"
TERMINAL_ORPHANED_ROW = "orphaned_row"
TERMINAL_NO_ROOT = "no_root"
TERMINAL_AMBIGUOUS = "ambiguous_terminal"


def staging_key(rollout_id: str, model_call_id: str) -> str:
    """The default key a staged call is stored under."""
    if not rollout_id or not model_call_id:
        raise ValueError("rollout_id and model_call_id must be non-empty")
    return f"{rollout_id}/{model_call_id}"


def _refuse_first(*rules: tuple[bool, str]) -> None:
    """Raise ``ValueError`` with the message of the first rule whose condition is broken (``True``)."""
    message = next((text for broken, text in rules if broken), None)
    if message is not None:
        raise ValueError(message)


def _check_lineage(parent_call_id: str | None, mode: str, prev_len: int, what: str) -> None:
    is_root = parent_call_id is None
    _refuse_first(
        (is_root != (prev_len == 0), f"{what}: a root has prev_len 0 and no parent, a child a parent and prev_len > 0"),
        (is_root != (mode == "text"), f"{what}: a root uses text mode, a child token_in mode"),
    )


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    schema_version: Literal[2] = STAGING_SCHEMA_VERSION


class _Digested(_Wire):
    digest_version: Literal[2] = STAGING_DIGEST_VERSION
    extras_digest_version: Literal[1] = EXTRAS_DIGEST_VERSION


class CaptureAdmission(_Wire):
    """The model server's permission for one call to be staged, and the exact prefix its prompt must start with.

    A ``token_in`` child carries its prefix inline (``required_prefix_token_ids``) or as the ``staging_chain`` of
    staged records whose deltas form it; a ``text`` root carries none.
    """

    rollout_id: Identifier
    model_call_id: Identifier
    parent_call_id: Identifier | None = None
    prev_len: Count = 0
    mode: CaptureMode
    required_prefix_token_ids: list[StrictInt] = Field(default_factory=list)
    staging_chain: list[str] = Field(default_factory=list)
    parent_chain_hash: DigestHex | None = None

    @model_validator(mode="after")
    def _prefix_contract(self) -> Self:
        inline = self.required_prefix_token_ids
        carries_prefix = bool(self.parent_call_id or self.prev_len or inline or self.staging_chain)
        is_text = self.mode == "text"
        _refuse_first(
            (min(inline, default=0) < 0, "required_prefix_token_ids must be non-negative"),
            (is_text and carries_prefix, "a text admission is a root: no parent, no prefix"),
            (is_text and self.parent_chain_hash is not None, "a text admission is a root: no parent chain hash"),
            (
                not is_text and (None in (self.parent_call_id, self.parent_chain_hash) or self.prev_len == 0),
                "a token_in admission needs parent_call_id, prev_len > 0 and the parent's chain hash",
            ),
            (
                not is_text and not self.staging_chain and len(inline) != self.prev_len,
                "an inline prefix must be exactly prev_len tokens long",
            ),
        )
        return self


class StagedCallBaseSnapshot(_Digested):
    """A staged call's token columns and metadata, without ``extras`` (checked against ``extras_digest`` instead)."""

    rollout_id: Identifier
    model_call_id: Identifier
    parent_call_id: Identifier | None = None
    mode: CaptureMode
    prev_len: Count
    delta_len: Count
    cum_len: Count
    weight_version: Count
    digest: DigestHex
    token_ids_delta: list[StrictInt]
    token_mask_delta: list[StrictFloat]
    generation_log_probs_delta: list[StrictFloat]
    extras_digest: DigestHex = EMPTY_EXTRAS_DIGEST
    chain_hash: DigestHex
    cumulative_hash: DigestHex

    @property
    def staging_key(self) -> str:
        return staging_key(self.rollout_id, self.model_call_id)

    @model_validator(mode="after")
    def _digest_matches(self) -> Self:
        _check_lineage(self.parent_call_id, self.mode, self.prev_len, "staged call")
        fields = self.model_dump(include=set(_DIGESTED_FIELDS))
        if compute_staging_digest(**fields) != self.digest:
            raise ValueError("the digest does not match the staged call's contents")
        return self


_DIGESTED_FIELDS = (
    "schema_version",
    "digest_version",
    "extras_digest_version",
    "rollout_id",
    "model_call_id",
    "parent_call_id",
    "mode",
    "prev_len",
    "delta_len",
    "cum_len",
    "weight_version",
    "token_ids_delta",
    "token_mask_delta",
    "generation_log_probs_delta",
    "extras_digest",
    "chain_hash",
    "cumulative_hash",
)


class StagedCallRecord(StagedCallBaseSnapshot):
    """What a worker hands its ``StagingSink``: the snapshot plus the optional engine ``extras``."""

    extras: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _extras_match(self) -> Self:
        _refuse_first((compute_extras_digest(self.extras) != self.extras_digest, "extras_digest does not match extras"))
        return self


class StagedCallSnapshot(StagedCallRecord):
    """A staged record as read back from a framework's storage."""


class StageResult(_Wire):
    """A ``StagingSink.stage`` outcome: the key on success, an error otherwise."""

    ok: bool
    staging_key: Identifier | None = None
    error: str | None = None

    @model_validator(mode="after")
    def _one_outcome(self) -> Self:
        missing, message = (
            (self.staging_key is None, "a successful stage names its staging_key")
            if self.ok
            else (not self.error, "a failed stage says why")
        )
        _refuse_first((missing, message))
        return self


class CommitCoords(_Digested):
    """The worker's token-free acknowledgement of one call: staged (with hashes and key) or failed (no delta)."""

    rollout_id: Identifier
    model_call_id: Identifier
    parent_call_id: Identifier | None = None
    prev_len: Count
    delta_len: Count
    cum_len: Count
    weight_version: Count
    disposition: CaptureDisposition = "staged"
    digest: DigestHex | None = None
    extras_digest: DigestHex | None = None
    staging_key: Identifier | None = None
    chain_hash: DigestHex | None = None
    cumulative_hash: DigestHex | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        proofs = [self.digest, self.extras_digest, self.staging_key, self.chain_hash, self.cumulative_hash]
        present = sum(proof is not None for proof in proofs)
        staged = self.disposition == "staged"
        _refuse_first(
            (
                (self.parent_call_id is None) != (self.prev_len == 0),
                "coordinates of a root have prev_len 0, of a child a parent and prev_len > 0",
            ),
            (self.prev_len + self.delta_len != self.cum_len, "cum_len must be prev_len + delta_len"),
            (
                staged and (present < len(proofs) or not self.delta_len),
                "staged coordinates carry a non-empty delta, both digests, both hashes and the key",
            ),
            (not staged and (present > 0 or self.delta_len > 0), "failed coordinates carry no delta, digests or key"),
        )
        return self


class CallRecord(_Digested):
    """One committed call in a rollout's ledger: its place in the chain and its hashes, never its tokens."""

    model_call_id: Identifier
    parent_call_id: Identifier | None = None
    prev_len: Count
    delta_len: Count
    cum_len: Count
    weight_version: Count
    digest: DigestHex
    extras_digest: DigestHex
    staging_key: Identifier
    mode: CaptureMode = "token_in"
    chain_hash: DigestHex
    cumulative_hash: DigestHex
    response_id: Identifier
    """The id of the answer served for this call: terminal attribution joins the scored response on it."""
    admitted_at: StrictFloat | None = None
    output_fingerprint: DigestHex | None = None
    continuation_fingerprint: DigestHex | None = None
    fingerprint_version: Count = 0
    """0: no fingerprints recorded; attribution ignores fingerprints of another version."""

    @model_validator(mode="after")
    def _contiguous(self) -> Self:
        _refuse_first(
            (
                not self.delta_len or self.prev_len + self.delta_len != self.cum_len,
                "a ledger row describes a non-empty delta with cum_len = prev_len + delta_len",
            )
        )
        _check_lineage(self.parent_call_id, self.mode, self.prev_len, "ledger row")
        return self


class CaptureLedgerCommit(_Wire):
    """What ``CaptureLedger.record`` receives: the row, plus the request and answer items used for resolution."""

    rollout_id: Identifier
    record: CallRecord
    staging_chain: tuple[Identifier, ...] = ()
    request_items: list[dict[str, Any]]
    response_items: list[dict[str, Any]]


class ManifestFailure(_Wire):
    model_call_id: Identifier
    reason: Identifier


class RolloutManifest(_Wire):
    """A rollout's ledger: committed rows and failure rows (any failure poisons the rollout)."""

    rollout_id: Identifier
    records: list[CallRecord] = Field(default_factory=list)
    failures: list[ManifestFailure] = Field(default_factory=list)


class RolloutReceipt(_Digested):
    """The framework's immutable summary of a finished rollout: its rows and the terminal call it will train.

    Three states: trainable (not poisoned, terminal and selection method named), poisoned after selection (may still
    name them), or poisoned before any selection ran (no method, a failure reason).
    """

    rollout_id: Identifier
    reward: float | None = None
    terminal_model_call_id: Identifier | None = None
    manifest: list[CallRecord] = Field(default_factory=list)
    capture_poisoned: bool = False
    failure_reason: str | None = None
    terminal_selection: Literal["declared", "response_id", "content", "heuristic"] | None = None
    terminal_attribution_reason: str | None = None

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        ids = [record.model_call_id for record in self.manifest]
        terminal, method = self.terminal_model_call_id, self.terminal_selection
        trainable = not self.capture_poisoned
        _refuse_first(
            (len(ids) > len(set(ids)), "the receipt's manifest repeats a model_call_id"),
            (terminal not in (None, *ids), "terminal_model_call_id is not in the receipt's manifest"),
            (trainable and self.failure_reason is not None, "a receipt that is not poisoned has no failure_reason"),
            (
                trainable and None in (terminal, method),
                "a trainable receipt names its terminal call and how it was selected",
            ),
            (method is None and terminal is not None, "a terminal call needs the method that selected it"),
            (
                method is None and self.failure_reason is None,
                "a receipt where no selection ran is poisoned with a failure_reason",
            ),
        )
        return self
