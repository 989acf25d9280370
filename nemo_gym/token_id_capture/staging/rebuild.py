"""Check fetched staged records against a rollout's receipt, then lay the terminal call's chain out as one row.

Why distrust the fetch: records come back from framework storage, so each is matched field by field against its
ledger row, its digest is recomputed, the ledger graph is checked (parents present, lengths joined, no cycle), each
delta must extend its parent's chain hash and the terminal's cumulative hash must cover the whole row. Extras are
never read: the row lists their committed digests for the consumer to check at the point of use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from nemo_gym.token_id_capture.staging.digest import (
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
    compute_chain_hash,
    compute_staging_digest,
    hash_token_ids,
)
from nemo_gym.token_id_capture.staging.records import CallRecord, RolloutReceipt, StagedCallBaseSnapshot

_COMPARED = (
    "model_call_id",
    "parent_call_id",
    "mode",
    "prev_len",
    "delta_len",
    "cum_len",
    "weight_version",
    "digest",
    "extras_digest",
    "chain_hash",
    "cumulative_hash",
    "schema_version",
    "digest_version",
    "extras_digest_version",
)


class ReceiptVerificationError(ValueError):
    """A receipt or a staged record broke a custody rule; ``code`` names which."""

    code: str

    def __init__(self, code: str, detail: str) -> None:
        self.code, message = code, f"{code}: {detail}"
        super().__init__(message)


class RebuildError(ReceiptVerificationError):
    """The verified rows cannot form the terminal call's ancestry."""


@dataclass(frozen=True)
class WeightVersionSpan:
    """The policy version of the tokens ``[start, end)`` that one call added to the row."""

    model_call_id: str
    start: int
    end: int
    weight_version: int


@dataclass(frozen=True)
class ExtrasCommitment:
    """What one selected call's extras must hash to (a promise to check, not a proof they were fetched)."""

    model_call_id: str
    extras_digest_version: int
    extras_digest: str


@dataclass(frozen=True)
class LinearizedRow:
    """The verified root-to-terminal token row: ids, loss mask (1 = policy-generated), log-probs, per-call spans."""

    @property
    def call_ids(self) -> list[str]:
        """Another name for ``model_call_ids``, kept for consumers that read it."""
        return self.model_call_ids

    rollout_id: str
    token_ids: list[int]
    token_mask: list[float]
    logprobs: list[float]
    model_call_ids: list[str]
    prompt_len: int
    weight_versions: list[int]
    weight_version_spans: list[WeightVersionSpan]
    link_spans: list[tuple[str, int, int]] = field(default_factory=list)
    """Per call: (id, carried prompt tokens, generated tokens)."""
    extras_commitments: list[ExtrasCommitment] = field(default_factory=list)


def _check_receipt(receipt: RolloutReceipt) -> dict[str, CallRecord]:
    versions = (receipt.schema_version, receipt.digest_version, receipt.extras_digest_version)
    # Checked in this order; the first that holds is the error reported.
    refusals = (
        (
            versions != (STAGING_SCHEMA_VERSION, STAGING_DIGEST_VERSION, EXTRAS_DIGEST_VERSION),
            "unsupported_version",
            f"receipt versions {versions}",
        ),
        (receipt.failure_reason is not None, "rollout_failed", str(receipt.failure_reason)),
        (receipt.capture_poisoned, "capture_poisoned", "the receipt marks the capture as poisoned"),
        (not receipt.manifest, "empty_manifest", "the receipt lists no committed call"),
    )
    for refused, code, detail in refusals:
        if refused:
            raise ReceiptVerificationError(code, detail)
    rows: dict[str, CallRecord] = {}
    keys: set[str] = set()
    for row in receipt.manifest:
        if row.model_call_id in rows or row.staging_key in keys:
            raise ReceiptVerificationError("duplicate_manifest_row", f"call {row.model_call_id} or its key repeats")
        rows[row.model_call_id] = row
        keys.add(row.staging_key)
    return rows


def _check_snapshot(receipt: RolloutReceipt, row: CallRecord, snapshot: StagedCallBaseSnapshot) -> None:
    if not isinstance(snapshot, StagedCallBaseSnapshot):
        raise TypeError("snapshots must be StagedCallBaseSnapshot values")
    if snapshot.model_call_id != row.model_call_id:
        raise ReceiptVerificationError(
            "snapshot_order_mismatch", f"{row.staging_key} returned call {snapshot.model_call_id}"
        )
    if snapshot.rollout_id != receipt.rollout_id:
        raise ReceiptVerificationError("wrong_rollout", f"call {row.model_call_id} belongs to {snapshot.rollout_id}")
    for name in _COMPARED:
        if getattr(snapshot, name) != getattr(row, name):
            raise ReceiptVerificationError(f"wrong_{name}", f"call {row.model_call_id} disagrees with its ledger row")
    fields = snapshot.model_dump(exclude={"digest"})
    try:
        digest = compute_staging_digest(**fields)
    except (TypeError, ValueError, OverflowError) as error:
        raise ReceiptVerificationError("invalid_snapshot", f"call {row.model_call_id}: {error}") from error
    if digest != snapshot.digest:
        raise ReceiptVerificationError("corrupt_digest", f"call {row.model_call_id} does not hash to its digest")


