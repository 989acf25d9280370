"""Which captured call produced the response the verifier scored? Terminal attribution for a finished rollout.

Capture records every call a model server served, auxiliary calls, abandoned retries and sub-agent branches
included; training should deliver the chain that earned the reward. Independent witnesses each name at most one
call: ``explicit`` (the caller names it), ``declared`` (the harness reports the response id it kept; a declared id
that matches nothing stops attribution), ``response_id`` (the scored response's id equals a recorded one) and
``content`` (the fingerprint of the response's model-authored items equals a call's own output, its whole
continuation, or the transcript's trailing model-authored block). A witness that sees several candidates abstains.
Witnesses must agree (or name calls with identical token sequences); a disagreement attributes nothing and is
reported, since it points at a real defect that ranking witnesses would hide. Entries are ``TokenEntry`` records or
token-free ledger rows (``CallRecord``, recognised by their ``staging_key``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nemo_gym.token_id_capture.fingerprint import FINGERPRINT_VERSION, assistant_fingerprint


@dataclass(frozen=True)
class TerminalAttribution:
    """The attributed call (or None), the agreeing witness that names it, and the trail of abstentions."""

    @property
    def attributed(self) -> bool:
        """Whether some call was named."""
        return self.model_call_id is not None

    model_call_id: str | None
    method: str = ""
    reason: str = ""


def _is_ledger_row(entry: Any) -> bool:
    return getattr(entry, "staging_key", None) is not None


def _sequence_key(entry: Any) -> tuple[Any, ...]:
    """What identifies an entry's full token sequence: equal keys are interchangeable for training."""
    if _is_ledger_row(entry):
        return ("row", entry.cumulative_hash, entry.chain_hash, entry.cum_len)
    if getattr(entry, "digest", None) and getattr(entry, "cum_len", None) is not None:
        return ("digest", entry.digest, entry.cum_len)
    return ("tokens", tuple(entry.prompt_token_ids), tuple(entry.generation_token_ids))


def _single(candidates: Sequence[Any]) -> Any | None:
    """One candidate, or the smallest id among candidates with the same sequence; None when they differ."""
    if not candidates or len({_sequence_key(entry) for entry in candidates}) != 1:
        return None
    return min(candidates, key=lambda entry: entry.model_call_id)


def _fingerprint(items: list[dict[str, Any]]) -> str:
    try:
        return assistant_fingerprint(items)
    except (TypeError, ValueError):
        return ""


def _own_fingerprints(entry: Any) -> tuple[str, str]:
    """(fingerprint of the call's own output, of its request plus output) in the current fingerprint version."""
    version = getattr(entry, "fingerprint_version", None)
    continuation = getattr(entry, "continuation_fingerprint", None) or ""
    if _is_ledger_row(entry):
        if version != FINGERPRINT_VERSION:
            return "", ""
        return getattr(entry, "output_fingerprint", None) or "", continuation
    own = _fingerprint(list(entry.output_items)) if entry.output_items else ""
    return own, continuation if version in (None, FINGERPRINT_VERSION) else ""


def _content_witness(entries: Sequence[Any], response: dict[str, Any], trail: list[str]) -> Any | None:
    items = [item for item in response.get("output") or [] if isinstance(item, dict)]
    if not items:
        trail.append("response_has_no_output")
        return None
    whole = _fingerprint(items)
    if not whole:
        trail.append("no_model_authored_output")
        return None
    trailing: list[dict[str, Any]] = []
    for item in reversed(items):
        if item.get("role") != "assistant" and item.get("type") != "function_call":
            break
        trailing.insert(0, item)
    tail = _fingerprint(trailing) if trailing and len(trailing) < len(items) else ""
    matches = {}
    for entry in entries:
        own, continuation = _own_fingerprints(entry)
        if (continuation and continuation == whole) or (own and own in (whole, tail)):
            matches[entry.model_call_id] = entry
    winner = _single(list(matches.values()))
    if winner is None:
        trail.append("content_ambiguous" if matches else "no_content_match")
    return winner


def resolve_terminal(
    entries: Sequence[Any],
    response: dict[str, Any] | None,
    explicit_call_id: str | None = None,
    *,
    declared_response_id: str | None = None,
) -> TerminalAttribution:
    """Join the scored ``response`` (the ``/run`` result's) to one captured call; never raises."""
    trail: list[str] = []
    witnesses: list[tuple[str, Any]] = []
    if explicit_call_id:
        named = [entry for entry in entries if entry.model_call_id == explicit_call_id]
        if named:
            witnesses.append(("explicit", named[0]))
        else:
            trail.append("explicit_terminal_not_captured")
    if declared_response_id:
        declared = [entry for entry in entries if getattr(entry, "response_id", None) == declared_response_id]
        winner = _single(declared)
        if winner is None:
            trail.append("declared_ambiguous" if declared else "declared_terminal_not_captured")
            return TerminalAttribution(None, reason=",".join(trail))
        witnesses.append(("declared", winner))
    if isinstance(response, dict):
        response_id = str(response.get("id") or "")
        same_id = [entry for entry in entries if response_id and getattr(entry, "response_id", None) == response_id]
        winner = _single(same_id)
        if winner is not None:
            witnesses.append(("response_id", winner))
        else:
            trail.append(
                "response_has_no_id"
                if not response_id
                else "response_id_ambiguous"
                if same_id
                else "response_id_no_match"
            )
        content = _content_witness(entries, response, trail)
        if content is not None:
            witnesses.append(("content", content))
    else:
        trail.append("no_response_object")
    return _verdict(witnesses, trail)


def _verdict(witnesses: list[tuple[str, Any]], trail: list[str]) -> TerminalAttribution:
    """The first witness names the call when all witnesses agree; none, or a disagreement, names nothing.

    The trail is returned in every case, so an abstaining witness stays visible even when another one attributed.
    """
    agreeing = bool(witnesses) and _single([entry for _, entry in witnesses]) is not None
    if witnesses and not agreeing:
        claims = [f"{label}={claimed.model_call_id}" for label, claimed in witnesses]
        trail.append("witness_disagreement[" + ";".join(claims) + "]")
    if not agreeing:
        return TerminalAttribution(None, reason=",".join(trail))
    (lead_label, lead), *others = witnesses
    if others:
        trail.append("corroborated_by=" + "+".join(label for label, _ in others))
    return TerminalAttribution(lead.model_call_id, method=lead_label, reason=",".join(trail))
