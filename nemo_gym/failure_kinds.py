"""One vocabulary for what went wrong in a rollout, shared by every layer (NeMo Gym 0.7's ``failure_kinds``).

A *failure kind* is a short, stable label (``transport_timeout``, ``judge_failed``, ...) that groups failures in the
failures file, the metrics and the viewer. It names what happened and nothing more: whether to retry, whether to
mask a sample and the human-readable detail belong to the failure record (``terminal``, ``mask_sample``,
``failure_reason``), never to the name, because two callers may want different answers for the same kind.

Names are ``<domain>_<condition>`` in lower case, where the domain says which layer saw the failure. An environment
that needs a label the shared set should not grow writes ``<server>:<kind>`` (for example ``gdpval:eval_missing``).

The collector also records a finer *failure class* (``model_timeout``, ``verify_failed``, ``http_429``, ...): which
hop failed, as :func:`kind_of_class` maps it onto this vocabulary. The class is detail; the kind is what is counted.

Standard library only: data tools read the vocabulary without any server's requirements, and it sits below every
other layer (``tests/unit/test_layers.py``).
"""

from __future__ import annotations

import logging
import re
from typing import Literal

__all__ = [
    "FAILURE_KINDS",
    "FailureStage",
    "is_namespaced",
    "is_registered",
    "kind_of_class",
    "stage_of_class",
    "validate_failure_kind",
]

logger = logging.getLogger(__name__)

FailureStage = Literal["admission", "seed", "agent", "verification", "cleanup"]
"""Where in an episode it failed. Left unset when the observer cannot know (a reply that never came)."""

FAILURE_STAGES: tuple[str, ...] = ("admission", "seed", "agent", "verification", "cleanup")

# Reaching another process at all.
TRANSPORT_UNREACHABLE = "transport_unreachable"
TRANSPORT_PEER_DROP = "transport_peer_drop"
TRANSPORT_TIMEOUT = "transport_timeout"
TRANSPORT_LOCAL_RESOURCE = "transport_local_resource"
# The agent's /run and the harness behind it: it ran and broke, or it never ran.
AGENT_RUN_ERROR = "agent_run_error"
AGENT_REQUEST_FAILED = "agent_request_failed"
AGENT_TIMEOUT = "agent_timeout"
AGENT_COMMAND_NOT_ALLOWED = "agent_command_not_allowed"
# Verifiers and judges.
JUDGE_FAILED = "judge_failed"
JUDGE_UNPARSEABLE = "judge_unparseable"
VERIFIER_ERROR = "verifier_error"
# Sandboxes, browsers, containers.
PROVIDER_UNAVAILABLE = "provider_unavailable"
PROVIDER_QUOTA_EXHAUSTED = "provider_quota_exhausted"
PROVIDER_OOM_KILLED = "provider_oom_killed"
# A resources server's per-rollout session.
SESSION_LOST = "session_lost"
SESSION_EXPIRED = "session_expired"
SESSION_RELEASE_FAILED = "session_release_failed"
# Cancellation and the life of processes (``kill_shaped``: the process was killed from outside, e.g. SIGTERM or OOM).
CANCELLED = "cancelled"
KILL_SHAPED = "kill_shaped"
SHUTDOWN = "shutdown"
# Writing results, and groups of rollouts.
PERSISTENCE_FAILED = "persistence_failed"
COHORT_INCOMPLETE = "cohort_incomplete"

FAILURE_KINDS: frozenset[str] = frozenset(
    {
        TRANSPORT_UNREACHABLE,
        TRANSPORT_PEER_DROP,
        TRANSPORT_TIMEOUT,
        TRANSPORT_LOCAL_RESOURCE,
        AGENT_RUN_ERROR,
        AGENT_REQUEST_FAILED,
        AGENT_TIMEOUT,
        AGENT_COMMAND_NOT_ALLOWED,
        JUDGE_FAILED,
        JUDGE_UNPARSEABLE,
        VERIFIER_ERROR,
        PROVIDER_UNAVAILABLE,
        PROVIDER_QUOTA_EXHAUSTED,
        PROVIDER_OOM_KILLED,
        SESSION_LOST,
        SESSION_EXPIRED,
        SESSION_RELEASE_FAILED,
        CANCELLED,
        KILL_SHAPED,
        SHUTDOWN,
        PERSISTENCE_FAILED,
        COHORT_INCOMPLETE,
    }
)

