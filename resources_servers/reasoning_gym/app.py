"""reasoning_gym: procedurally generated reasoning tasks, scored by the reasoning-gym package's own scorers.

Each row carries everything its scorer needs (``question``, ``answer`` and the generator's ``metadata``, whose
``source_dataset`` names the task), so rows are self-contained and any number can be generated offline with
``generate_data.py``. The reward is the scorer's float: many tasks give partial credit (e.g. a nearly sorted list).

The model's answer is the last ``<answer>...</answer>`` in its text, else the last ``\\boxed{}``, else the whole
text. Scoring runs in a warm worker pool with a deadline, like math_with_judge.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from pydantic import ConfigDict, Field, PrivateAttr, field_validator

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest
from nemo_gym.metrics import aggregate_verify_responses, category_metrics
from nemo_gym.verifiers.answers import assistant_text, last_boxed
from nemo_gym.verifiers.worker_pool import ServerPool, WorkerPool
from resources_servers.reasoning_gym.scoring import HEAVY_MODULES, score_entry, warm_up

_ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def extract_answer(text: str) -> str:
    """The last ``<answer>`` block, else the last ``\\boxed{}``, else the whole (stripped) text."""
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        return tagged[-1].strip()
    boxed = last_boxed(text)
    return boxed if boxed is not None else text.strip()


class ReasoningGymResourcesServerConfig(BaseResourcesServerConfig):
    REVERIFY_MODE = "stateless"

    scorer_processes: int = Field(default=1, ge=1)
    """Warm scorer processes. Most scorers take microseconds, so one is usually enough."""
    score_timeout_s: float = Field(default=10.0, gt=0)
    """Deadline of one scorer call; past it the worker is replaced and the reward is 0 (``timed_out``)."""
    max_concurrent_verifies: int = Field(default=16, ge=1)
    """/verify requests processed at once; the rest wait unparsed, so a burst cannot hold up other requests."""


class ReasoningGymVerifyRequest(BaseVerifyRequest):
    model_config = ConfigDict(extra="allow")

    question: str = ""
    answer: Any = None
    """The generator's reference answer (None for tasks with many valid answers, which the scorer checks itself)."""
    metadata: dict[str, Any]
    """The generator's metadata; ``source_dataset`` is the task name."""

    @field_validator("metadata")
    @classmethod
    def _names_a_task(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(value.get("source_dataset"), str) or not value["source_dataset"]:
            raise ValueError("metadata.source_dataset must name the reasoning-gym task that generated the row")
        return value


class ReasoningGymVerifyResponse(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow")

    task_name: str
    score: float
    extracted_answer: str | None = None
    timed_out: bool = False
    scorer_error: str | None = None


class ReasoningGymResourcesServer(SimpleResourcesServer):
    config: ReasoningGymResourcesServerConfig

    _scorers: ServerPool = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        config = self.config
        self._scorers = ServerPool(
            lambda: WorkerPool(
                score_entry,
                processes=config.scorer_processes,
                timeout_s=config.score_timeout_s,
                initializer=warm_up,
                preload=HEAVY_MODULES,
            )
        )

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        self._scorers.attach(app, admission_limit=self.config.max_concurrent_verifies)
        return app

    async def close(self) -> None:
        """Stop the scorer processes."""
        await self._scorers.close()

    async def verify(self, body: ReasoningGymVerifyRequest) -> ReasoningGymVerifyResponse:
        task_name = body.metadata["source_dataset"]
        text = assistant_text(body.response)
        fields: dict[str, Any] = {"task_name": task_name, "score": 0.0}
        if text.strip():
            answer = extract_answer(text)
            fields["extracted_answer"] = answer
            entry = {"question": body.question, "answer": body.answer, "metadata": body.metadata}
            result = await self._scorers.run(task_name, answer, entry)
            if result.ok:
                fields["score"] = result.value
            else:  # a scorer that raises on a malformed answer scores it 0, like a wrong one
                fields |= {"timed_out": result.timed_out, "scorer_error": result.error}
        return ReasoningGymVerifyResponse(**(body.model_dump() | fields), reward=fields["score"])

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Default statistics and pass@k, plus each task's share of rollouts and mean reward."""
        metrics = aggregate_verify_responses(body.verify_responses, answer_key="extracted_answer")
        metrics.agent_metrics |= category_metrics(body.verify_responses, "task_name")
        return metrics


if __name__ == "__main__":
    ReasoningGymResourcesServer.run_webserver()
