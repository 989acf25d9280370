"""One captured model call's training tokens (``TokenEntry``) and the helpers that read them off a served answer.

Why a record of its own: evaluation capture (``observability/capture.py``) keeps request and response summaries,
training needs the exact token ids the policy saw and produced, with one log-prob per generated token. The two share
a ``model_call_id`` so a trainer can join them. Reason strings below are a wire contract with training frameworks:
they are matched, never reworded.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts")
"""Token metadata a served item may carry; ``routed_experts`` only on mixture-of-experts engines."""

_REQUIRED_TOKEN_FIELDS = TOKEN_FIELDS[:3]

TOKEN_ENTRY_RECORD_SCHEMA_VERSION = 1
"""The record layout this reader writes; a newer record is refused rather than half understood."""
TOKEN_ENTRY_MIN_SCHEMA_VERSION = 1

UNRESOLVED_PARENT_REASON = "unresolved_parent"
"""A continuation whose parent call could not be proven, so it was not admitted for capture."""
UNCOMMITTED_CALL_REASON = "request_finished_without_staged_coordinates"
"""An admitted call that ended without the worker's commit coordinates."""
LEDGER_ROW_MISSING_RESPONSE_ID_REASON = "ledger_row_missing_response_id"
LEDGER_ROW_MISSING_CHAIN_HASH_REASON = "ledger_row_missing_chain_hash"

_SEQUENCE_DOMAIN = b"nemo-gym/token-sequence/v1"


class ParentResolutionStatus(StrEnum):
    """What was known, at request time, about the call a request continues."""

    ROOT = "root"
    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"


def _packed_ids(token_ids: list[int]) -> bytes:
    """Count then ids, each as 8 unsigned big-endian bytes: two sequences hash alike only when they are equal."""
    if any(token_id < 0 for token_id in token_ids):
        raise ValueError("token ids must be non-negative")
    return struct.pack(f">Q{len(token_ids)}Q", len(token_ids), *token_ids)


def compute_digest(token_ids: list[int]) -> str:
    """SHA-256 of an exact token sequence: a child proves its parent by hashing the parent-length prefix of its prompt."""
    return hashlib.sha256(_SEQUENCE_DOMAIN + _packed_ids(list(token_ids))).hexdigest()


class TokenEntry(BaseModel):
    """The tokens of one model call of one rollout, plus what links it to the call it continues.

    Token arrays live once, at the top; ``output_items`` keep the answer's content without them and
    ``token_item_index`` says which item carried them, so a builder can put them back where they were.
    """

    model_config = ConfigDict(extra="allow")

    schema_version: int = TOKEN_ENTRY_RECORD_SCHEMA_VERSION
    rollout_id: str
    model_call_id: str
    model: str = ""
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    routed_experts: Any | None = None
    output_items: list[dict[str, Any]] = Field(default_factory=list)
    token_item_index: int | None = None
    response_id: str | None = None
    """The id of the answer the client got: terminal attribution joins the scored response on it."""
    created_at: float = 0.0

    parent_call_id: str | None = None
    cum_len: int | None = None
    """Length of prompt + generation: a child's prompt must start with exactly this many of these tokens."""
    digest: str | None = None
    """``compute_digest(prompt + generation)`` over the full (never the delta) sequence."""
    parent_resolution: ParentResolutionStatus | None = None
    parent_resolution_reason: str = ""
    continuation_fingerprint: str = ""
    continuation_context_len: int = 0
    continuation_context_digest: str = ""
    fingerprint_version: int | None = None
    prompt_is_delta: bool = False
    """The prompt holds only the tokens after the resolved parent's sequence (``delta_records``)."""
    prefix_requested: bool = False
    prefix_supplied: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> TokenEntry:
        version = self.schema_version
        if version > TOKEN_ENTRY_RECORD_SCHEMA_VERSION or version < TOKEN_ENTRY_MIN_SCHEMA_VERSION:
            raise ValueError(
                f"token record schema_version {version} is outside what this reader understands "
                f"({TOKEN_ENTRY_MIN_SCHEMA_VERSION}..{TOKEN_ENTRY_RECORD_SCHEMA_VERSION}); use a matching reader"
            )
        if len(self.generation_token_ids) != len(self.generation_log_probs):
            raise ValueError(
                f"{len(self.generation_token_ids)} generation token ids but {len(self.generation_log_probs)} log-probs"
            )
        index = self.token_item_index
        if index is not None and not 0 <= index < len(self.output_items):
            raise ValueError(f"token_item_index {index} does not name one of {len(self.output_items)} output items")
        _check_parent_fields(self.parent_resolution, self.parent_call_id)
        if self.prompt_is_delta and self.parent_resolution != ParentResolutionStatus.RESOLVED:
            raise ValueError("a delta prompt needs a resolved parent_call_id to be rebuilt from")
        return self


