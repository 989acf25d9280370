"""single_agent_turn_legacy: the ``single_agent_turn`` episode behind the flat-row ``/run`` an agent has.

The collector sends an agent's rows to the environment server that fronts it as they are (NeMo Gym 0.5 rows). This
server turns such a row into an episode (rollout id from the row's indices or ``_ng_rollout_id``, its attempt, the
task from :func:`~nemo_gym.task_materialization.materialize_task`), runs it, and answers as an agent's ``/run``
does: the verified row with its reward, or a failure row (``_ng_failure_class: environment_server_failed`` with the
episode failure's kind, stage and terminality). A typed episode request is taken as well.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from environment_servers.single_agent_turn.app import SingleAgentTurnConfig, SingleAgentTurnEnvironmentServer
from nemo_gym.episode_types import EpisodeId
from nemo_gym.observability.correlation import rollout_id_from_run_body
from nemo_gym.row_fields import (
    ATTEMPT_INDEX_KEY,
    FAILURE_CLASS_KEY,
    FAILURE_MESSAGE_KEY,
    FAILURE_TERMINAL_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
)
from nemo_gym.single_agent_turn_types import SingleAgentTurnRequest, SingleAgentTurnResponse
from nemo_gym.task_materialization import materialize_task

ENVIRONMENT_SERVER_FAILED = "environment_server_failed"
"""The failure class of a row whose episode failed; its ``failure_kind`` and ``_ng_failure_stage`` say how."""


class SingleAgentTurnLegacyEnvironmentServer(SingleAgentTurnEnvironmentServer):
    config: SingleAgentTurnConfig

    def add_episode_routes(self, app: FastAPI) -> None:
        app.post("/run")(self.run_row)
        app.post("/aggregate_metrics")(self.aggregate_metrics)

    async def run_row(self, row: dict[str, Any]) -> dict[str, Any]:
        """One flat row (or typed episode) through the episode; the answer an agent's ``/run`` would give."""
        typed = "episode_id" in row and "task" in row
        request = SingleAgentTurnRequest.model_validate(row) if typed else self.episode_of(row)
        response = await self.run_request(request)
        return self.as_row(response)

    def episode_of(self, row: dict[str, Any]) -> SingleAgentTurnRequest:
        """The episode of a flat row: its task in the resources server's task set, and which attempt this is."""
        attempt = row.get(ATTEMPT_INDEX_KEY, 0)
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
            raise ValueError(f"{ATTEMPT_INDEX_KEY} must be an integer >= 0, got {attempt!r}")
        # The rollout id without the attempt suffix: the episode id carries the attempt itself.
        rollout_id = rollout_id_from_run_body(row | {ATTEMPT_INDEX_KEY: 0}) or (
            f"{row.get(TASK_INDEX_KEY, 0)}-{row.get(ROLLOUT_INDEX_KEY, 0)}"
        )
        task = materialize_task(row, taskset=self.config.resources_server.name)
        return SingleAgentTurnRequest.model_validate(
            {"episode_id": EpisodeId(rollout_id=rollout_id, attempt=attempt), "task": task}
        )

    def as_row(self, response: SingleAgentTurnResponse) -> dict[str, Any]:
        agent_ref = {"type": "responses_api_agents", "name": self.config.agent_server.name}
        if response.failure is not None:
            failure = response.failure
            row: dict[str, Any] = {
                FAILURE_CLASS_KEY: ENVIRONMENT_SERVER_FAILED,
                FAILURE_MESSAGE_KEY: failure.failure_reason,
                "failure_kind": failure.failure_kind,
                "_ng_failure_stage": failure.stage,
                "agent_ref": agent_ref,
            }
            if failure.terminal:
                row[FAILURE_TERMINAL_KEY] = True
            if failure.partial_response is not None:
                row["_ng_failure_partial_response"] = failure.partial_response.model_dump(mode="json")
            return row
        assert response.result is not None  # the response model holds exactly one of the two
        result = response.result.model_dump(mode="json")
        if result.get("ng_agent_observations") is None:
            result.pop("ng_agent_observations", None)
        return result | {"agent_ref": agent_ref}


if __name__ == "__main__":
    SingleAgentTurnLegacyEnvironmentServer.run_webserver()
