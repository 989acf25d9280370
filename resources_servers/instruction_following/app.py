"""instruction_following: IFEval-style prompts whose formatting and content instructions are checked by rules.

Each row lists instruction ids and their kwargs (``instructions.py`` holds the 25 checkers). The final assistant
message is checked against every instruction. Reward: ``binary`` (default) 1.0 iff all are followed; ``fraction`` the
share followed. The row's ``grading_mode`` wins over the server's. Verify also reports each instruction's result and
a "loose" variant (the IFEval convention of also trying the reply without its first/last line and without ``*``
markup), which is reported but never rewarded.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest
from nemo_gym.metrics import aggregate_verify_responses
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseOutputMessage, NeMoGymResponseOutputText
from resources_servers.instruction_following.instructions import Instruction, Outcome, build

GradingMode = Literal["binary", "fraction"]
_ROW_FIELDS = ("instruction_id_list", "kwargs", "prompt", "grading_mode")


class InstructionFollowingResourcesServerConfig(BaseResourcesServerConfig):
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.STATELESS

    grading_mode: GradingMode = "binary"
    """Used for rows that do not set their own ``grading_mode``."""


class InstructionFollowingMetadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    instruction_id_list: list[str] = Field(min_length=1)
    kwargs: list[dict[str, Any] | None] = Field(default_factory=list)
    """One dict per instruction, in the same order (missing trailing entries mean no kwargs)."""
    prompt: str | None = None
    grading_mode: GradingMode | None = None

    @model_validator(mode="after")
    def _kwargs_align(self) -> InstructionFollowingMetadata:
        if len(self.kwargs) > len(self.instruction_id_list):
            raise ValueError(f"{len(self.kwargs)} kwargs for {len(self.instruction_id_list)} instructions")
        self.kwargs = [*self.kwargs, *([None] * (len(self.instruction_id_list) - len(self.kwargs)))]
        return self


class InstructionFollowingVerifyRequest(BaseVerifyRequest):
    """Rows keep the task in ``verifier_metadata``; older rows have the same fields at the top level."""

    model_config = ConfigDict(extra="allow")

    verifier_metadata: InstructionFollowingMetadata

    @model_validator(mode="before")
    @classmethod
    def _nest_top_level_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and "verifier_metadata" not in data and "instruction_id_list" in data:
            data = dict(data)
            data["verifier_metadata"] = {key: data.pop(key) for key in _ROW_FIELDS if key in data}
        return data


class InstructionResult(BaseModel):
    instruction_id: str
    followed: bool
    followed_loose: bool
    detail: str


class InstructionFollowingVerifyResponse(InstructionFollowingVerifyRequest, BaseVerifyResponse):
    grading_mode: GradingMode
    follow_all_instructions: bool
    follow_all_instructions_loose: bool
    follow_instruction_list: list[bool]
    instruction_results: list[InstructionResult]
    num_instructions: int
    fraction_followed: float


def final_message_text(response: NeMoGymResponse) -> str:
    """The text of the last assistant message: earlier turns of a multi-step episode are drafts."""
    for item in reversed(response.output):
        if isinstance(item, NeMoGymResponseOutputMessage):
            return "".join(part.text for part in item.content if isinstance(part, NeMoGymResponseOutputText))
    return ""


def loose_variants(text: str) -> list[str]:
    """The reply, without its first line, its last line or both, each also without ``*`` markup."""
    lines = text.split("\n")
    trimmed = [text, "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return [variant for base in trimmed for variant in (base, base.replace("*", "")) if variant]


def check_instruction(instruction_id: str, kwargs: dict[str, Any] | None, text: str) -> InstructionResult:
    """One instruction's strict and loose result; an unknown id or bad kwargs counts as not followed."""
    try:
        instruction: Instruction = build(instruction_id, kwargs)
    except KeyError:
        return InstructionResult(instruction_id=instruction_id, followed=False, followed_loose=False,
                                 detail="unknown instruction id")  # fmt: skip
    except (ValidationError, TypeError) as e:
        detail = f"invalid kwargs: {e}".splitlines()[0:2]
        return InstructionResult(instruction_id=instruction_id, followed=False, followed_loose=False,
                                 detail=" ".join(detail))  # fmt: skip
    strict = _safe_check(instruction, text)
    loose = strict.followed or any(_safe_check(instruction, variant).followed for variant in loose_variants(text))
    return InstructionResult(
        instruction_id=instruction_id, followed=strict.followed, followed_loose=loose, detail=strict.detail
    )


def _safe_check(instruction: Instruction, text: str) -> Outcome:
    try:
        return instruction.check(text)
    except Exception as e:  # a checker bug must cost this instruction, not the whole rollout
        return Outcome(False, f"checker error: {type(e).__name__}: {e}")


class InstructionFollowingResourcesServer(SimpleResourcesServer):
    config: InstructionFollowingResourcesServerConfig

    async def verify(self, body: InstructionFollowingVerifyRequest) -> InstructionFollowingVerifyResponse:
        task = body.verifier_metadata
        text = final_message_text(body.response)
        results = [check_instruction(i, k, text) for i, k in zip(task.instruction_id_list, task.kwargs, strict=True)]
        followed = [result.followed for result in results]
        mode = task.grading_mode or self.config.grading_mode
        fraction = fmean(followed)
        return InstructionFollowingVerifyResponse(
            **body.model_dump(),
            reward=fraction if mode == "fraction" else float(all(followed)),
            grading_mode=mode,
            follow_all_instructions=all(followed),
            follow_all_instructions_loose=all(result.followed_loose for result in results),
            follow_instruction_list=followed,
            instruction_results=results,
            num_instructions=len(results),
            fraction_followed=fraction,
        )

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Defaults (prompt-level strict/loose accuracy are the means of the two booleans), plus instruction-level
        accuracy overall and per instruction id."""
        metrics = aggregate_verify_responses(body.verify_responses)
        by_id: dict[str, list[bool]] = defaultdict(list)
        for row in body.verify_responses:
            for result in row.get("instruction_results") or []:
                by_id[result["instruction_id"]].append(bool(result["followed"]))
        every = [followed for values in by_id.values() for followed in values]
        if every:
            metrics.agent_metrics["instruction_level_accuracy"] = fmean(every)
            metrics.key_metrics["instruction_level_accuracy"] = fmean(every)
        for instruction_id in sorted(by_id):
            metrics.agent_metrics[f"instruction/{instruction_id}/followed"] = fmean(by_id[instruction_id])
        return metrics


if __name__ == "__main__":
    InstructionFollowingResourcesServer.run_webserver()
