"""Which recorded call does a request continue? Request-time parent resolution over committed records.

A rollout's model calls must join into one token sequence for training, and the model server sees only HTTP
requests. So each committed entry is stamped (``stamp_continuation``) with the fingerprint of its request plus its
own output and the digest of its request context; the next request's model-authored turns then look up that
fingerprint, and the leading context must hash the same. One verified candidate resolves; none or several (with
different tokens) stay unresolved: a wrong parent would train tokens as the wrong thing, a missing one only masks.

``InMemoryLineageStore`` serves one process (tests, single-worker development); ``FileLineageStore`` reads the
token JSONL of ``TokenCaptureStore`` under its lock, so every worker on the node sees a commit as soon as ``put``
returned. Both also keep a capture ledger (token-free rows of worker-staged calls) for external staging.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from nemo_gym.token_id_capture.fingerprint import FINGERPRINT_VERSION, assistant_fingerprint, conversation_digest
from nemo_gym.token_id_capture.protocols import LineageMatch, LineageResolution
from nemo_gym.token_id_capture.records import (
    LEDGER_ROW_MISSING_CHAIN_HASH_REASON,
    LEDGER_ROW_MISSING_RESPONSE_ID_REASON,
    ParentResolutionStatus,
    TokenEntry,
    compute_digest,
    cumulative_tokens,
)
from nemo_gym.token_id_capture.store import TokenCaptureStore, validate_rollout_id

if TYPE_CHECKING:
    from nemo_gym.token_id_capture.staging.records import CaptureLedgerCommit

_ROOT = LineageResolution(ParentResolutionStatus.ROOT)


def stamp_continuation(entry: TokenEntry, request_items: list[dict[str, Any]]) -> TokenEntry:
    """Give an entry the keys the next request will be looked up by (without them it can never be a parent)."""
    keys = {
        "fingerprint_version": FINGERPRINT_VERSION,
        "continuation_context_digest": conversation_digest(request_items),
        "continuation_context_len": len(request_items),
        "continuation_fingerprint": assistant_fingerprint(request_items + list(entry.output_items)),
    }
    for name, value in keys.items():
        setattr(entry, name, value)
    return entry


@dataclass
class LineageNode:
    """What resolution needs of one committed call; ``tokens`` None means "read them from the store on a match"."""

    call_id: str
    cum_len: int
    digest: str
    context_len: int
    context_digest: str
    tokens: tuple[int, ...] | None = None
    parent_call_id: str | None = None
    prompt_is_delta: bool = False
    offset: int = -1
    staging_chain: tuple[str, ...] = ()
    chain_hash: str = ""


@dataclass
class RolloutLineage:
    """One rollout's committed calls, indexed by continuation fingerprint."""

    by_fingerprint: dict[str, list[str]] = field(default_factory=dict)
    by_call_id: dict[str, LineageNode] = field(default_factory=dict)

    def _index(self, fingerprint: str, node: LineageNode) -> None:
        known = self.by_call_id.get(node.call_id)
        if known is not None:
            if known != node:
                raise ValueError(f"model call {node.call_id} was committed twice with different lineage")
            return
        self.by_call_id[node.call_id] = node
        self.by_fingerprint.setdefault(fingerprint, []).append(node.call_id)

    def add_entry(self, entry: TokenEntry, *, store_tokens: bool = True, offset: int = -1) -> None:
        """Index a committed entry; unstamped ones and ones hashed by another fingerprint version are skipped."""
        if not entry.continuation_fingerprint or entry.fingerprint_version not in (None, FINGERPRINT_VERSION):
            return
        if entry.prompt_is_delta and store_tokens:
            raise ValueError("a delta entry can only be indexed by a store that can read its parents back")
        tokens = tuple(cumulative_tokens(entry)) if store_tokens else None
        node = LineageNode(
            call_id=entry.model_call_id,
            cum_len=entry.cum_len if entry.cum_len is not None else len(tokens or ()),
            digest=entry.digest or (compute_digest(list(tokens)) if tokens is not None else ""),
            context_len=entry.continuation_context_len,
            context_digest=entry.continuation_context_digest,
            tokens=tokens,
            parent_call_id=entry.parent_call_id,
            prompt_is_delta=entry.prompt_is_delta,
            offset=offset,
        )
        self._index(entry.continuation_fingerprint, node)

    def record(
        self,
        call_id: str,
        messages: list[dict[str, Any]],
        cum_tokens: list[int],
        digest: str,
        context_len: int | None = None,
    ) -> None:
        """Index a call directly from its conversation (request then the call's output; the output is one item
        unless ``context_len`` says where the request ends)."""
        request_len = context_len if context_len is not None else max(len(messages) - 1, 0)
        node = LineageNode(
            call_id=call_id,
            cum_len=len(cum_tokens),
            digest=digest,
            context_len=request_len,
            context_digest=conversation_digest(messages[:request_len]),
            tokens=tuple(cum_tokens),
        )
        fingerprint = assistant_fingerprint(messages)
        if fingerprint:
            self._index(fingerprint, node)

    def resolve_node(self, messages: list[dict[str, Any]]) -> tuple[ParentResolutionStatus, LineageNode | None, str]:
        """The decision without reading tokens: ROOT, RESOLVED with the node, or UNRESOLVED with why."""
        fingerprint = assistant_fingerprint(messages)
        if not fingerprint:
            return ParentResolutionStatus.ROOT, None, ""
        candidates = [
            node
            for call_id in dict.fromkeys(self.by_fingerprint.get(fingerprint, ()))
            if _context_holds(node := self.by_call_id[call_id], messages)
        ]
        chosen = _one_sequence(candidates)
        if chosen is None:
            return ParentResolutionStatus.UNRESOLVED, None, "ambiguous" if candidates else "no_match"
        return ParentResolutionStatus.RESOLVED, chosen, ""

    def resolve(self, messages: list[dict[str, Any]]) -> LineageResolution:
        status, node, reason = self.resolve_node(messages)
        if node is None:
            return LineageResolution(status, reason=reason)
        if node.tokens is None:
            raise ValueError("this node keeps no tokens; its store must read them back")
        return LineageResolution(status, match=_match(node, node.tokens))


