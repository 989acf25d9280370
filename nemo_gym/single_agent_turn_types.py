"""The wire shapes of the ``single_agent_turn`` episode (NeMo Gym 0.7): one agent turn, then the verifier.

Its task input is a dataset row split in two: the create params the agent answers, and ``task_data``, everything else
the resources server needs (seeding and verifying). A flat row is accepted too: its other fields join ``task_data``.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, JsonValue, model_validator

from nemo_gym.base_resources_server import BaseVerifyResponse
from nemo_gym.episode_types import BaseEpisodeRequest, BaseEpisodeResponse, EpisodeFailure
from nemo_gym.observability.records import AgentObservationBundle
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming

__all__ = [
    "SingleAgentTurnFailure",
    "SingleAgentTurnRequest",
    "SingleAgentTurnResponse",
    "SingleAgentTurnResult",
    "SingleAgentTurnTaskInput",
]


class SingleAgentTurnTaskInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    responses_create_params: NeMoGymResponseCreateParamsNonStreaming
    task_data: dict[str, JsonValue]

    @model_validator(mode="before")
    @classmethod
    def _gather_task_data(cls, value: object) -> object:
        """Flat fields beside ``task_data`` move into it; the same key with two different values is an error."""
        if not isinstance(value, Mapping):
            return value
        rest = dict(value)
        params = rest.pop("responses_create_params", None)
        task_data = rest.pop("task_data", {})
        if not isinstance(task_data, Mapping):
            return value  # the field's own validation names the problem
        for key in rest.keys() & task_data.keys():
            if rest[key] != task_data[key]:
                raise ValueError(f"task field {key!r} has one value in task_data and another beside it")
        return {"responses_create_params": params, "task_data": {**task_data, **rest}}


class SingleAgentTurnResult(BaseVerifyResponse):
    """The verifier's answer (each environment adds its own fields) with the agent's observations."""

    model_config = ConfigDict(extra="allow")

    ng_agent_observations: AgentObservationBundle | None = None


class SingleAgentTurnFailure(EpisodeFailure):
    """A failure with the agent's answer, when it got that far."""

    partial_response: NeMoGymResponse | None = None


class SingleAgentTurnRequest(BaseEpisodeRequest[SingleAgentTurnTaskInput]):
    pass


class SingleAgentTurnResponse(BaseEpisodeResponse[SingleAgentTurnResult]):
    failure: SingleAgentTurnFailure | None = None
