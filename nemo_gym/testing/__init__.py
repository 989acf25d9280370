"""Test helpers for server authors: a scripted upstream engine and any ASGI app, each on a real loopback socket.

Both run in their own thread with their own event loop, so sync tests (the official ``openai`` client) and async
tests (httpx against the ASGI app) can use them alike without the test's loop having to serve anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from aiohttp import web

from nemo_gym.transport import http_client

Reply = tuple[int, Any]
"""(HTTP status, JSON body); a ``str`` body is sent as plain text."""

STARTUP_TIMEOUT_S = 120.0
"""How long a test server may take to start before that is an error: a hang guard, generous because a busy machine
is slow, never wrong (the wait ends as soon as the server is up)."""


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    json: Any


class FakeUpstream:
    """An HTTP server on 127.0.0.1 that records every request and answers with ``responder(path, json)``."""

    def __init__(self, responder: Callable[[str, Any], Reply] | None = None, delay_s: float = 0.0) -> None:
        self.responder: Callable[[str, Any], Reply] = responder or (lambda path, body: (404, {"error": path}))
        self.delay_s = delay_s
        self.received: list[Received] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        """The API root a client would configure (``/v1`` included, as OpenAI-compatible engines serve it)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def bodies(self, path: str) -> list[Any]:
        return [item.json for item in self.received if item.path == path]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = await request.json() if raw else None
        self.received.append(Received(request.path, dict(request.headers), body))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            status, reply = self.responder(request.path, body)
        finally:
            self.in_flight -= 1
        if isinstance(reply, str):
            return web.Response(status=status, text=reply)
        return web.json_response(reply, status=status)

    def start(self) -> FakeUpstream:
        self._thread = threading.Thread(target=self._serve, name="fake-upstream", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=STARTUP_TIMEOUT_S):
            raise RuntimeError(f"fake upstream did not start within {STARTUP_TIMEOUT_S:g} s")
        return self

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = runner.addresses[0][1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)


@contextlib.contextmanager
def serve_in_thread(app: Any, sock: socket.socket | None = None) -> Iterator[str]:
    """Run an ASGI app under uvicorn on 127.0.0.1 (a free port, or the bound ``sock`` given) and yield its base URL."""
    if sock is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))

    def run() -> None:
        # Like server.run(), plus closing the pooled upstream session this loop's requests opened.
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(server.serve(sockets=[sock]))
            loop.run_until_complete(http_client.close_session())
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="model-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"model server did not start within {STARTUP_TIMEOUT_S:g} s")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


# ---------------------------------------------------------------------------------------------------------------------
# Several framework servers in one test process, and scripted end-to-end rollouts


def local_server_client() -> Any:
    """A ``ServerClient`` whose config starts empty; :func:`serve_servers` registers each server it starts."""
    from omegaconf import OmegaConf

    from nemo_gym.config.server_models import BaseServerConfig
    from nemo_gym.server_utils import ServerClient

    return ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=OmegaConf.create({})
    )


def _server_type(server: Any) -> str:
    from nemo_gym.base_environment_server import BaseEnvironmentServer
    from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent
    from nemo_gym.base_responses_api_model import SimpleResponsesAPIModel

    if isinstance(server, BaseEnvironmentServer):
        return "environment_servers"
    if isinstance(server, SimpleResponsesAPIAgent):
        return "responses_api_agents"
    if isinstance(server, SimpleResponsesAPIModel):
        return "responses_api_models"
    return "resources_servers"


@contextlib.contextmanager
def serve_servers(servers: dict[str, Any], client: Any) -> Iterator[dict[str, str]]:
    """Serve framework servers (instance name -> server object built with ``client``) on loopback, in threads.

    Each one's address is added to ``client``'s config as it starts, so agents reach models and resources servers by
    instance name exactly as in a real run. Yields instance name -> base URL.
    """
    urls: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        for name, server in servers.items():
            url = stack.enter_context(serve_in_thread(server.setup_webserver()))
            host, _, port = url.removeprefix("http://").rpartition(":")
            block = {_server_type(server): {"server": {"host": host, "port": int(port)}}}
            client.global_config_dict[name] = block
            urls[name] = url
        yield urls