def _context_holds(node: LineageNode, messages: list[dict[str, Any]]) -> bool:
    """The request repeats the recorded call's context unchanged (no digest recorded: never trust the match)."""
    if not node.context_digest or len(messages) < node.context_len:
        return False
    return conversation_digest(messages[: node.context_len]) == node.context_digest


def _one_sequence(candidates: list[LineageNode]) -> LineageNode | None:
    """The single candidate, or the smallest id among candidates whose token sequences are identical."""
    if len({(node.digest, node.cum_len) for node in candidates}) != 1 or not candidates[0].digest:
        return candidates[0] if len(candidates) == 1 else None
    return min(candidates, key=lambda node: node.call_id)


def _match(node: LineageNode, tokens: tuple[int, ...]) -> LineageMatch:
    return LineageMatch(
        model_call_id=node.call_id,
        cumulative_token_ids=tokens,
        digest=node.digest,
        staging_chain=node.staging_chain,
        prev_len=node.cum_len,
        chain_hash=node.chain_hash,
    )


# -- the capture ledger (external staging) -------------------------------------------------------------------------


def _ledger_row(commit: CaptureLedgerCommit) -> dict[str, Any]:
    request_items = list(commit.request_items)
    return {
        "model_call_id": commit.record.model_call_id,
        "fingerprint": assistant_fingerprint([*request_items, *commit.response_items]),
        "fingerprint_version": FINGERPRINT_VERSION,
        "context_len": len(request_items),
        "context_digest": conversation_digest(request_items),
        "staging_chain": list(commit.staging_chain),
        "record": commit.record.model_dump(mode="json"),
    }


def _resolve_ledger(rows: list[dict[str, Any]], items: list[dict[str, Any]]) -> LineageResolution | None:
    """A committed ledger row the request continues, or None when the rows prove nothing."""
    fingerprint = assistant_fingerprint(items)
    if not fingerprint:
        return None
    nodes = [
        LineageNode(
            call_id=row["model_call_id"],
            cum_len=int(row["record"]["cum_len"]),
            digest=str(row["record"]["cumulative_hash"]),
            context_len=int(row["context_len"]),
            context_digest=str(row["context_digest"]),
            staging_chain=tuple(row.get("staging_chain") or ()),
            chain_hash=str(row["record"].get("chain_hash") or ""),
        )
        for row in rows
        if "record" in row
        and row.get("fingerprint") == fingerprint
        and row.get("fingerprint_version") == FINGERPRINT_VERSION
    ]
    chosen = _one_sequence([node for node in nodes if _context_holds(node, items)])
    return None if chosen is None else LineageResolution(ParentResolutionStatus.RESOLVED, match=_match(chosen, ()))


