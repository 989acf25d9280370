"""Integrity hashes of worker-staged token deltas, so a trainer can check what it fetched without trusting storage.

Three hashes: the chain hash links each call's delta to its parent's (``H(parent chain || delta)``), so continuity is
checked without rebuilding sequences; the cumulative hash covers a call's whole sequence; the call digest covers
every field of one staged record, optional ``extras`` through their own digest so tokens can be checked without
loading them. Every field is typed and length-prefixed; floats are hashed as their float32 bits, and extras accept
only plain JSON-like values (no NaN, tuples or numpy scalars) so two runtimes cannot encode one value two ways.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final

STAGING_SCHEMA_VERSION: Final = 2
STAGING_DIGEST_VERSION: Final = 2
EXTRAS_DIGEST_VERSION: Final = 1

# The byte layout is NeMo Gym 0.7's staging format (schema and digest version 2), so records staged by either
# implementation's inference worker verify on the other's trainer; changing a byte here is a new version.
_CALL_DOMAIN = b"nemo-gym-staging-call-v2"
_EXTRAS_DOMAIN = b"nemo-gym-staging-extras-v1"
_PREFIX_DOMAIN = b"nemo-gym-staging-prefix-v2"
_CHAIN_DOMAIN = b"nemo-gym-staging-chain-v1"
_U64_MAX = 2**64 - 1


def _u64(value: int, what: str) -> bytes:
    if type(value) is not int or not 0 <= value <= _U64_MAX:
        raise ValueError(f"{what} must be an unsigned 64-bit integer, got {value!r}")
    return struct.pack(">Q", value)


def _blob(data: bytes) -> bytes:
    return struct.pack(">Q", len(data)) + data


def _text(value: str, what: str = "text") -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {type(value).__name__}")
    return _blob(value.encode("utf-8"))


def _hex_digest(value: str, what: str) -> bytes:
    if not isinstance(value, str) or len(value) != 64 or value.strip("0123456789abcdef"):
        raise ValueError(f"{what} must be a lowercase SHA-256 hex digest")
    return bytes.fromhex(value)


def encode_token_ids(token_ids: Sequence[int]) -> bytes:
    """Count then ids, unsigned 64-bit big-endian."""
    return _u64(len(token_ids), "token count") + b"".join(_u64(token_id, "token id") for token_id in token_ids)


def hash_token_ids(token_ids: Sequence[int]) -> str:
    """The cumulative hash of one exact token sequence."""
    return hashlib.sha256(_PREFIX_DOMAIN + encode_token_ids(token_ids)).hexdigest()


def compute_chain_hash(parent_chain_hash: str | None, token_ids_delta: Sequence[int]) -> str:
    """This call's chain hash from its parent's (None for a root, marked so a root never equals a child)."""
    parent = b"\x00" if parent_chain_hash is None else b"\x01" + _hex_digest(parent_chain_hash, "parent_chain_hash")
    return hashlib.sha256(_CHAIN_DOMAIN + parent + encode_token_ids(token_ids_delta)).hexdigest()


def _float32s(values: Sequence[float], what: str) -> bytes:
    packed = [_u64(len(values), f"{what} count")]
    for value in values:
        if type(value) is not float or not math.isfinite(value):
            raise ValueError(f"{what} must hold finite floats, got {value!r}")
        try:
            bits = struct.pack(">f", value)
        except OverflowError as error:
            raise ValueError(f"{what} value {value!r} does not fit a float32") from error
        if not math.isfinite(struct.unpack(">f", bits)[0]):
            raise ValueError(f"{what} value {value!r} does not fit a float32")
        packed.append(bits)
    return b"".join(packed)


def _extra(value: Any) -> bytes:
    """One extras value, tagged by its exact type."""
    kind = type(value)
    if value is None:
        return b"N"
    if kind is bool:
        return b"B" + (b"\x01" if value else b"\x00")
    if kind is int:
        if not -(2**63) <= value < 2**63:
            raise ValueError(f"extras integer {value} is outside the signed 64-bit range")
        return b"I" + struct.pack(">q", value)
    if kind is float:
        if not math.isfinite(value):
            raise ValueError(f"extras float {value!r} is not finite")
        return b"F" + struct.pack(">d", value)
    if kind is str:
        return b"S" + _text(value)
    if kind is list:
        return b"L" + _u64(len(value), "extras list length") + b"".join(map(_extra, value))
    if kind is dict:
        if any(type(key) is not str for key in value):
            raise TypeError("extras mappings need string keys")
        keys = sorted(value, key=lambda key: key.encode("utf-8"))
        return b"D" + _u64(len(keys), "extras mapping size") + b"".join(_text(key) + _extra(value[key]) for key in keys)
    raise TypeError(f"extras cannot hold a {kind.__name__}")


def compute_extras_digest(extras: Mapping[str, Any] | None) -> str:
    if extras is not None and not isinstance(extras, Mapping):
        raise TypeError(f"extras must be a mapping or None, not {type(extras).__name__}")
    body = _extra(None if extras is None else dict(extras))
    return hashlib.sha256(_EXTRAS_DOMAIN + bytes([EXTRAS_DIGEST_VERSION]) + body).hexdigest()


EMPTY_EXTRAS_DIGEST = compute_extras_digest(None)


def _check_shape(
    parent_call_id: str | None, mode: str, prev_len: int, delta_len: int, cum_len: int, columns: Sequence[Sequence[Any]]
) -> None:
    if parent_call_id == "":
        raise ValueError("parent_call_id must be non-empty when given")
    if mode not in ("text", "token_in"):
        raise ValueError(f"unknown capture mode {mode!r}")
    if (parent_call_id is None) != (mode == "text") or (parent_call_id is None) != (prev_len == 0):
        raise ValueError("a root is a text call with prev_len 0; a child is a token_in call with prev_len > 0")
    if delta_len == 0 or any(len(column) != delta_len for column in columns):
        raise ValueError("a staged delta needs at least one token and equally long ids, mask and log-probs")
    if cum_len != prev_len + delta_len:
        raise ValueError(f"cum_len {cum_len} is not prev_len + delta_len ({prev_len + delta_len})")
    mask, log_probs = columns[1], columns[2]
    if any(bit not in (0.0, 1.0) for bit in mask):
        raise ValueError("token_mask_delta holds only 0.0 and 1.0")
    if any(bit == 0.0 and log_prob != 0.0 for bit, log_prob in zip(mask, log_probs, strict=True)):
        raise ValueError("prompt tokens carry a log-prob of 0.0")


def compute_staging_digest(
    *,
    schema_version: int,
    digest_version: int,
    extras_digest_version: int,
    rollout_id: str,
    model_call_id: str,
    parent_call_id: str | None,
    mode: str,
    prev_len: int,
    delta_len: int,
    cum_len: int,
    weight_version: int,
    token_ids_delta: Sequence[int],
    token_mask_delta: Sequence[float],
    generation_log_probs_delta: Sequence[float],
    extras_digest: str,
    chain_hash: str,
    cumulative_hash: str,
) -> str:
    """The digest of one staged record (every field; extras through ``extras_digest``)."""
    versions = (schema_version, digest_version, extras_digest_version)
    if versions != (STAGING_SCHEMA_VERSION, STAGING_DIGEST_VERSION, EXTRAS_DIGEST_VERSION):
        raise ValueError(f"unsupported staging versions {versions}")
    if not rollout_id or not model_call_id:
        raise ValueError("rollout_id and model_call_id must be non-empty")
    columns = (token_ids_delta, token_mask_delta, generation_log_probs_delta)
    _check_shape(parent_call_id, mode, prev_len, delta_len, cum_len, columns)
    fields = [
        bytes(versions),
        _text(rollout_id),
        _text(model_call_id),
        b"\x00" if parent_call_id is None else b"\x01" + _text(parent_call_id),
        _text(mode),
        _u64(prev_len, "prev_len"),
        _u64(delta_len, "delta_len"),
        _u64(cum_len, "cum_len"),
        _u64(weight_version, "weight_version"),
        _blob(encode_token_ids(token_ids_delta)),
        _blob(_float32s(token_mask_delta, "token_mask_delta")),
        _blob(_float32s(generation_log_probs_delta, "generation_log_probs_delta")),
        _hex_digest(extras_digest, "extras_digest"),
        b"\x01" + _hex_digest(chain_hash, "chain_hash"),  # always present; the byte is part of the v2 layout
        b"\x01" + _hex_digest(cumulative_hash, "cumulative_hash"),
    ]
    return hashlib.sha256(_CALL_DOMAIN + b"".join(fields)).hexdigest()


def build_staging_delta(
    *, prompt_token_ids: list[int], generated_token_ids: list[int], generated_log_probs: list[float], prev_len: int
) -> tuple[list[int], list[float], list[float]]:
    """The next delta of a call: prompt tokens after ``prev_len`` (mask 0, log-prob 0) then the generation (mask 1)."""
    if not 0 <= prev_len <= len(prompt_token_ids):
        raise ValueError(f"prev_len {prev_len} is outside a prompt of {len(prompt_token_ids)} tokens")
    if len(generated_token_ids) != len(generated_log_probs):
        raise ValueError(f"{len(generated_token_ids)} generated ids but {len(generated_log_probs)} log-probs")
    carried = prompt_token_ids[prev_len:]
    ids = [*carried, *generated_token_ids]
    if not ids:
        raise ValueError("a staged delta needs at least one token")
    mask = [0.0] * len(carried) + [1.0] * len(generated_token_ids)
    log_probs = [0.0] * len(carried) + [float(value) for value in generated_log_probs]
    return ids, mask, log_probs
