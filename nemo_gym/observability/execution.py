"""What a model server's handler knows about one call that its answer does not say: whether it reached the upstream
engine, and whether the answer came from there or was made locally (an empty-turn refusal, a context-length stop).

The handler calls :func:`start_model_execution` and fills the returned dict as it goes; the capture middleware reads
it from the request's state after the route returned and stores it with the exchange, so the trajectory can tell an
upstream failure from a local decision. Without capture nothing reads it and it costs one dict per call.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Literal, TypedDict, cast

__all__ = ["EXECUTION_FIELDS", "EXECUTION_STATE_KEY", "ModelExecutionOutcome", "execution_of", "start_model_execution"]

EXECUTION_STATE_KEY = "nemo_gym_model_execution"
"""The attribute of ``request.state`` (the key of the ASGI scope's ``state``) that holds the outcome."""


class ModelExecutionOutcome(TypedDict):
    upstream_attempted: bool
    response_source: Literal["upstream", "local"] | None
    upstream_status_code: int | None
    local_response_reason: str | None


EXECUTION_FIELDS: tuple[str, ...] = tuple(ModelExecutionOutcome.__annotations__)


def start_model_execution(request: Any, *, upstream_attempted: bool) -> ModelExecutionOutcome:
    """A fresh outcome for this call, kept on ``request.state`` for the capture; the handler updates it in place."""
    facts = dict.fromkeys(EXECUTION_FIELDS) | {"upstream_attempted": upstream_attempted}
    setattr(request.state, EXECUTION_STATE_KEY, facts)
    return cast(ModelExecutionOutcome, facts)


def execution_of(state: MutableMapping[str, Any] | None) -> dict[str, Any]:
    """The outcome a handler left in an ASGI scope's ``state`` (only its known fields), or ``{}``."""
    outcome = (state or {}).get(EXECUTION_STATE_KEY)
    if not isinstance(outcome, dict):
        return {}
    return {field: outcome.get(field) for field in EXECUTION_FIELDS}
