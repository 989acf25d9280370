"""The turns of an agent whose loop is ours (``simple_agent``), as the ``ng_trajectory`` it returns with its result.

With model-call capture on, the model server records each call but not which agent turn made it; the agent knows.
Each model answer becomes one turn of the root invocation that names its call by model server and response id, so
the collector joins it to the captured call and the health checks can read the turns (a hollow turn, a cut-off one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from nemo_gym.observability.trajectory import trajectory_identity

ROOT_INVOCATION = "root"


@dataclass
class AgentTurns:
    """The model answers of one rollout, in order, as the agent's loop received them."""

    model_server: str
    answers: list[tuple[float, str | None, list[Any]]] = field(default_factory=list)

    def add(self, response: dict[str, Any]) -> None:
        """One model answer (a Responses object): when it came, its id and its output items."""
        response_id = response.get("id")
        self.answers.append(
            (time.time(), response_id if isinstance(response_id, str) else None, response.get("output") or [])
        )

    def trajectory(self, row: dict[str, Any]) -> dict[str, Any]:
        """The ``ng_trajectory`` for ``row``'s rollout: its turns, each with its model call's reference."""
        task_id, rollout_id = trajectory_identity(row)
        model_ref = {"type": "responses_api_models", "name": self.model_server}
        turns = [
            {
                "invocation_id": ROOT_INVOCATION,
                "task_id": task_id,
                "rollout_id": rollout_id,
                "turn_no": number,
                "timestamp": timestamp,
                "answer": output,
                "step_count": number,
                "model_calls": [{"model_ref": model_ref, "response_id": response_id}] if response_id else [],
            }
            for number, (timestamp, response_id, output) in enumerate(self.answers, start=1)
        ]
        invocation = {"kind": "agent_invocation", "invocation_id": ROOT_INVOCATION, "status": "completed"}
        return {"task_id": task_id, "rollout_id": rollout_id, "invocations": [invocation], "turns": turns}