@contextlib.contextmanager
def _isolated_config_environment() -> Iterator[None]:
    """No env.yaml or launcher hand-off variables from the developer's shell reach the composed config."""
    import os

    from nemo_gym.global_config import reset_global_config_dict

    names = ("NEMO_GYM_ENV_YAML", "NEMO_GYM_EXTRA_ROOTS", "NEMO_GYM_CONFIG_FILE", "NEMO_GYM_CONFIG_DICT",
             "NEMO_GYM_CONFIG_PATH")  # fmt: skip
    saved = {name: os.environ.get(name) for name in names}
    for name in names:
        os.environ.pop(name, None)
    os.environ["NEMO_GYM_ENV_YAML"] = ""
    reset_global_config_dict()
    try:
        yield
    finally:
        reset_global_config_dict()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def scripted_rollout(
    workdir: Any,
    config_path: Any,
    agent_name: str,
    script: list[list[dict[str, Any]]],
    row: dict[str, Any],
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """One real rollout: ``gym env start``-style processes (shared venv) for an environment config plus the scripted
    model replaying ``script``, then ``POST <agent>/run`` with ``row``. Returns the rollout; raises on a non-200."""
    import json
    from pathlib import Path

    import httpx

    from nemo_gym import INSTALL_DIR
    from nemo_gym.config import ports
    from nemo_gym.launcher import running_servers
    from nemo_gym.transport import access

    workdir = Path(workdir)
    script_path = workdir / "script.yaml"
    script_path.write_text(
        json.dumps({"policy_model": {"responses_api_models": {"scripted_model": {"script": script}}}}),  # JSON is YAML
        encoding="utf-8",
    )
    scripted = INSTALL_DIR / "responses_api_models" / "scripted_model" / "configs" / "scripted_model.yaml"
    overrides = [
        f"+config_paths=[{Path(config_path).resolve()},{scripted},{script_path}]",
        "+shared_venv=true",
        "+head_server={port: 0}",
        f"+results_dir={workdir / 'results'}",
        f"+cache_dir={workdir / 'cache'}",
    ]
    with _isolated_config_environment():
        try:
            with running_servers(overrides) as run:
                url = run.urls[agent_name]
                token = access.registered_token(url)  # the run's own token: its servers want it
                headers = {access.TOKEN_HEADER: token} if token else {}
                answer = httpx.post(f"{url}/run", json=row, headers=headers, timeout=timeout_s)
        finally:
            ports.release_all()
    if answer.status_code != 200:
        raise AssertionError(f"/run on {agent_name} answered HTTP {answer.status_code}: {answer.text}")
    return answer.json()


def assistant_response(*texts: str, extra_output: list[dict[str, Any]] | None = None) -> Any:
    """A finished ``NeMoGymResponse`` whose output is ``extra_output`` (e.g. reasoning or tool calls) followed by one
    assistant message per text: what a verifier receives, built without a model."""
    from nemo_gym.openai_utils import NeMoGymResponse

    messages = [
        {"type": "message", "id": f"msg_{i}", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": text, "annotations": []}]}
        for i, text in enumerate(texts)
    ]  # fmt: skip
    return NeMoGymResponse.model_validate(
        {"id": "resp_test", "created_at": 0, "model": "test", "object": "response", "parallel_tool_calls": True,
         "tool_choice": "auto", "tools": [], "output": [*(extra_output or []), *messages]}
    )  # fmt: skip


@contextlib.asynccontextmanager
async def asgi_clients(timeout_s: float = 60.0) -> AsyncIterator[Callable[[Any], Any]]:
    """A factory of in-process ``httpx.AsyncClient``s, one per server (``factory(server)`` serves
    ``server.setup_webserver()``, errors answered as the server answers them); all closed at the end, with the pooled
    upstream session of this loop."""
    import httpx

    clients: list[httpx.AsyncClient] = []

    def factory(server: Any) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=server.setup_webserver(), raise_app_exceptions=False)
        clients.append(httpx.AsyncClient(transport=transport, base_url="http://server", timeout=timeout_s))
        return clients[-1]

    try:
        yield factory
    finally:
        for client in clients:
            await client.aclose()
        await http_client.close_session()


def eval_run(workdir: Any, *args: str, timeout_s: float = 280.0) -> list[dict[str, Any]]:
    """``gym eval run ARGS`` in its own process (shared venv, a free head-server port, caches under ``workdir``);
    returns the scored rows of ``workdir/rollouts.jsonl``, or raises with the command's output if it failed."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    output = Path(workdir) / "rollouts.jsonl"
    command = [
        sys.executable, "-m", "nemo_gym.cli.main", "eval", "run", *args, "--output", str(output),
        "+shared_venv=true", "+head_server={port: 0}", f"+cache_dir={Path(workdir) / 'cache'}",
    ]  # fmt: skip
    env = os.environ | {"NEMO_GYM_ENV_YAML": "", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise AssertionError(f"gym eval run exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return [json.loads(line) for line in output.read_text().splitlines()]
