"""math_with_judge: reward 1 when the model's final math answer equals the gold answer.

Equality is decided by math-verify (symbolic and numeric comparison of LaTeX or plain expressions, so ``0.5``,
``1/2`` and ``\\frac{1}{2}`` all match). math-verify is CPU-bound and can hang on pathological input, so it runs in a
warm pool of worker processes with a hard per-call deadline (see :mod:`nemo_gym.verifiers.worker_pool`); the event
loop keeps serving other requests meanwhile. Optionally an LLM judge gets a second opinion when math-verify says
"not equal" (answers in words, unusual notation); a judge that cannot be reached makes the row a ``judge_failed``
failure rather than a reward of 0.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
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
from nemo_gym.verifiers.worker_pool import WorkerPool
from resources_servers.math_with_judge.judge import JudgeError, judge_equivalence
from resources_servers.math_with_judge.math_check import check_answer, warm_up

JUDGE_FAILED = "judge_failed"


class MathWithJudgeResourcesServerConfig(BaseResourcesServerConfig):
    REVERIFY_MODE = "stateless"

    verifier_processes: int = Field(default=2, ge=1)
    """Warm math-verify worker processes (about one per core you can spare)."""
    verify_timeout_s: float = Field(default=10.0, gt=0)
    """Hard deadline of one math-verify call; the worker is killed and replaced when it passes (reward 0)."""
    verifier_start_method: Literal["forkserver", "spawn"] = "forkserver"
    verifier_nice: int = Field(default=0, ge=0, le=19)
    """Niceness of the workers: above 0, verification yields the CPU to the server's event loop when cores are busy."""
    should_use_judge: bool = False
    judge_model_server: ModelServerRef | None = None
    """The model server asked when math-verify says "not equal" (only with ``should_use_judge``)."""
    judge_responses_create_params: dict[str, Any] = Field(default_factory=lambda: {"input": []})
    """Create params for the judge call (model settings); its ``input`` is replaced by the judge prompt."""
    judge_check_both_orders: bool = True
    """Ask twice, gold first and answer first, and count a match only if both verdicts say equal (less order bias)."""


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

    _pool: WorkerPool | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any) -> None:
        if self.config.should_use_judge and self.config.judge_model_server is None:
            raise ValueError("should_use_judge needs judge_model_server: {type: responses_api_models, name: ...}")

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        inner_lifespan = app.router.lifespan_context

        @asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
            await self.verifier_pool().start()  # warm before the first request, not during it
            try:
                async with inner_lifespan(app) as state:
                    yield state
            finally:
                await self.close()

        app.router.lifespan_context = lifespan
        return app

    def verifier_pool(self) -> WorkerPool:
        """This event loop's worker pool, created on first use (tests build servers without running a lifespan)."""
        if self._pool is None or (self._pool.started and not self._pool.belongs_to_running_loop()):
            if self._pool is not None:
                self._pool.close_now()
            self._pool = WorkerPool(
                check_answer,
                processes=self.config.verifier_processes,
                timeout_s=self.config.verify_timeout_s,
                initializer=warm_up,
                start_method=self.config.verifier_start_method,
                nice=self.config.verifier_nice,
            )
        return self._pool

    async def close(self) -> None:
        """Stop the worker processes."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            if pool.belongs_to_running_loop():
                await pool.close()
            else:
                pool.close_now()

    async def verify(self, body: MathWithJudgeVerifyRequest) -> MathWithJudgeVerifyResponse:
        expected = str(body.expected_answer)
        text = assistant_text(body.response)
        fields: dict[str, Any] = {}
        if text.strip():
            result = await self.verifier_pool().run(expected, text)
            if result.ok:
                fields |= {
                    "library_reward": result.value["score"],
                    "extracted_answer": result.value["extracted_answer"],
                }
            else:
                fields |= {"timed_out": result.timed_out, "verifier_error": result.error}
        library_reward = fields.get("library_reward", 0.0)
        reward = library_reward
        if self.config.should_use_judge and library_reward < 1.0 and text.strip() and not fields.get("timed_out"):
            candidate = fields.get("extracted_answer") or text[-2000:]
            try:
                equal, evaluations = await judge_equivalence(
                    self.server_client,
                    self.config.judge_model_server.name,
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
