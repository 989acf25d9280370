"""repo_repair: fix a bug in a small Python repository, inside the rollout's own container; reward = its tests pass.

A SWE-style environment on real containers (the ``docker`` sandbox provider: podman or Docker, see
``nemo_gym/sandbox/providers/docker/runtime.py``). Each task row carries its repository (``repo``: path → text) and
``test_command``. Its image is built ``FROM`` the locally made base image with the repository committed at
``/task/repo``, once per content hash. Per rollout, ``/seed_session`` starts a container of that image (no network,
read-only root, memory, CPU and process limits) and copies the repository into its tmpfs work directory; the tools
``read_file``, ``write_file``, ``run_command`` and ``apply_patch`` act in that container only, each command under a
deadline and with everything it started killed when it returns (so a fork bomb or a background job dies with it).

``/verify`` takes the agent's change to the code (``git diff`` against the task's commit, test files excluded, so
editing the tests earns nothing), applies it in a fresh container of the task image and runs the task's tests there:
reward 1.0 when they pass, else 0.0. A container that cannot be started or no longer answers is an infrastructure
failure (an error, retried by the collector as such), never a reward of 0.

Concurrent rollouts hold at most ``max_containers`` containers; a seed waits for a free slot. A rollout that is
never verified or closed gives its slot back after ``rollout_ttl_s``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field, PrivateAttr

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.global_config import get_global_config_dict
from nemo_gym.resources_sessions import ResourcesCloseSessionRequest, ResourcesCloseSessionResponse
from nemo_gym.sandbox import AsyncSandbox, SandboxExecResult, SandboxSpec, resolve_provider_config
from nemo_gym.sandbox.providers.docker import DockerProvider
from nemo_gym.sandbox.providers.docker.runtime import ContainerRuntime, build_image
from nemo_gym.sandbox.utils import command_leaving_nothing
from nemo_gym.server_utils import SESSION_ID_KEY

TASK_DIR = "/task/repo"
"""Where the task image holds the repository, committed (read-only at run time)."""
WORK_DIR = "/work/repo"
"""The rollout's writable copy, on the container's tmpfs."""
IMAGE_NAME = "nemo-gym-repo-repair"
_COMMIT = "git init -q && git add -A && git -c user.name=task -c user.email=task@localhost commit -qm task"
_NOT_TESTS = " ".join(
    shlex.quote(spec)
    for spec in (
        *("--", ".", ":(exclude)tests", ":(exclude)*conftest.py", ":(exclude)*__pycache__*", ":(exclude).pytest_cache"),
        *(f":(exclude){name}" for name in ("pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")),
    )
)
"""The paths whose changes count: everything but the tests and what configures them, and no caches."""


async def task_image(runtime: ContainerRuntime, repo: dict[str, str]) -> str:
    """The task's image (built on first use): the base image with ``repo`` committed at :data:`TASK_DIR`."""
    return await build_image(runtime, IMAGE_NAME, repo, target_dir=TASK_DIR, run=_COMMIT)


class RepoRepairResourcesServerConfig(BaseResourcesServerConfig):
    sandbox_provider: str | dict[str, Any] = "repo_repair_sandbox"
    """The sandbox block (a top-level config key) naming the ``docker`` provider and its settings."""
    max_containers: int = Field(default=8, ge=1)
    """Containers held at once by concurrent rollouts; further seeds wait for a slot."""
    slot_wait_s: float = Field(default=600, gt=0)
    """How long a seed waits for a free slot before it fails (an infrastructure failure)."""
    rollout_ttl_s: float = Field(default=1800, gt=0)
    """A rollout never verified or closed gives its container back after this long."""
    command_timeout_s: float = Field(default=60, gt=0)
    """Deadline of one tool command inside the container."""
    test_timeout_s: float = Field(default=120, gt=0)
    """Deadline of the task's tests at verification."""
    memory_mib: int = Field(default=512, ge=64)
    cpus: float = Field(default=1.0, gt=0)
    max_output_chars: int = Field(default=8000, ge=100)
    """Tool output kept for the model (the end of it, where errors are)."""
    max_file_bytes: int = Field(default=200_000, ge=1)
    """The largest file ``write_file`` and patch ``apply_patch`` accept."""


class RepoRepairTask(BaseModel):
    """What a row says about its task (also part of the seed and verify bodies)."""

    task_id: str
    repo: dict[str, str]
    test_command: str = "python3 -m pytest -q -p no:cacheprovider tests"


class RepoRepairSeedSessionRequest(BaseSeedSessionRequest, RepoRepairTask):
    pass


class RepoRepairVerifyRequest(BaseVerifyRequest, RepoRepairTask):
    pass


