"""A resources server for rollout-collection tests: the reward is in the row, and verifies can be made to fail.

``expected_reward`` (row field) is the reward; ``fail_every: N`` makes every Nth ``/verify`` answer HTTP 500 (an
infrastructure failure, not a low reward); ``judge_fail_every: N`` answers a judge failure instead; ``verify_delay_s``
slows verification down so a run can be interrupted mid-way. Verification reads only the row, so the server is
``stateless`` for reverification; ``reverify_mode`` makes it claim another mode (to test the refusal).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import ClassVar

from fastapi import HTTPException
from pydantic import ConfigDict

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ReverifyMode,
    SimpleResourcesServer,
)


class RolloutTestEnvConfig(BaseResourcesServerConfig):
    REVERIFY_MODE: ClassVar[ReverifyMode] = "stateless"

    fail_every: int = 0
    judge_fail_every: int = 0
    verify_delay_s: float = 0.0
    reverify_mode: ReverifyMode | None = None


class RolloutTestVerifyRequest(BaseVerifyRequest):
    model_config = ConfigDict(extra="allow")

    expected_reward: float = 0.0


class RolloutTestVerifyResponse(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow")


class RolloutTestEnv(SimpleResourcesServer):
    config: RolloutTestEnvConfig

    def model_post_init(self, context: object) -> None:
        self._calls = itertools.count(1)

    async def verify(self, body: RolloutTestVerifyRequest) -> RolloutTestVerifyResponse:
        call = next(self._calls)
        if self.config.verify_delay_s:
            await asyncio.sleep(self.config.verify_delay_s)
        if self.config.fail_every and call % self.config.fail_every == 0:
            raise HTTPException(status_code=500, detail=f"verifier crashed on call {call}")
        result = RolloutTestVerifyResponse(**body.model_dump(), reward=body.expected_reward)
        if self.config.judge_fail_every and call % self.config.judge_fail_every == 0:
            return RolloutTestVerifyResponse(
                **body.model_dump(), reward=0.0, _ng_failure_class="judge_failed", _ng_failure_message="judge down"
            )
        return result

    async def reverify_mode(self) -> ReverifyMode:
        return self.config.reverify_mode or self.config.REVERIFY_MODE


if __name__ == "__main__":
    RolloutTestEnv.run_webserver()
