"""The rollout-health checks: what each needs to see, and the findings it reports from one rollout's evidence.

The evidence is a rollout row's canonical ``ng_trajectory`` (a :class:`TrajectoryRecord`): its agent turns, its
captured model calls, and the references from turns and agent invocations to those calls. A check only reports
findings; whether it could look at all (its evidence present and complete) is decided by ``needs``, in
``health/run.py``, which turns findings and unobserved checks into verdicts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from nemo_gym.observability.model_call_records import LENGTH_STOPS
from nemo_gym.observability.records import TrajectoryRecord
from nemo_gym.row_fields import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY

__all__ = ["CHECK_REGISTRY", "CallBindings", "CheckSpec", "Evidence", "Finding", "normalize_ignored_checks"]

Need = Literal["record", "trajectory", "turns", "calls", "turn_calls", "owned_calls", "repeats", "repeat_verdicts"]


@dataclass(frozen=True)
class CheckSpec:
    """A check's stable id (NeMo Gym 0.7's), whether it judges one rollout or a task's repeats, and its evidence.

    ``calls`` are all the captured model calls, referenced or not; ``turn_calls`` those the agent turns reference;
    ``owned_calls`` those referenced by turns or by agent invocations. A check reads at most one of the three.
    """

    id: str
    scope: Literal["rollout", "task"]
    needs: frozenset[Need]


def _rollout(check_id: str, *needs: Need) -> CheckSpec:
    return CheckSpec(check_id, "rollout", frozenset(("record", *needs)))


CHECK_REGISTRY: tuple[CheckSpec, ...] = (
    _rollout("check_execution_error"),
    _rollout("record_unreadable"),
    _rollout("rollout_duplicate_identity"),
    _rollout("rollout_missing_agent_turns", "trajectory", "turns"),
    _rollout("rollout_ended_on_failed_model_call", "trajectory", "calls"),
    _rollout("agent_turn_hollow", "trajectory", "turns"),
    _rollout("model_call_zero_completion_tokens", "trajectory", "owned_calls"),
    _rollout("model_call_missing_token_counts", "trajectory", "owned_calls"),
    _rollout("trajectory_capture_mismatch", "trajectory", "owned_calls"),
    _rollout("model_call_failed", "trajectory", "owned_calls"),
    _rollout("rollout_token_count_mismatch", "trajectory", "turn_calls"),
    _rollout("model_call_runaway_generation", "trajectory", "owned_calls"),
    CheckSpec("task_consistently_unhealthy", "task", frozenset({"repeat_verdicts"})),
    CheckSpec("task_no_successful_model_calls", "task", frozenset({"repeats"})),
)
"""NeMo Gym 0.7's checks, in its order. ``rollout_duplicate_identity`` compares rows, so the runner reports it after
the map; the task checks run over each task's repeats."""


def normalize_ignored_checks(checks: Sequence[str] | str | None) -> tuple[str, ...]:
    """Check ids to skip, from a list or a comma-separated string, each once; an unknown id is a ``ValueError``."""
    if checks is None:
        return ()
    raw = checks.split(",") if isinstance(checks, str) else list(checks)
    wanted = tuple(dict.fromkeys(item.strip() for item in raw if item.strip()))
    unknown = sorted(set(wanted) - {spec.id for spec in CHECK_REGISTRY})
    if unknown:
        known = ", ".join(spec.id for spec in CHECK_REGISTRY)
        raise ValueError(f"unknown rollout health checks: {', '.join(unknown)} (known: {known})")
    return wanted


class Finding(BaseModel):
    """Evidence of a problem, from one check about one rollout or task (``locator`` points inside it)."""

    check: str
    subject: dict[str, int | str]
    locator: dict[str, int | str] | None = None
    detail: dict[str, Any] = Field(default_factory=dict)


def subject_of(task_index: int | str, rollout_index: int | str | None = None) -> dict[str, int | str]:
    subject: dict[str, int | str] = {TASK_INDEX_KEY: task_index}
    if rollout_index is not None:
        subject[ROLLOUT_INDEX_KEY] = rollout_index
    return subject


# -- evidence ----------------------------------------------------------------------------------------------------------