class RepoRepairVerifyResponse(BaseVerifyResponse):
    task_id: str
    tests_passed: bool
    patch_applied: bool
    """Whether the agent's change applied to a fresh copy (a change that does not is scored 0)."""
    changed_files: list[str]
    test_output: str


class ReadFileArguments(BaseModel):
    path: str


class WriteFileArguments(BaseModel):
    path: str
    content: str


class RunCommandArguments(BaseModel):
    command: str


class ApplyPatchArguments(BaseModel):
    patch: str


@dataclass
class _Rollout:
    sandbox: AsyncSandbox
    image: str
    started: float = field(default_factory=time.monotonic)


def _tail(text: str | None, limit: int) -> str:
    text = text or ""
    return text if len(text) <= limit else f"[... {len(text) - limit} characters cut ...]\n{text[-limit:]}"


def _write_command(path: str, data: bytes) -> str:
    """A shell line that writes ``data`` to ``path`` (parents made): base64 in the command, no stdin needed."""
    quoted = shlex.quote(path)
    encoded = base64.b64encode(data).decode()
    return f'mkdir -p -- "$(dirname -- {quoted})" && printf %s {encoded} | base64 -d > {quoted}'


class RepoRepairResourcesServer(SimpleResourcesServer):
    config: RepoRepairResourcesServerConfig

    _provider: DockerProvider | None = PrivateAttr(default=None)
    _rollouts: dict[str, _Rollout] = PrivateAttr(default_factory=dict)
    _slots: asyncio.Semaphore | None = PrivateAttr(default=None)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/read_file")(self.read_file)
        app.post("/write_file")(self.write_file)
        app.post("/run_command")(self.run_command)
        app.post("/apply_patch")(self.apply_patch)
        return app

    # -- containers ---------------------------------------------------------------------------------------------

    @property
    def provider(self) -> DockerProvider:
        if self._provider is None:
            named = get_global_config_dict() if isinstance(self.config.sandbox_provider, str) else None
            config = resolve_provider_config(self.config.sandbox_provider, named)
            if set(config) != {"docker"}:
                raise ValueError(f"repo_repair runs on the docker provider; its sandbox block names {sorted(config)}")
            self._provider = DockerProvider(**config["docker"])
        return self._provider

    @property
    def slots(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.config.max_containers)
        return self._slots

    async def _image(self, task: RepoRepairTask) -> str:
        return await task_image(self.provider.runtime, task.repo)

    async def _start(self, image: str) -> AsyncSandbox:
        """A container of ``image`` with the repository copied to the work directory; waits for a slot first."""
        try:
            await asyncio.wait_for(self.slots.acquire(), timeout=self.config.slot_wait_s)
        except TimeoutError:
            raise HTTPException(503, f"no container slot freed within {self.config.slot_wait_s:g}s") from None
        sandbox = AsyncSandbox(self.provider, owns_provider=False)
        try:
            spec = SandboxSpec(
                image=image,
                resources={"memory_mib": self.config.memory_mib, "cpu": self.config.cpus},
                ttl_s=self.config.rollout_ttl_s,
                env={"PYTHONDONTWRITEBYTECODE": "1"},
            )
            await sandbox.start(spec)
            copied = await sandbox.exec(f"mkdir -p {WORK_DIR} && cp -a {TASK_DIR}/. {WORK_DIR}/", timeout_s=60)
            if copied.return_code != 0:
                raise RuntimeError(f"copying the repository into the container failed: {copied.stderr}")
        except BaseException:
            await self._stop(sandbox)
            raise
        return sandbox

    async def _stop(self, sandbox: AsyncSandbox) -> None:
        try:
            with contextlib.suppress(Exception):
                await sandbox.stop()
        finally:
            self.slots.release()

    async def _end(self, session_id: str) -> None:
        rollout = self._rollouts.pop(session_id, None)
        if rollout is not None:
            await self._stop(rollout.sandbox)

    async def _sweep_expired(self) -> None:
        now = time.monotonic()
        expired = [sid for sid, r in self._rollouts.items() if now - r.started > self.config.rollout_ttl_s]
        for session_id in expired:
            await self._end(session_id)

    def _rollout(self, request: Request) -> _Rollout:
        rollout = self._rollouts.get(request.session[SESSION_ID_KEY])
        if rollout is None:
            raise HTTPException(400, "no container for this session: call /seed_session first")
        return rollout

    async def _exec(self, sandbox: AsyncSandbox, command: str, timeout_s: float) -> SandboxExecResult:
        """``command`` in the work directory, under its deadline, leaving nothing running; a container that does not
        answer is an infrastructure failure (an error response), not a result."""
        result = await sandbox.exec(command_leaving_nothing(command, timeout_s), cwd=WORK_DIR, timeout_s=None)
        if result.error_type == "sandbox":
            raise HTTPException(502, f"the rollout's container no longer answers: {_tail(result.stderr, 300)}")
        return result

    async def _run(self, rollout: _Rollout, command: str, timeout_s: float) -> dict[str, Any]:
        """A tool's answer: exit code and the end of stdout and stderr together."""
        result = await self._exec(rollout.sandbox, command, timeout_s)
        output = (result.stdout or "") + (result.stderr or "")
        if result.return_code == 124:
            output += f"\n[timed out after {timeout_s:g}s]"
        return {"exit_code": result.return_code, "output": _tail(output, self.config.max_output_chars)}

    # -- session ------------------------------------------------------------------------------------------------

    async def seed_session(self, request: Request, body: RepoRepairSeedSessionRequest) -> BaseSeedSessionResponse:
        await self._sweep_expired()
        session_id = request.session[SESSION_ID_KEY]
        await self._end(session_id)  # seeding starts a rollout: whatever this cookie held before goes
        image = await self._image(body)
        self._rollouts[session_id] = _Rollout(sandbox=await self._start(image), image=image)
        return BaseSeedSessionResponse()

    async def close_resources_session(self, body: ResourcesCloseSessionRequest) -> ResourcesCloseSessionResponse:
        await self._end(body.resources_session_id)
        return ResourcesCloseSessionResponse(resources_session_id=body.resources_session_id)

    # -- tools --------------------------------------------------------------------------------------------------

    async def read_file(self, request: Request, body: ReadFileArguments) -> dict[str, Any]:
        """The file's text (relative paths are from the repository root)."""
        found = await self._run(self._rollout(request), f"cat -- {shlex.quote(body.path)}", 30)
        if found["exit_code"] != 0:
            return {"error": found["output"].strip() or f"cannot read {body.path}"}
        return {"content": found["output"]}

    async def write_file(self, request: Request, body: WriteFileArguments) -> dict[str, Any]:
        """Replace (or create) a file with ``content``."""
        data = body.content.encode()
        if len(data) > self.config.max_file_bytes:
            return {"error": f"content is {len(data)} bytes; the limit is {self.config.max_file_bytes}"}
        written = await self._run(self._rollout(request), _write_command(body.path, data), 30)
        if written["exit_code"] != 0:
            return {"error": written["output"].strip() or f"cannot write {body.path}"}
        return {"written": body.path, "bytes": len(data)}

    async def run_command(self, request: Request, body: RunCommandArguments) -> dict[str, Any]:
        """Run a shell command in the repository root; its exit code and the end of its output."""
        return await self._run(self._rollout(request), body.command, self.config.command_timeout_s)

    async def apply_patch(self, request: Request, body: ApplyPatchArguments) -> dict[str, Any]:
        """``git apply`` a unified diff at the repository root."""
        data = body.patch.encode()
        if len(data) > self.config.max_file_bytes:
            return {"exit_code": 1, "output": f"patch is {len(data)} bytes; the limit is {self.config.max_file_bytes}"}
        encoded = base64.b64encode(data).decode()
        command = f"printf %s {encoded} | base64 -d | git apply --whitespace=nowarn -"
        return await self._run(self._rollout(request), command, 30)

    # -- reward -------------------------------------------------------------------------------------------------

    async def verify(self, request: Request, body: RepoRepairVerifyRequest) -> RepoRepairVerifyResponse:
        session_id = request.session[SESSION_ID_KEY]
        rollout = self._rollouts.get(session_id)
        if rollout is None:
            raise HTTPException(400, "no container for this session: call /seed_session first")
        try:
            diff = await self._exec(rollout.sandbox, f"git add -A && git diff --cached --binary HEAD {_NOT_TESTS}", 60)
            names = await self._exec(rollout.sandbox, f"git diff --cached --name-only HEAD {_NOT_TESTS}", 60)
        finally:
            await self._end(session_id)
        patch = (diff.stdout or "") if diff.return_code == 0 else ""
        fresh = await self._start(rollout.image)
        try:
            applied = True
            if patch.strip():
                encoded = base64.b64encode(patch.encode()).decode()
                applying = await self._exec(fresh, f"printf %s {encoded} | base64 -d | git apply --binary -", 60)
                applied = applying.return_code == 0
            tests = await self._run(_Rollout(fresh, rollout.image), body.test_command, self.config.test_timeout_s)
        finally:
            await self._stop(fresh)
        passed = applied and tests["exit_code"] == 0
        return RepoRepairVerifyResponse(
            **body.model_dump(exclude={"repo"}),
            reward=1.0 if passed else 0.0,
            tests_passed=passed,
            patch_applied=applied,
            changed_files=(names.stdout or "").split() if names.return_code == 0 else [],
            test_output=tests["output"] if applied else f"the agent's change did not apply:\n{applying.stderr}",
        )


if __name__ == "__main__":
    RepoRepairResourcesServer.run_webserver()