def _check_parent_fields(status: ParentResolutionStatus | None, parent_call_id: str | None) -> None:
    if status == ParentResolutionStatus.RESOLVED and not parent_call_id:
        raise ValueError("a resolved parent needs its parent_call_id")
    if status in (ParentResolutionStatus.ROOT, ParentResolutionStatus.UNRESOLVED) and parent_call_id is not None:
        raise ValueError(f"a {status.value} call names no parent_call_id")


def cumulative_tokens(entry: TokenEntry) -> list[int]:
    """Prompt then generation: what a child's prompt must begin with (a delta entry needs its parents first)."""
    if entry.prompt_is_delta:
        raise ValueError(f"call {entry.model_call_id} stores a delta prompt; rebuild it through its parent chain")
    return [*entry.prompt_token_ids, *entry.generation_token_ids]


def stamp_lineage(
    entry: TokenEntry,
    parent_call_id: str | None,
    *,
    parent_resolution: ParentResolutionStatus | None = None,
    cumulative: list[int] | None = None,
) -> TokenEntry:
    """Set ``cum_len``/``digest`` over the full sequence and the parent decision (``cumulative`` for a delta entry)."""
    full = cumulative if cumulative is not None else cumulative_tokens(entry)
    if cumulative is not None and not entry.prompt_is_delta and cumulative != cumulative_tokens(entry):
        raise ValueError("the cumulative tokens given disagree with the entry's own prompt and generation")
    _check_parent_fields(parent_resolution, parent_call_id)
    entry.cum_len = len(full)
    entry.digest = compute_digest(full)
    entry.parent_call_id = parent_call_id
    entry.parent_resolution = parent_resolution
    return entry


def _anthropic_items(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An Anthropic message as Responses items: thinking blocks become reasoning items, the rest one message."""
    items: list[dict[str, Any]] = []
    kept: list[Any] = []
    for block in payload.get("content") or []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "thinking":
            items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": block.get("thinking")}]})
        elif kind == "redacted_thinking":
            items.append({"type": "reasoning", "summary": [], "encrypted_content": block.get("data")})
        else:
            kept.append(block)
    if kept:
        items.append({"type": "message", "role": "assistant", "content": kept})
    return items


def response_to_output_items(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The content items of a served answer in any dialect (Responses ``output``, Chat ``choices``, a Message)."""
    output = payload.get("output")
    if isinstance(output, list) and output:
        return [item for item in output if isinstance(item, dict)]
    if payload.get("type") == "message" and payload.get("role") == "assistant":
        return _anthropic_items(payload)
    items = []
    for choice in payload.get("choices") or []:
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict):
            items.append({"type": "message", "role": "assistant", **message})
    return items


def strip_token_fields(items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int | None]:
    """The items without token arrays, and the index of the one item that had them (two such items is an error)."""
    carriers = [index for index, item in enumerate(items) if item.get("generation_token_ids") is not None]
    if len(carriers) > 1:
        raise ValueError("more than one output item carries token ids")
    stripped = [{key: value for key, value in item.items() if key not in TOKEN_FIELDS} for item in items]
    return stripped, (carriers[0] if carriers else None)


def extract_token_fields(response_json: Mapping[str, Any]) -> dict[str, Any] | None:
    """The token fields of an answer (Responses items or Chat messages), or None when it carries none.

    Exactly one item may carry them, and it must carry all three required fields: half a record is refused.
    """
    places = [item for item in response_json.get("output") or [] if isinstance(item, dict)]
    for choice in response_json.get("choices") or []:
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict):
            places.append(message)
    carriers = [item for item in places if any(item.get(name) is not None for name in _REQUIRED_TOKEN_FIELDS)]
    if not carriers:
        return None
    if len(carriers) > 1:
        raise ValueError("more than one item of the answer carries token ids")
    [carrier] = carriers
    absent = [name for name in _REQUIRED_TOKEN_FIELDS if carrier.get(name) is None]
    if absent:
        raise ValueError("the answer's token metadata lacks " + ", ".join(absent))
    return {name: carrier.get(name) for name in TOKEN_FIELDS}
