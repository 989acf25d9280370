"""code_gen: competitive-programming problems; the model's Python solution is run against the row's unit tests.

The reply's last closed ```python block is the solution. Each unit test runs it in a fresh sandboxed process (see
``sandbox.py``): stdin/stdout tests when ``fn_name`` is null, call-based tests (JSON arguments in, JSON return value
out) otherwise. Reward: 1.0 when every test passes (``reward_mode: binary``), or the share of tests passed
(``reward_mode: fraction``, which runs every test). Result codes are documented in ``grading.py``.

Sandboxed runs are blocking and CPU-bound, so they go to a bounded thread pool (``num_processes`` submissions at a
time), never onto the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest
from nemo_gym.metrics import aggregate_verify_responses, category_metrics
from nemo_gym.verifiers.answers import assistant_text
from resources_servers.code_gen.grading import Grade, ResultCode, extract_code, grade_solution
from resources_servers.code_gen.sandbox import LayerMode, SandboxLimits, SandboxPolicy, check_policy, describe_layers

logger = logging.getLogger(__name__)


class CodeGenResourcesServerConfig(BaseResourcesServerConfig):
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.STATELESS

    num_processes: int = Field(default=4, ge=1)
    """Submissions graded at the same time (each runs its tests one after another)."""
    unit_test_timeout_secs: float = Field(default=10.0, gt=0)
    """CPU-time limit per test; the wall-clock limit is twice that plus one second."""
    memory_limit_mb: int = Field(default=1024, ge=64)
    output_limit_kb: int = Field(default=16 * 1024, ge=1)
    reward_mode: Literal["binary", "fraction"] = "binary"
    stop_on_first_failure: bool = True
    """Binary mode only: stop at the first failing test (fraction mode always runs every test)."""
    namespaces: LayerMode = "auto"
    """Network + PID namespaces via ``unshare``: ``required`` refuses to start without them."""
    landlock: LayerMode = "auto"
    audit_hook: bool = True
    seccomp: LayerMode = "auto"
    """A kernel filter: no new processes and no raised limits in the sandbox, also as root (where ``RLIMIT_NPROC``
    does not bind); ``required`` refuses to start without it."""


class UnitTests(BaseModel):
    inputs: list[str]
    outputs: list[str]
    fn_name: str | None = None
    """Null for stdin/stdout tests; else the function (or ``Solution`` method) to call with each input's JSON list."""

    @field_validator("inputs", "outputs", mode="before")
    @classmethod
    def _json_text(cls, values: Any) -> Any:
        """Call-based rows sometimes store arguments and results as JSON values rather than text."""
        if isinstance(values, list):
            return [value if isinstance(value, str) else json.dumps(value) for value in values]
        return values


class CodeGenVerifierMetadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    unit_tests: UnitTests
    difficulty: str | None = None


class CodeGenVerifyRequest(BaseVerifyRequest):
    model_config = ConfigDict(extra="allow")

    verifier_metadata: CodeGenVerifierMetadata


class CodeGenVerifyResponse(CodeGenVerifyRequest, BaseVerifyResponse):
    result: ResultCode
    extracted_model_code: str | None
    tests: list[dict[str, Any]]
    """One ``{status, time_s}`` per test that ran."""
    num_tests: int
    num_passed: int
    failure: dict[str, Any] | None
    unit_tests_time_taken: float
    difficulty: str | None = None


class CodeGenResourcesServer(SimpleResourcesServer):
    config: CodeGenResourcesServerConfig

    _executor: ThreadPoolExecutor | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any) -> None:
        check_policy(self.policy)
        logger.info("code_gen sandbox layers: %s", describe_layers(self.policy))

    @property
    def policy(self) -> SandboxPolicy:
        return SandboxPolicy(
            self.config.namespaces, self.config.landlock, self.config.audit_hook, seccomp=self.config.seccomp
        )

    @property
    def limits(self) -> SandboxLimits:
        return SandboxLimits(
            time_limit_s=self.config.unit_test_timeout_secs,
            memory_mb=self.config.memory_limit_mb,
            output_kb=self.config.output_limit_kb,
        )

    @property
    def executor(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.config.num_processes, thread_name_prefix="code_gen")
        return self._executor

    async def grade(self, code: str, tests: UnitTests) -> Grade:
        """Grade off the event loop, at most ``num_processes`` submissions at once."""
        stop_early = self.config.reward_mode == "binary" and self.config.stop_on_first_failure
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.executor, grade_solution, code, tests.inputs, tests.outputs, tests.fn_name, self.limits,
            self.policy, stop_early,
        )  # fmt: skip

    async def verify(self, body: CodeGenVerifyRequest) -> CodeGenVerifyResponse:
        tests = body.verifier_metadata.unit_tests
        code = extract_code(assistant_text(body.response))
        grade = Grade("no_code") if code is None else await self.grade(code, tests)
        if self.config.reward_mode == "fraction":
            reward = grade.num_passed / len(tests.inputs) if tests.inputs else 0.0
        else:
            reward = 1.0 if grade.result == "passed" else 0.0
        return CodeGenVerifyResponse(
            **body.model_dump(),
            reward=reward,
            result=grade.result,
            extracted_model_code=code,
            tests=grade.tests_as_dicts(),
            num_tests=len(tests.inputs),
            num_passed=grade.num_passed,
            failure=grade.failure,
            unit_tests_time_taken=grade.time_s,
            difficulty=body.verifier_metadata.difficulty,
        )

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Defaults (pass@k over the reward), plus how often each result code occurs and reward per difficulty."""
        metrics = aggregate_verify_responses(body.verify_responses, answer_key="extracted_model_code")
        rows = body.verify_responses
        metrics.agent_metrics |= category_metrics(rows, "result") | category_metrics(rows, "difficulty")
        return metrics


if __name__ == "__main__":
    CodeGenResourcesServer.run_webserver()