CALL_GAPS = frozenset(
    {
        "model_calls_unavailable",
        "model_call_capture_incomplete",
        "model_call_capture_records_unreadable",
        "model_call_capture_unreadable",
    }
)
"""Trajectory gaps after which the captured calls are not the whole story."""
CONTRADICTIONS = {
    "model_call_reference_unmatched": "missing_captured_call",
    "model_call_reference_ambiguous": "duplicated_captured_call",
    "model_call_reference_conflict": "conflicting_call_ownership",
}
_TOOL_CALL_TYPES = frozenset(
    {
        "function_call",
        "tool_call",
        "tool_use",
        "custom_tool_call",
        "local_shell_call",
        "computer_call",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "file_search_call",
        "web_search_call",
        "code_interpreter_call",
        "image_generation_call",
    }
)
_TEXT_KEYS = (
    "text",
    "content",
    "output_text",
    "answer",
    "refusal",
    "reasoning",
    "reasoning_content",
    "summary",
    "encrypted_content",
)


def canonical_trajectory(record: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The row's ``ng_trajectory`` validated; ``(None, error name)`` when it does not validate.

    A trajectory that validates strictly (no value coerced) is already canonical in every field a check reads, so it
    is used as it is: dumping it again would cost more than parsing the line. Else it is validated leniently and
    dumped, which spells every value as the model does.
    """
    raw = record.get("ng_trajectory")
    if raw is None:
        return None, None
    if isinstance(raw, dict):
        try:
            TrajectoryRecord.model_validate(raw, strict=True)
            return raw, None
        except ValidationError:
            pass
    try:
        return TrajectoryRecord.model_validate(raw).model_dump(mode="json"), None
    except Exception as error:
        return None, type(error).__name__


def has_gap(trajectory: dict[str, Any], codes: Iterable[str]) -> bool:
    wanted = set(codes)
    return any(isinstance(gap, dict) and gap.get("code") in wanted for gap in trajectory.get("gaps") or [])


def _has_text(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, (list, tuple)):
        return any(_has_text(item) for item in value)
    if isinstance(value, dict):
        return any(_has_text(value.get(key)) for key in _TEXT_KEYS)
    return False


def _has_tool_call(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_has_tool_call(item) for item in value)
    return isinstance(value, dict) and (value.get("type") in _TOOL_CALL_TYPES or bool(value.get("tool_calls")))


def _reference_key(reference: Any) -> str | None:
    """A model-call reference as one string: by call id, else by (model server, response id); None if unusable."""
    if not isinstance(reference, dict):
        return None
    if reference.get("model_call_id"):
        return f"call:{reference['model_call_id']}"
    model_ref, response_id = reference.get("model_ref"), reference.get("response_id")
    if isinstance(model_ref, dict) and response_id:
        return f"response:{model_ref.get('type')}:{model_ref.get('name')}:{response_id}"
    return None


def normalized_calls(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """The trajectory's captured model calls, flattened to the fields the checks read."""
    return [_flattened_call(position, call) for position, call in enumerate(trajectory.get("model_calls") or [])]


# Copied as they are from a call's ``response_metadata``.
_METADATA_KEYS = ("response_id", "model_ref", "status_code", "response_status", "finish_reason", "error_category")
# Our name for a count -> its name in a call's ``token_stats``.
_TOKEN_COUNT_KEYS = {"tokens_in": "prompt_tokens", "tokens_out": "completion_tokens"}


def _flattened_call(position: int, call: dict[str, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = call.get("response_metadata") or {}
    counts: dict[str, Any] = call.get("token_stats") or {}
    flat: dict[str, Any] = {
        "position": position,
        "model_call_id": call.get("model_call_id"),
        "started_at": call.get("started_at"),
    }
    flat.update({key: metadata.get(key) for key in _METADATA_KEYS})
    flat.update({ours: counts.get(theirs) for ours, theirs in _TOKEN_COUNT_KEYS.items()})
    flat["response"] = call.get("response")
    return flat


def is_failed(call: dict[str, Any]) -> bool:
    status, outcome = call.get("status_code"), call.get("response_status")
    return (
        (isinstance(status, int) and status >= 400)
        or bool(call.get("error_category"))
        or outcome in ("failed", "error", "cancelled")
    )


def is_successful(call: dict[str, Any]) -> bool:
    status = call.get("status_code")
    return not is_failed(call) and (status is None or (isinstance(status, int) and 200 <= status < 400))


@dataclass(frozen=True)
class CallBindings:
    """References to model calls resolved against the captured calls: each matched once, missing, or ambiguous."""

    references: tuple[str, ...] = ()
    matched: tuple[dict[str, Any], ...] = ()
    missing: tuple[str, ...] = ()
    ambiguous: tuple[tuple[str, int], ...] = ()

    @property
    def observed(self) -> bool:
        return bool(self.references)

    @property
    def complete(self) -> bool:
        return self.observed and not self.missing and not self.ambiguous


def _references(items: Any) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for item in items or []:
        for reference in (item.get("model_calls") or []) if isinstance(item, dict) else []:
            key = _reference_key(reference)
            if key is not None:
                found.append((key, reference))
    return found


def _signature(reference: dict[str, Any]) -> tuple[str, ...]:
    raw = reference.get("model_ref")
    model_ref: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return tuple(
        str(part or "")
        for part in (
            reference.get("model_call_id"),
            model_ref.get("type"),
            model_ref.get("name"),
            reference.get("response_id"),
        )
    )


def _distinct(references: Iterable[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    seen: set[tuple[str, ...]] = set()
    kept = []
    for key, reference in references:
        signature = _signature(reference)
        if signature not in seen:
            seen.add(signature)
            kept.append((key, reference))
    return kept


def _server_key(model_ref: Any) -> Any:
    """A model server reference as a hashable value equal exactly when the references are (key order aside)."""
    return tuple(sorted(model_ref.items())) if isinstance(model_ref, dict) else model_ref


def _by_response(calls: list[dict[str, Any]]) -> dict[tuple[Any, Any], list[dict[str, Any]]] | None:
    """The calls by (response id, model server), so a reference without a call id is looked up, not scanned for;
    None when some value cannot be a key (then references are matched by scanning)."""
    index: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    try:
        for call in calls:
            index.setdefault((call.get("response_id"), _server_key(call.get("model_ref"))), []).append(call)
    except TypeError:
        return None
    return index


def _matches(
    reference: dict[str, Any],
    calls: list[dict[str, Any]],
    by_response: dict[tuple[Any, Any], list[dict[str, Any]]] | None,
) -> list[dict[str, Any]]:
    call_id, model_ref, response_id = (reference.get(k) for k in ("model_call_id", "model_ref", "response_id"))
    if call_id:
        return [
            call
            for call in calls
            if str(call.get("model_call_id")) == str(call_id)
            and model_ref in (None, call.get("model_ref"))
            and response_id in (None, call.get("response_id"))
        ]
    if by_response is not None:
        try:
            return by_response.get((response_id, _server_key(model_ref)), [])
        except TypeError:
            pass
    return [c for c in calls if c.get("response_id") == response_id and c.get("model_ref") == model_ref]


def _bind(references: list[tuple[str, dict[str, Any]]], calls: list[dict[str, Any]]) -> CallBindings:
    matched: dict[int, dict[str, Any]] = {}
    missing, ambiguous = [], []
    by_response = _by_response(calls)
    for key, reference in references:
        found = _matches(reference, calls, by_response)
        if not found:
            missing.append(key)
        elif len(found) > 1:
            ambiguous.append((key, len(found)))
        else:
            matched.setdefault(found[0]["position"], found[0])
    return CallBindings(
        references=tuple(key for key, _ in references),
        matched=tuple(matched[position] for position in sorted(matched)),
        missing=tuple(missing),
        ambiguous=tuple(ambiguous),
    )


@dataclass
class Evidence:
    """One rollout, read: its row, its canonical trajectory (or why not), its calls and both views of them."""

    record: dict[str, Any]
    subject: dict[str, int | str]
    trajectory: dict[str, Any] = field(default_factory=dict)
    calls: list[dict[str, Any]] = field(default_factory=list)
    turn_calls: CallBindings = field(default_factory=CallBindings)
    owned_calls: CallBindings = field(default_factory=CallBindings)
    _turns: list[tuple[dict[str, int | str], bool, bool]] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, record: dict[str, Any], subject: dict[str, int | str], trajectory: dict[str, Any] | None) -> Evidence:
        evidence = cls(record=record, subject=subject, trajectory=trajectory or {})
        if trajectory is not None:
            evidence.calls = normalized_calls(trajectory)
            by_turns = _distinct(_references(trajectory.get("turns")))
            by_invocations = _references(trajectory.get("invocations"))
            evidence.turn_calls = _bind(by_turns, evidence.calls)
            evidence.owned_calls = (  # the same references when no invocation names a call of its own
                _bind(_distinct([*by_turns, *by_invocations]), evidence.calls)
                if by_invocations
                else evidence.turn_calls
            )
        return evidence

    def turns(self) -> list[tuple[dict[str, int | str], bool, bool]]:
        """Per turn (read once): its locator, whether it did something (called a tool or said something), whether it
        referenced a model call."""
        if self._turns is None:
            self._turns = [
                (
                    {"turn": turn.get("turn_no", position)},
                    _has_tool_call(turn.get("answer"))  # the cheaper test first: most turns call a tool
                    or _has_text(turn.get("answer"))
                    or _has_text(turn.get("reasoning_content")),
                    bool(_references([turn])),
                )
                for position, turn in enumerate(self.trajectory.get("turns") or [])
            ]
        return self._turns


def transcript_tokens(record: dict[str, Any]) -> tuple[int, int, bool]:
    """The row's response usage (prompt, completion) and whether both counts are there."""
    response = record.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    prompt = usage.get("input_tokens", usage.get("prompt_tokens"))
    completion = usage.get("output_tokens", usage.get("completion_tokens"))
    prompt = prompt if type(prompt) is int and prompt >= 0 else None
    completion = completion if type(completion) is int and completion >= 0 else None
    return prompt or 0, completion or 0, prompt is not None and completion is not None


def count(call: dict[str, Any], key: str) -> int:
    value = call.get(key)
    return value if type(value) is int and value >= 0 else 0


# -- the rollout checks ------------------------------------------------------------------------------------------------


def _locator(call: dict[str, Any], fallback: int) -> dict[str, int | str]:
    return {"call_id": str(call.get("model_call_id") or call.get("response_id") or fallback)}


def _per_call(check: str, evidence: Evidence, test: Callable[[dict[str, Any]], dict[str, Any] | None]) -> list[Finding]:
    findings = []
    for position, call in enumerate(evidence.owned_calls.matched):
        detail = test(call)
        if detail is not None:
            findings.append(
                Finding(check=check, subject=evidence.subject, locator=_locator(call, position), detail=detail)
            )
    return findings


def missing_agent_turns(evidence: Evidence) -> list[Finding]:
    if any(active or referenced for _, active, referenced in evidence.turns()):
        return []
    detail = {"reason": "no agent turn with model activity"}
    return [Finding(check="rollout_missing_agent_turns", subject=evidence.subject, detail=detail)]


def hollow_turns(evidence: Evidence) -> list[Finding]:
    detail = {"reason": "agent turn has no message or tool calls"}
    return [
        Finding(check="agent_turn_hollow", subject=evidence.subject, locator=locator, detail=detail)
        for locator, active, _ in evidence.turns()
        if not active
    ]


def zero_completion(evidence: Evidence) -> list[Finding]:
    return _per_call(
        "model_call_zero_completion_tokens",
        evidence,
        lambda c: {"completion_tokens": 0} if c.get("tokens_out") == 0 else None,
    )


def missing_token_counts(evidence: Evidence) -> list[Finding]:
    def test(call: dict[str, Any]) -> dict[str, Any] | None:
        absent = [
            name
            for name, key in (("prompt_tokens", "tokens_in"), ("completion_tokens", "tokens_out"))
            if call.get(key) is None
        ]
        return {"missing": absent} if absent else None

    return _per_call("model_call_missing_token_counts", evidence, test)


def capture_mismatch(evidence: Evidence) -> list[Finding]:
    findings: list[Finding] = []
    reported: set[tuple[str, str]] = set()

    def report(kind: str, locator: str, **detail: Any) -> None:
        if (kind, locator) not in reported:
            reported.add((kind, locator))
            findings.append(
                Finding(
                    check="trajectory_capture_mismatch",
                    subject=evidence.subject,
                    locator={"call_id": locator},
                    detail={"kind": kind, **detail},
                )
            )

    for key in evidence.owned_calls.missing:
        report("missing_captured_call", key.rsplit(":", 1)[-1])
    for key, copies in evidence.owned_calls.ambiguous:
        report("duplicated_captured_call", key.rsplit(":", 1)[-1], count=copies)
    for gap in evidence.trajectory.get("gaps") or []:
        if isinstance(gap, dict) and gap.get("code") in CONTRADICTIONS:
            locator = str(gap.get("detail") or "unknown").rsplit(":", 1)[-1]
            report(
                CONTRADICTIONS[gap["code"]],
                locator,
                observation_gap=gap["code"],
                invocation_id=gap.get("invocation_id"),
            )
    return findings


def failed_calls(evidence: Evidence) -> list[Finding]:
    bindings = evidence.owned_calls
    last = max((call["position"] for call in bindings.matched), default=None)

    def test(call: dict[str, Any]) -> dict[str, Any] | None:
        if not is_failed(call):
            return None
        terminal = bindings.complete and last is not None and call["position"] == last
        return {"status": call.get("status_code"), "error_category": call.get("error_category"), "terminal": terminal}

    return _per_call("model_call_failed", evidence, test)


def _by_model(calls: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    chains: dict[str, list[dict[str, Any]]] = {}
    for call in calls:
        ref = call.get("model_ref")
        key = f"{ref.get('type')}/{ref.get('name')}" if isinstance(ref, dict) else ""
        chains.setdefault(key, []).append(call)
    return chains


def _last_if_failed(chain: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The chain's last call in time when it failed; None when it did not, or when the order is unknown (a call
    without a start time among failed and successful ones: a retried failure must not read as the end)."""
    failed = [call for call in chain if is_failed(call)]
    if not failed:
        return None
    if len(failed) < len(chain) and any(call.get("started_at") is None for call in chain):
        return None
    last = max(chain, key=lambda call: (call.get("started_at") or 0.0, call["position"]))
    return last if is_failed(last) else None


def ended_on_failure(calls: Iterable[dict[str, Any]]) -> bool:
    """Whether some model's own last call in the rollout failed."""
    return any(_last_if_failed(chain) is not None for chain in _by_model(calls).values())


def ended_on_failed_call(evidence: Evidence) -> list[Finding]:
    """Per model, over every captured call (a failed call has no response id, so no reference binds it): its last
    call failed, which makes the rollout's reward indistinguishable from a real zero."""
    findings = []
    for model, chain in _by_model(evidence.calls).items():
        last = _last_if_failed(chain)
        if last is not None:
            detail = {
                "model_ref": model or None,
                "status": last.get("status_code"),
                "error_category": last.get("error_category"),
                "observed_calls": len(chain),
                "successful_calls": sum(is_successful(call) for call in chain),
            }
            findings.append(
                Finding(
                    check="rollout_ended_on_failed_model_call",
                    subject=evidence.subject,
                    locator=_locator(last, last["position"]),
                    detail=detail,
                )
            )
    return findings


def token_count_mismatch(evidence: Evidence) -> list[Finding]:
    prompt, completion, present = transcript_tokens(evidence.record)
    captured_prompt = sum(count(call, "tokens_in") for call in evidence.turn_calls.matched)
    captured_completion = sum(count(call, "tokens_out") for call in evidence.turn_calls.matched)
    if not present or (prompt, completion) == (captured_prompt, captured_completion):
        return []
    detail = {
        "transcript_prompt": prompt,
        "transcript_completion": completion,
        "capture_prompt": captured_prompt,
        "capture_completion": captured_completion,
    }
    return [Finding(check="rollout_token_count_mismatch", subject=evidence.subject, detail=detail)]


def _response_said_something(response: Any) -> bool:
    if not isinstance(response, dict):
        return False
    choices = [c for c in response.get("choices") or [] if isinstance(c, dict)]
    chat = any(_has_text(c.get("text")) or _has_text((c.get("message") or {}).get("content")) for c in choices)
    return chat or any(_has_text(response.get(key)) for key in ("output_text", "content", "output"))


def runaway_generation(evidence: Evidence) -> list[Finding]:
    def test(call: dict[str, Any]) -> dict[str, Any] | None:
        cut = call.get("finish_reason") in LENGTH_STOPS and not _response_said_something(call.get("response"))
        return {"finish_reason": call.get("finish_reason")} if cut else None

    return _per_call("model_call_runaway_generation", evidence, test)


ROLLOUT_CHECKS: dict[str, Callable[[Evidence], list[Finding]]] = {
    "check_execution_error": lambda evidence: [],  # reported by the runner when another check raises
    "record_unreadable": lambda evidence: [],  # reported by the runner when the row or its trajectory is unreadable
    "rollout_duplicate_identity": lambda evidence: [],  # reported by the runner, which sees every row
    "rollout_missing_agent_turns": missing_agent_turns,
    "agent_turn_hollow": hollow_turns,
    "rollout_ended_on_failed_model_call": ended_on_failed_call,
    "model_call_zero_completion_tokens": zero_completion,
    "model_call_missing_token_counts": missing_token_counts,
    "trajectory_capture_mismatch": capture_mismatch,
    "model_call_failed": failed_calls,
    "rollout_token_count_mismatch": token_count_mismatch,
    "model_call_runaway_generation": runaway_generation,
}