def _ancestry(receipt: RolloutReceipt, rows: dict[str, CallRecord]) -> list[CallRecord]:
    """Every row's parents are present and joined by length, there is no cycle; the terminal's chain, root first."""
    for row in rows.values():
        seen: set[str] = set()
        current: CallRecord | None = row
        while current is not None:
            if current.model_call_id in seen:
                raise RebuildError("lineage_cycle", f"the parents of {row.model_call_id} loop")
            seen.add(current.model_call_id)
            parent_id = current.parent_call_id
            if parent_id is None:
                break
            parent = rows.get(parent_id)
            if parent is None:
                raise RebuildError("missing_parent", f"call {current.model_call_id} names absent parent {parent_id}")
            if parent.cum_len != current.prev_len:
                raise RebuildError(
                    "parent_length_mismatch",
                    f"call {current.model_call_id} starts at {current.prev_len}, its parent ends at {parent.cum_len}",
                )
            current = parent
    terminal = rows.get(receipt.terminal_model_call_id or "")
    if terminal is None:
        raise RebuildError("missing_terminal", f"terminal call {receipt.terminal_model_call_id} is not in the manifest")
    chain = [terminal]
    while chain[-1].parent_call_id is not None:
        chain.append(rows[chain[-1].parent_call_id])
    return chain[::-1]


def _generation_start(snapshot: StagedCallBaseSnapshot) -> int:
    """Where the generated tokens begin: a delta is carried prompt (mask 0) then generation (mask 1), nothing else."""
    mask = snapshot.token_mask_delta
    start = next((index for index, bit in enumerate(mask) if bit != 0.0), len(mask))
    if start == len(mask):
        raise RebuildError("empty_generation", f"call {snapshot.model_call_id} generated no token")
    if any(bit != 1.0 for bit in mask[start:]):
        raise RebuildError("invalid_mask_order", f"call {snapshot.model_call_id} mixes prompt into its generation")
    return start


def verify_and_linearize(receipt: RolloutReceipt, snapshots: Sequence[StagedCallBaseSnapshot]) -> LinearizedRow:
    """Verify ``snapshots`` (one per manifest row, in manifest order) and return the terminal chain as one row."""
    if not isinstance(receipt, RolloutReceipt):
        raise TypeError("receipt must be a RolloutReceipt")
    rows = _check_receipt(receipt)
    if len(snapshots) != len(receipt.manifest):
        raise ReceiptVerificationError("row_count_mismatch", f"{len(snapshots)} snapshots, {len(rows)} rows")
    by_id: dict[str, StagedCallBaseSnapshot] = {}
    for row, snapshot in zip(receipt.manifest, snapshots, strict=True):
        _check_snapshot(receipt, row, snapshot)
        by_id[snapshot.model_call_id] = snapshot
    chain = _ancestry(receipt, rows)

    ids: list[int] = []
    mask: list[float] = []
    log_probs: list[float] = []
    spans: list[WeightVersionSpan] = []
    links: list[tuple[str, int, int]] = []
    running: str | None = None
    prompt_len = 0
    for position, row in enumerate(chain):
        snapshot = by_id[row.model_call_id]
        running = compute_chain_hash(running, snapshot.token_ids_delta)
        if running != row.chain_hash:
            raise RebuildError("chain_hash_mismatch", f"call {row.model_call_id} does not extend its parent's chain")
        start = _generation_start(snapshot)
        if position == 0:
            prompt_len = start
        spans.append(WeightVersionSpan(row.model_call_id, len(ids), len(ids) + row.delta_len, row.weight_version))
        links.append((row.model_call_id, start, row.delta_len - start))
        ids += snapshot.token_ids_delta
        mask += snapshot.token_mask_delta
        log_probs += snapshot.generation_log_probs_delta
    if hash_token_ids(ids) != chain[-1].cumulative_hash:
        raise RebuildError("cumulative_hash_mismatch", "the terminal's cumulative hash does not cover the row")
    return LinearizedRow(
        rollout_id=receipt.rollout_id,
        token_ids=ids,
        token_mask=mask,
        logprobs=log_probs,
        model_call_ids=[row.model_call_id for row in chain],
        prompt_len=prompt_len,
        weight_versions=[row.weight_version for row in chain],
        weight_version_spans=spans,
        link_spans=links,
        extras_commitments=[
            ExtrasCommitment(row.model_call_id, row.extras_digest_version, row.extras_digest) for row in chain
        ],
    )


def linearize(
    rollout_id: str,
    snapshots: list[StagedCallBaseSnapshot],
    manifest: list[CallRecord],
    *,
    terminal_hint: str | None = None,
) -> LinearizedRow:
    """``verify_and_linearize`` for a caller that has only the rows and the terminal's id."""
    if terminal_hint is not None:
        declared = RolloutReceipt(
            rollout_id=rollout_id,
            terminal_model_call_id=terminal_hint,
            manifest=manifest,
            terminal_selection="declared",
        )
        return verify_and_linearize(declared, snapshots)
    raise RebuildError("missing_terminal", "no terminal call was named")
