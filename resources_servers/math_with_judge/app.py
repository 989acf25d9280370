"""math_with_judge: reward 1 when the model's final math answer equals the gold answer.

Equality is decided by math-verify (symbolic and numeric comparison of LaTeX or plain expressions, so ``0.5``,
``1/2`` and ``\\frac{1}{2}`` all match). math-verify is CPU-bound and can hang on pathological input, so it runs in a
warm pool of worker processes with a hard per-call deadline (see :mod:`nemo_gym.verifiers.worker_pool`); the event
loop keeps serving other requests meanwhile. Optionally an LLM judge gets a second opinion when math-verify says
"not equal" (answers in words, unusual notation); a judge that cannot be reached makes the row a ``judge_failed``
failure rather than a reward of 0.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from pydantic import ConfigDict, Field, PrivateAttr

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest, ModelServerRef
from nemo_gym.metrics import aggregate_verify_responses
from nemo_gym.verifiers.answers import assistant_text
from nemo_gym.verifiers.worker_pool import ServerPool, WorkerPool
from resources_servers.math_with_judge.judge import JudgeError, judge_equivalence
from resources_servers.math_with_judge.math_check import HEAVY_MODULES, check_answer, warm_up

JUDGE_FAILED = "judge_failed"


class MathWithJudgeResourcesServerConfig(BaseResourcesServerConfig):
    REVERIFY_MODE = "stateless"

    verifier_processes: int = Field(default=2, ge=1)
    """Warm math-verify worker processes (about one per core you can spare)."""
    verify_timeout_s: float = Field(default=10.0, gt=0)
    """Hard deadline of one math-verify call; the worker is killed and replaced when it passes (reward 0)."""
    verifier_start_method: Literal["forkserver", "spawn"] = "forkserver"
    verifier_nice: int = Field(default=5, ge=0, le=19)
    """Niceness of the workers: above 0, verification yields the CPU to the server's event loop when cores are busy."""
    should_use_judge: bool = False
    judge_model_server: ModelServerRef | None = None
    """The model server asked when math-verify says "not equal" (only with ``should_use_judge``)."""
    judge_responses_create_params: dict[str, Any] = Field(default_factory=lambda: {"input": []})
    """Create params for the judge call (model settings); its ``input`` is replaced by the judge prompt."""
    judge_check_both_orders: bool = True
    """Ask twice, gold first and answer first, and count a match only if both verdicts say equal (less order bias)."""
    max_concurrent_verifies: int | None = Field(default=None, ge=1)
    """/verify requests processed at once; the rest wait unparsed, so a burst cannot hold up other requests. Default:
    4 per verifier process without a judge (enough to keep the workers busy); unlimited with one (judge calls wait
    on the network, not on the CPU)."""


class MathWithJudgeVerifyRequest(BaseVerifyRequest):
    model_config = ConfigDict(extra="allow")

    expected_answer: str | int | float
    question: str | None = None


class MathWithJudgeVerifyResponse(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow")

    expected_answer: str | int | float
    extracted_answer: str | None = None
    library_reward: float = 0.0
    """math-verify's own verdict, before any judge."""
    judge_reward: float | None = None
    judge_evaluations: list[dict[str, Any]] | None = None
    timed_out: bool = False
    verifier_error: str | None = None


class MathWithJudgeResourcesServer(SimpleResourcesServer):
    config: MathWithJudgeResourcesServerConfig

    _verifiers: ServerPool = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        config = self.config
        if config.should_use_judge and config.judge_model_server is None:
            raise ValueError("should_use_judge needs judge_model_server: {type: responses_api_models, name: ...}")
        self._verifiers = ServerPool(
            lambda: WorkerPool(
                check_answer,
                processes=config.verifier_processes,
                timeout_s=config.verify_timeout_s,
                initializer=warm_up,
                start_method=config.verifier_start_method,
                nice=config.verifier_nice,
                preload=HEAVY_MODULES,
            )
        )

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        limit = self.config.max_concurrent_verifies
        if limit is None and not self.config.should_use_judge:
            limit = 4 * self.config.verifier_processes
        self._verifiers.attach(app, admission_limit=limit)  # warm before the first request, not during it
        return app

    async def close(self) -> None:
        """Stop the worker processes."""
        await self._verifiers.close()

    async def verify(self, body: MathWithJudgeVerifyRequest) -> MathWithJudgeVerifyResponse:
        expected = str(body.expected_answer)
        text = assistant_text(body.response)
        fields: dict[str, Any] = {}
        if text.strip():
            result = await self._verifiers.run(expected, text)
            if result.ok:
                fields |= {
                    "library_reward": result.value["score"],
                    "extracted_answer": result.value["extracted_answer"],
                }
            else:
                fields |= {"timed_out": result.timed_out, "verifier_error": result.error}
        library_reward = fields.get("library_reward", 0.0)
        reward = library_reward
        judge = self.config.judge_model_server if self.config.should_use_judge else None
        if judge is not None and library_reward < 1.0 and text.strip() and not fields.get("timed_out"):
            candidate = fields.get("extracted_answer") or text[-2000:]
            try:
                equal, evaluations = await judge_equivalence(
                    self.server_client,
                    judge.name,
                    self.config.judge_responses_create_params,
                    question=body.question or "",
                    gold=expected,
                    candidate=candidate,
                    both_orders=self.config.judge_check_both_orders,
                )
            except JudgeError as e:
                failure = {"_ng_failure_class": JUDGE_FAILED, "_ng_failure_message": str(e)}
                return MathWithJudgeVerifyResponse(**(body.model_dump() | fields | failure), reward=0.0)
            fields |= {"judge_reward": 1.0 if equal else 0.0, "judge_evaluations": evaluations}
            reward = 1.0 if equal else 0.0
        return MathWithJudgeVerifyResponse(**(body.model_dump() | fields), reward=reward)

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Default statistics plus pass@k, majority@k over the extracted answers, and the no-answer rate."""
        return aggregate_verify_responses(body.verify_responses, answer_key="extracted_answer")


if __name__ == "__main__":
    MathWithJudgeResourcesServer.run_webserver()
