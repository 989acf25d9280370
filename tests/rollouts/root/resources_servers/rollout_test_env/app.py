"""A resources server for rollout-collection tests: the reward is in the row, and verifies can be made to fail.

``expected_reward`` (row field) is the reward; ``fail_every: N`` makes every Nth ``/verify`` answer HTTP 500 (an
infrastructure failure, not a low reward); ``judge_fail_every: N`` answers a judge failure instead;
``hold_verifies_after: N`` holds every ``/verify`` after the Nth until ``release_file`` exists, so a test can act (kill
a server, interrupt the run) while the run is known to be mid-way, whatever the speed of the machine; ``held_file``
gets one line per verify being held, so a test can wait until a known number of rollouts is in flight; ``holds`` adds
more such points (``{after: N, release_file: PATH}``), and ``exit_at_start_if``: a path whose existence makes the
server exit at start (a server that dies on every restart). Verification
reads only the row, so the server is ``stateless`` for reverification; ``reverify_mode`` makes it claim another mode
(to test the refusal).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path
from typing import ClassVar

from fastapi import HTTPException, Request
from pydantic import BaseModel, ConfigDict

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ReverifyMode,
    SimpleResourcesServer,
)


class Hold(BaseModel):
    after: int
    release_file: str


class RolloutTestEnvConfig(BaseResourcesServerConfig):
    REVERIFY_MODE: ClassVar[ReverifyMode] = "stateless"

    fail_every: int = 0
    judge_fail_every: int = 0
    hold_verifies_after: int = 0
    release_file: str | None = None
    held_file: str | None = None
    holds: list[Hold] = []
    exit_at_start_if: str | None = None
    reverify_mode: ReverifyMode | None = None


class RolloutTestVerifyRequest(BaseVerifyRequest):
    model_config = ConfigDict(extra="allow")

    expected_reward: float = 0.0


class RolloutTestVerifyResponse(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow")


class RolloutTestEnv(SimpleResourcesServer):
    config: RolloutTestEnvConfig

    def model_post_init(self, context: object) -> None:
        if self.config.exit_at_start_if and Path(self.config.exit_at_start_if).exists():
            os._exit(3)
        self._calls = itertools.count(1)

    async def verify(self, body: RolloutTestVerifyRequest, request: Request) -> RolloutTestVerifyResponse:
        call = next(self._calls)
        if self.config.hold_verifies_after and call > self.config.hold_verifies_after:
            await self._held_until_released(request, self.config.release_file)
        for hold in self.config.holds:
            if call > hold.after:
                await self._held_until_released(request, hold.release_file)
        if self.config.fail_every and call % self.config.fail_every == 0:
            raise HTTPException(status_code=500, detail=f"verifier crashed on call {call}")
        result = RolloutTestVerifyResponse(**body.model_dump(), reward=body.expected_reward)
        if self.config.judge_fail_every and call % self.config.judge_fail_every == 0:
            return RolloutTestVerifyResponse(
                **body.model_dump(), reward=0.0, _ng_failure_class="judge_failed", _ng_failure_message="judge down"
            )
        return result

    async def _held_until_released(self, request: Request, release_file: str | None) -> None:
        """Wait for ``release_file``; a caller that hangs up meanwhile ends the wait (so the server can stop)."""
        release = Path(release_file) if release_file else None
        if self.config.held_file:
            with open(self.config.held_file, "a") as held:
                held.write("held\n")
        while release is None or not release.exists():
            if await request.is_disconnected():
                raise HTTPException(status_code=499, detail="the caller hung up while its verify was held")
            await asyncio.sleep(0.02)

    async def reverify_mode(self) -> ReverifyMode:
        return self.config.reverify_mode or self.config.REVERIFY_MODE


if __name__ == "__main__":
    RolloutTestEnv.run_webserver()
