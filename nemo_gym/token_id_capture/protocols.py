"""The seams a training framework can fill: where records go (``TokenSink``), where they are read back
(``TokenSource``), how a request finds its parent (``LineageResolver``) and, for worker-staged tokens, the per-rollout
ledger (``CaptureLedger``).

Gym's own implementations are the file store (``store.py``) and the lineage stores (``lineage.py``); a framework may
replace either without touching the serving path. The contracts that matter: ``put`` returns only once the record is
durable and visible to every worker's resolver (the next turn may land on another worker); a resolver never guesses,
``UNRESOLVED`` is always a safe answer; a snapshot is retired only by the exact id and version that was consumed.
Nothing here imports a web framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from nemo_gym.token_id_capture.records import ParentResolutionStatus, TokenEntry

if TYPE_CHECKING:
    from nemo_gym.token_id_capture.staging.records import CaptureLedgerCommit


@dataclass(frozen=True)
class TokenCaptureSnapshot:
    """One rollout's records as frozen at one moment; ``snapshot_id`` and ``version`` name that exact state."""

    rollout_id: str
    entries: tuple[TokenEntry, ...]
    incomplete: bool
    snapshot_id: str
    version: int


@dataclass(frozen=True)
class LineageMatch:
    """The single recorded call a request was proven to continue."""

    model_call_id: str
    cumulative_token_ids: tuple[int, ...]
    """Empty for worker-staged ledger rows, whose tokens live in the framework's storage."""
    digest: str
    staging_chain: tuple[str, ...] = ()
    prev_len: int = 0
    chain_hash: str = ""


@dataclass(frozen=True)
class LineageResolution:
    """The parent decision of one request, made once before dispatch and shared by prefix supply and capture."""

    status: ParentResolutionStatus
    match: LineageMatch | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if (self.status == ParentResolutionStatus.RESOLVED) != (self.match is not None):
            raise ValueError("a resolved decision carries exactly one match, and only a resolved one")


@runtime_checkable
class LineageResolver(Protocol):
    """Finds the committed call a request continues; a read-only view of what the sink committed."""

    async def resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> LineageResolution: ...

    def is_process_shared(self) -> bool:
        """Whether separate server processes see each other's commits (required with several workers)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class CaptureLedger(LineageResolver, Protocol):
    """Token-free call rows for tokens a framework worker staged itself; failures poison the rollout."""

    async def record(self, commit: CaptureLedgerCommit) -> None:
        """Publish a staged call (same payload again: no-op; same id, other payload: error)."""
        ...

    async def record_failure(self, rollout_id: str, model_call_id: str, reason: str) -> None: ...

    async def manifest(self, rollout_id: str) -> dict[str, Any]:
        """The rollout's rows as ``staging.records.RolloutManifest`` data (``records`` and ``failures``)."""
        ...

    async def has_rows(self, rollout_id: str) -> bool: ...


@runtime_checkable
class TokenSink(Protocol):
    """Receives finished records (Gym's file store or a framework's transport)."""

    async def put(self, entry: TokenEntry) -> None:
        """Store durably before returning; identical repeats are no-ops, a changed payload for an id is an error."""
        ...

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """Say durably that a call of this rollout was lost, so the rollout is masked rather than trained with a hole."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class TokenSource(Protocol):
    """Where a trajectory builder freezes, reads and retires one rollout's records."""

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot: ...

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Retire exactly the consumed snapshot; False when anything changed since it was taken."""
        ...

    async def close(self) -> None: ...


_installed: dict[str, Any] = {"sink": None, "source": None, "lineage": None}
"""Process-wide defaults, set by the process that owns them (a model server or a framework worker)."""

_SINK_METHODS = ("put", "mark_incomplete", "close")


def install_token_sink(sink: TokenSink | None) -> None:
    """Set (``None``: clear) this process's default sink; one without ``mark_incomplete`` could hide lost calls."""
    if sink is not None:
        lacking = [name for name in _SINK_METHODS if not callable(getattr(sink, name, None))]
        if lacking:
            raise TypeError("the token sink lacks " + ", ".join(lacking))
    _installed["sink"] = sink


def installed_token_sink() -> TokenSink | None:
    sink: TokenSink | None = _installed["sink"]
    return sink


def install_token_source(source: TokenSource | None) -> None:
    _installed["source"] = source


def installed_token_source() -> TokenSource | None:
    source: TokenSource | None = _installed["source"]
    return source


def install_lineage_store(store: LineageResolver | None) -> None:
    _installed["lineage"] = store


def installed_lineage_store() -> LineageResolver | None:
    store: LineageResolver | None = _installed["lineage"]
    return store