_NAMESPACED = re.compile(r"[a-z][a-z0-9_]*:[a-z][a-z0-9_]*")
_reported: set[str] = set()


def is_registered(name: str) -> bool:
    """Whether ``name`` is one of the shared kinds."""
    return name in FAILURE_KINDS


def is_namespaced(name: str) -> bool:
    """Whether ``name`` is an environment's own ``<server>:<kind>``. ``fullmatch``: a trailing newline is no match."""
    return _NAMESPACED.fullmatch(name) is not None


def validate_failure_kind(name: str | None) -> str | None:
    """``name`` unchanged; an unknown one is logged once per name and kept.

    Refusing it would turn a visible wrong label into a lost failure, so producers are warned instead.
    """
    if name is None or is_registered(name) or is_namespaced(name):
        return name
    if name not in _reported:
        _reported.add(name)
        logger.warning(
            "failure_kind %r is not in nemo_gym.failure_kinds: use a shared kind or '<server>:<kind>' (told once)", name
        )
    return name


# The collector's failure classes (rollouts/collector.py), by exact name or by the hop suffix of `<hop>_failed` /
# `<hop>_timeout` (the agent's 502 names the upstream path that failed).
_CLASS_KINDS: dict[str, str] = {
    "timeout": AGENT_TIMEOUT,
    "connection_error": TRANSPORT_UNREACHABLE,
    "invalid_response": AGENT_RUN_ERROR,
    "invalid_row": AGENT_REQUEST_FAILED,
    "agent_error": AGENT_RUN_ERROR,
    "agent_run_error": AGENT_RUN_ERROR,
    "agent_request_failed": AGENT_REQUEST_FAILED,
    "judge_failed": JUDGE_FAILED,
    "judge_invalid": JUDGE_UNPARSEABLE,
    "verify_failed": VERIFIER_ERROR,
    "seed_session_failed": SESSION_LOST,
    "close_session_failed": SESSION_RELEASE_FAILED,
    "no_persist": KILL_SHAPED,
    "cancelled": CANCELLED,
    "timeout_exceeded": AGENT_TIMEOUT,
}
_GATEWAY_STATUSES = frozenset({"http_429", "http_502", "http_503", "http_504"})


def kind_of_class(failure_class: str) -> str:
    """The shared kind of a collector failure class: ``model_timeout`` → ``transport_timeout``, ``http_503`` →
    ``agent_request_failed``; a class that already is a kind (or a namespaced one) is itself."""
    if is_registered(failure_class) or is_namespaced(failure_class):
        return failure_class
    if failure_class in _CLASS_KINDS:
        return _CLASS_KINDS[failure_class]
    if failure_class in _GATEWAY_STATUSES:
        return AGENT_REQUEST_FAILED
    if failure_class.startswith("http_"):
        return AGENT_RUN_ERROR
    if failure_class.endswith("_timeout"):
        return TRANSPORT_TIMEOUT
    return AGENT_RUN_ERROR  # `<tool>_failed`, `model_failed`: the agent's own call failed, so its rollout broke


def stage_of_class(failure_class: str) -> FailureStage | None:
    """Where a collector failure class failed, when the class says it (``verify_failed`` → ``verification``)."""
    if is_registered(failure_class):
        return "verification" if failure_class in (JUDGE_FAILED, JUDGE_UNPARSEABLE, VERIFIER_ERROR) else None
    hop = failure_class.rsplit("_", 1)[0]
    if hop in ("verify", "judge") or failure_class == "judge_invalid":
        return "verification"
    if hop == "seed_session":
        return "seed"
    if hop == "close_session":
        return "cleanup"
    if failure_class in ("invalid_row", "http_429"):
        return "admission"
    if failure_class.endswith(("_failed", "_timeout")):
        return "agent"  # the model or a tool, called by the agent during its turn
    return None