def _manifest(rollout_id: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows as ``RolloutManifest`` data; a committed row lacking what verification anchors on becomes a failure."""
    from nemo_gym.token_id_capture.staging.records import CallRecord, ManifestFailure, RolloutManifest

    records: list[CallRecord] = []
    failures: list[ManifestFailure] = []
    for row in rows:
        call_id = str(row["model_call_id"])
        if "failure_reason" in row:
            failures.append(ManifestFailure(model_call_id=call_id, reason=str(row["failure_reason"])))
            continue
        record = row["record"]
        if not record.get("response_id"):
            failures.append(ManifestFailure(model_call_id=call_id, reason=LEDGER_ROW_MISSING_RESPONSE_ID_REASON))
        elif not record.get("chain_hash") or not record.get("cumulative_hash"):
            failures.append(ManifestFailure(model_call_id=call_id, reason=LEDGER_ROW_MISSING_CHAIN_HASH_REASON))
        else:
            records.append(CallRecord.model_validate(record))
    manifest = RolloutManifest(rollout_id=rollout_id, records=records, failures=failures)
    return manifest.model_dump(mode="json")


def _add_row(rows: list[dict[str, Any]], row: dict[str, Any]) -> bool:
    """Write-once per call: the identical row again is a no-op (False), a different committed row an error."""
    same_call = [existing for existing in rows if existing["model_call_id"] == row["model_call_id"]]
    if row in same_call:
        return False
    if "record" in row and any("record" in existing for existing in same_call):
        raise ValueError(f"model call {row['model_call_id']} was committed twice with different rows")
    rows.append(row)
    return True


class LineageIndex:
    """Per-rollout lineages of one process, the least recently used forgotten past ``max_rollouts``.

    Forgetting a rollout can only leave a later continuation of it unresolved (never wrongly resolved), which is why
    a plain LRU bound is safe here. The one in use is never the one evicted.
    """

    def __init__(self, max_rollouts: int = 512) -> None:
        self._max_rollouts = max_rollouts
        self._lineages: dict[str, RolloutLineage] = {}

    def for_rollout(self, rollout_id: str) -> RolloutLineage:
        lineage = self._lineages.pop(rollout_id, None) or RolloutLineage()
        self._lineages[rollout_id] = lineage  # most recently used last
        while len(self._lineages) > self._max_rollouts:
            self._lineages.pop(next(iter(self._lineages)))
        return lineage

    def drop(self, rollout_id: str) -> None:
        self._lineages.pop(rollout_id, None)

    def clear(self) -> None:
        self._lineages.clear()

    def __len__(self) -> int:
        return len(self._lineages)


class InMemoryLineageStore:
    """A resolver (and ledger) for one process: ``put`` indexes a committed entry into ``index``.

    Ledger rows are never evicted; the index forgets old rollouts (see :class:`LineageIndex`).
    """

    def __init__(self, max_rollouts: int = 512) -> None:
        self.index = LineageIndex(max_rollouts)
        self._ledgers: dict[str, list[dict[str, Any]]] = {}

    def for_rollout(self, rollout_id: str) -> RolloutLineage:
        return self.index.for_rollout(rollout_id)

    async def put(self, entry: TokenEntry) -> None:
        self.for_rollout(entry.rollout_id).add_entry(entry)

    async def resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> LineageResolution:
        resolution = self.for_rollout(rollout_id).resolve(request_items)
        if resolution.status == ParentResolutionStatus.UNRESOLVED:
            return _resolve_ledger(self._ledgers.get(rollout_id, []), request_items) or resolution
        return resolution

    def is_process_shared(self) -> bool:
        return False

    async def record(self, commit: CaptureLedgerCommit) -> None:
        _add_row(self._ledgers.setdefault(commit.rollout_id, []), _ledger_row(commit))

    async def record_failure(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        _add_row(self._ledgers.setdefault(rollout_id, []), {"model_call_id": model_call_id, "failure_reason": reason})

    async def manifest(self, rollout_id: str) -> dict[str, Any]:
        return _manifest(rollout_id, self._ledgers.get(rollout_id, []))

    async def has_rows(self, rollout_id: str) -> bool:
        return bool(self._ledgers.get(rollout_id)) or bool(self.for_rollout(rollout_id).by_call_id)

    async def close(self) -> None:
        self.index.clear()
        self._ledgers.clear()


@dataclass
class _Tail:
    """How far a rollout's JSONL has been indexed: the file's inode and the byte offset read up to."""

    inode: int
    offset: int
    lineage: RolloutLineage = field(default_factory=RolloutLineage)


class FileLineageStore:
    """Resolves over ``TokenCaptureStore``'s files under its lock; shared by every process on the node.

    Each rollout's JSONL is indexed incrementally (metadata only) and tokens are read back for the one match, through
    its delta chain and checked against its digest. Ledger rows go to ``<id>.lineage.jsonl`` under the same lock.
    """

    def __init__(self, root: str | Path, *, max_cached_rollouts: int = 65536) -> None:
        self._store = TokenCaptureStore(root)
        self._max_cached = max_cached_rollouts
        self._tails: dict[str, _Tail] = {}

    def _ledger_path(self, rollout_id: str) -> Path:
        return self._store.root / f"{validate_rollout_id(rollout_id)}.lineage.jsonl"

    def _refresh(self, rollout_id: str) -> RolloutLineage:
        path = self._store.path_for(rollout_id)
        if not path.exists():
            self._tails.pop(rollout_id, None)
            return RolloutLineage()
        stat = path.stat()
        tail = self._tails.pop(rollout_id, None)
        if tail is None or tail.inode != stat.st_ino or tail.offset > stat.st_size:
            tail = _Tail(stat.st_ino, 0)
        self._tails[rollout_id] = tail
        while len(self._tails) > self._max_cached:
            self._tails.pop(next(iter(self._tails)))
        with path.open("rb") as stream:
            stream.seek(tail.offset)
            for line in stream:
                if not line.endswith(b"\n"):
                    break  # a write in progress elsewhere is not committed yet
                if line.strip():
                    entry = TokenEntry.model_validate(orjson.loads(line))
                    tail.lineage.add_entry(entry, store_tokens=False, offset=tail.offset)
                tail.offset += len(line)
        return tail.lineage

    def _read_at(self, rollout_id: str, offset: int) -> TokenEntry:
        with self._store.path_for(rollout_id).open("rb") as stream:
            stream.seek(offset)
            return TokenEntry.model_validate(orjson.loads(stream.readline()))

    def _tokens(self, rollout_id: str, node: LineageNode, lineage: RolloutLineage) -> tuple[int, ...]:
        """The node's full sequence: its entry and, for delta prompts, each parent's, root first; digest-checked."""
        chain: list[TokenEntry] = []
        current: LineageNode | None = node
        while current is not None:
            if len(chain) > len(lineage.by_call_id):
                raise ValueError(f"the parent chain of {node.call_id} loops")
            entry = self._read_at(rollout_id, current.offset)
            if entry.model_call_id != current.call_id:
                raise ValueError(f"the stored line for {current.call_id} holds {entry.model_call_id}")
            chain.append(entry)
            if not entry.prompt_is_delta:
                break
            current = lineage.by_call_id.get(entry.parent_call_id or "")
            if current is None:
                raise ValueError(f"the delta entry {entry.model_call_id} has no indexed parent")
        tokens: list[int] = []
        for entry in reversed(chain):
            tokens += [*entry.prompt_token_ids, *entry.generation_token_ids]
        if node.digest and compute_digest(tokens) != node.digest:
            raise ValueError(f"the tokens read back for {node.call_id} do not match its digest")
        return tuple(tokens)

    def _resolve_now(self, rollout_id: str, items: list[dict[str, Any]]) -> LineageResolution:
        with self._store.locked(rollout_id, shared=True):
            lineage = self._refresh(rollout_id)
            status, node, reason = lineage.resolve_node(items)
            if node is not None:
                return LineageResolution(status, match=_match(node, self._tokens(rollout_id, node, lineage)))
            if status == ParentResolutionStatus.ROOT:
                return _ROOT
            return _resolve_ledger(self._rows(rollout_id), items) or LineageResolution(status, reason=reason)

    async def resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> LineageResolution:
        return await asyncio.to_thread(self._resolve_now, rollout_id, request_items)

    def is_process_shared(self) -> bool:
        return True

    # -- ledger ---------------------------------------------------------------------------------------------------

    def _rows(self, rollout_id: str) -> list[dict[str, Any]]:
        path = self._ledger_path(rollout_id)
        if not path.exists():
            return []
        return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]

    def _append_row(self, rollout_id: str, row: dict[str, Any]) -> None:
        with self._store.locked(rollout_id):
            if not _add_row(self._rows(rollout_id), row):
                return
            with self._ledger_path(rollout_id).open("ab") as out:
                out.write(orjson.dumps(row, option=orjson.OPT_SORT_KEYS) + b"\n")
                out.flush()
                os.fsync(out.fileno())

    async def record(self, commit: CaptureLedgerCommit) -> None:
        await asyncio.to_thread(self._append_row, commit.rollout_id, _ledger_row(commit))

    async def record_failure(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        row = {"model_call_id": model_call_id, "failure_reason": reason}
        await asyncio.to_thread(self._append_row, rollout_id, row)

    def _locked_rows(self, rollout_id: str) -> list[dict[str, Any]]:
        with self._store.locked(rollout_id, shared=True):
            return self._rows(rollout_id)

    async def manifest(self, rollout_id: str) -> dict[str, Any]:
        return _manifest(rollout_id, await asyncio.to_thread(self._locked_rows, rollout_id))

    async def has_rows(self, rollout_id: str) -> bool:
        return bool(await asyncio.to_thread(self._locked_rows, rollout_id))

    async def close(self) -> None:
        self._tails.clear()
