"""Access control and request limits of a real run (issue 13, acceptance 4), with the real ``gym`` commands.

One ``gym env start`` (weather resources server, simple agent, scripted model; each its own process) serves every
test here; token files go to a directory of the test's own. The checks: without the run's token every server kind and
the head server answer 401; with it, ``gym eval run --no-serve`` in another process scores as before; a 20 MB body is
a 413 and the server's memory stays flat; a ``text/plain`` body is a 415; a large invalid body's 422 echoes only a
short prefix; the ``openai`` SDK works against the model server with the token as its ``api_key``, and gets a 401
without it; the token is in nothing the head server serves and nothing the launcher prints.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import psutil
import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.transport import access

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

WEATHER = "example_single_tool_call"
ROWS = INSTALL_DIR / "resources_servers" / WEATHER / "data" / "example.jsonl"
HANG_GUARD_S = 120
MB = 1_000_000


@dataclass
class Stack:
    head_url: str
    head_port: int
    token: str
    urls: dict[str, str]  # instance name -> url
    pids: dict[str, int]
    workdir: Path
    env: dict[str, str]
    printed: list[str]

    @property
    def auth(self) -> dict[str, str]:
        return {access.TOKEN_HEADER: self.token}

    def gym(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
        done = subprocess.run(
            [sys.executable, "-m", "nemo_gym.cli.main", *args], cwd=self.workdir, env=env or self.env,
            capture_output=True, text=True, timeout=HANG_GUARD_S * 2,
        )  # fmt: skip
        return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("access")
    env = os.environ | {
        "NEMO_GYM_ENV_YAML": "", "PYTHONUNBUFFERED": "1", access.TOKEN_DIR_ENV_VAR: str(workdir / "tokens"),
    }  # fmt: skip
    env.pop(access.TOKEN_ENV_VAR, None)
    with pytest.MonkeyPatch.context() as patch:  # this process looks for token files where the launcher writes them
        patch.setenv(access.TOKEN_DIR_ENV_VAR, env[access.TOKEN_DIR_ENV_VAR])
        yield from _started(workdir, env)


def _started(workdir: Path, env: dict[str, str]) -> Iterator[Stack]:
    launcher = subprocess.Popen(
        [sys.executable, "-m", "nemo_gym.cli.main", "env", "start", "--resources-server", WEATHER, "--model-type",
         "scripted_model", "+shared_venv=true", "+head_server={port: 0}", f"+cache_dir={workdir / 'cache'}"],
        cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert launcher.stdout is not None
    printed: list[str] = []
    try:
        for line in launcher.stdout:  # blocks until the launcher prints; ends if it exits
            printed.append(line)
            if line.startswith("Press Ctrl-C to stop."):
                break
        head = re.search(r"Head server: (http://127\.0\.0\.1:(\d+))", "".join(printed))
        assert head, "".join(printed)
        drain = threading.Thread(target=lambda: printed.extend(launcher.stdout or ()), daemon=True)
        drain.start()  # keep reading, so the launcher never blocks on a full pipe
        token_path = access.token_file("127.0.0.1", int(head.group(2)))
        assert token_path.parent == workdir / "tokens"
        assert oct(token_path.stat().st_mode & 0o777) == "0o600"
        token = token_path.read_text().strip()
        instances = httpx.get(
            f"{head.group(1)}/server_instances", headers={access.TOKEN_HEADER: token}, timeout=HANG_GUARD_S
        ).json()
        yield Stack(
            head_url=head.group(1), head_port=int(head.group(2)), token=token,
            urls={i["name"]: i["url"] for i in instances}, pids={i["name"]: i["pid"] for i in instances},
            workdir=workdir, env=env, printed=printed,
        )  # fmt: skip
    finally:
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=HANG_GUARD_S) == 0
    assert not token_path.exists(), "the token file outlived its run"


def agent_url(stack: Stack) -> str:
    return stack.urls[f"{WEATHER}_simple_agent"]


def kinds(stack: Stack) -> dict[str, str]:
    """One url per server kind, and the head server's."""
    return {
        "model": stack.urls["policy_model"],
        "resources": stack.urls[WEATHER],
        "agent": agent_url(stack),
        "head": stack.head_url,
    }


def first_row() -> dict:
    return orjson.loads(ROWS.read_bytes().splitlines()[0])


def test_without_the_token_every_server_kind_and_the_head_server_answer_401(stack: Stack) -> None:
    for kind, url in kinds(stack).items():
        for headers in ({}, {access.TOKEN_HEADER: "not-the-token"}, {"Authorization": "Bearer not-the-token"}):
            answer = httpx.get(f"{url}/", headers=headers, timeout=HANG_GUARD_S)
            assert answer.status_code == 401, (kind, headers, answer.text)
            assert "token" in answer.json()["error"].lower() and len(answer.content) < 200
        assert httpx.get(f"{url}/", headers=stack.auth, timeout=HANG_GUARD_S).status_code == 200, kind
    for route in ("/global_config_dict_yaml", "/server_instances"):
        assert httpx.get(stack.head_url + route, timeout=HANG_GUARD_S).status_code == 401
    # The calls that cost something: a rollout, and a model call.
    assert httpx.post(f"{agent_url(stack)}/run", json=first_row(), timeout=HANG_GUARD_S).status_code == 401
    model_call = {"model": "scripted", "input": "hi"}
    answer = httpx.post(f"{stack.urls['policy_model']}/v1/responses", json=model_call, timeout=HANG_GUARD_S)
    assert answer.status_code == 401


def test_with_the_token_a_run_from_another_shell_scores_as_before(stack: Stack) -> None:
    answer = httpx.post(f"{agent_url(stack)}/run", json=first_row(), headers=stack.auth, timeout=HANG_GUARD_S)
    assert answer.status_code == 200 and answer.json()["reward"] == 1.0, answer.text

    output = stack.workdir / "results" / "no_serve.jsonl"
    code, out = stack.gym(
        "eval", "run", "--no-serve", "--agent", f"{WEATHER}_simple_agent", "--input", str(ROWS),
        "--output", str(output), f"+head_server.port={stack.head_port}",
    )  # fmt: skip
    assert code == 0, out
    assert [orjson.loads(line)["reward"] for line in output.read_bytes().splitlines()] == [1.0] * 5

    code, out = stack.gym("env", "status", f"+head_server.port={stack.head_port}")
    assert code == 0 and "3 / 3 servers healthy" in out, out

    # Another user (no token file, no NEMO_GYM_RUN_TOKEN): one line that says what is missing, no traceback.
    stranger = stack.env | {access.TOKEN_DIR_ENV_VAR: str(stack.workdir / "no_tokens")}
    code, out = stack.gym(
        "eval", "run", "--no-serve", "--agent", f"{WEATHER}_simple_agent", "--input", str(ROWS),
        "--output", str(stack.workdir / "results" / "stranger.jsonl"), f"+head_server.port={stack.head_port}",
        env=stranger,
    )  # fmt: skip
    assert code != 0 and "wants the run's token" in out and "Traceback" not in out, out
    code, out = stack.gym("env", "status", f"+head_server.port={stack.head_port}", env=stranger)
    assert code != 0 and "wants the run's token" in out and "Traceback" not in out, out


def test_the_token_is_in_nothing_served_or_printed(stack: Stack) -> None:
    for route in ("/", "/global_config_dict_yaml", "/server_instances"):
        served = httpx.get(stack.head_url + route, headers=stack.auth, timeout=HANG_GUARD_S).text
        assert stack.token not in served and access.RUN_TOKEN_KEY not in served, route
    assert stack.token not in "".join(stack.printed)
    for log in (stack.workdir / "results" / "logs").glob("*.log"):
        assert stack.token not in log.read_text(errors="replace"), log


def _post_raw(url: str, headers: dict[str, str], chunks: Iterator[bytes] | bytes) -> httpx.Response:
    return httpx.post(url, content=chunks, headers=headers, timeout=HANG_GUARD_S)


def test_a_20_mb_body_is_a_413_and_the_server_memory_stays_flat(stack: Stack) -> None:
    url = f"{agent_url(stack)}/run"
    agent = psutil.Process(stack.pids[f"{WEATHER}_simple_agent"])
    json_headers = {**stack.auth, "Content-Type": "application/json"}
    before = agent.memory_info().rss
    body = b'{"responses_create_params": {"input": "' + b"x" * (20 * MB) + b'"}}'
    declared = _post_raw(url, json_headers, body)
    assert declared.status_code == 413, declared.text[:300]
    assert "server_max_body_bytes" in declared.json()["error"]

    def twenty_mb_in_chunks() -> Iterator[bytes]:  # no Content-Length: the size is known only while reading
        yield b'{"responses_create_params": {"input": "'
        for _ in range(20):
            yield b"x" * MB
        yield b'"}}'

    chunked = _post_raw(url, json_headers, twenty_mb_in_chunks())
    assert chunked.status_code == 413, chunked.text[:300]
    growth = agent.memory_info().rss - before
    assert growth < 10 * MB, f"the agent grew by {growth / MB:.1f} MB refusing two 20 MB bodies"
    # Still serving, on a body of a legitimate size.
    answer = httpx.post(url, json=first_row(), headers=stack.auth, timeout=HANG_GUARD_S)
    assert answer.status_code == 200 and answer.json()["reward"] == 1.0


def test_text_plain_and_form_bodies_are_a_415_json_ones_are_not(stack: Stack) -> None:
    for kind, url in kinds(stack).items():
        if kind == "head":
            continue
        path = "/v1/responses" if kind == "model" else "/run" if kind == "agent" else "/verify"
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            answer = _post_raw(url + path, {**stack.auth, "Content-Type": content_type}, b'{"a": 1}')
            assert answer.status_code == 415, (kind, content_type, answer.text)
        no_type = _post_raw(url + path, stack.auth, b'{"a": 1}')
        assert no_type.status_code == 415, (kind, no_type.text)
        json_like = _post_raw(url + path, {**stack.auth, "Content-Type": "application/merge-patch+json"}, b"{}")
        assert json_like.status_code == 422, (kind, json_like.text)  # admitted, then refused by the route's model


def test_a_large_invalid_body_gets_a_422_that_echoes_only_a_short_prefix(stack: Stack) -> None:
    big = "y" * (5 * MB)
    bodies = {
        "agent": (f"{agent_url(stack)}/run", {"responses_create_params": {"input": [{"role": "bogus", "content": big}]}}),
        "model": (f"{stack.urls['policy_model']}/v1/responses", {"input": big, "temperature": big}),
        "resources": (f"{stack.urls[WEATHER]}/verify", {"responses_create_params": big}),
    }  # fmt: skip
    for kind, (url, body) in bodies.items():
        answer = httpx.post(url, json=body, headers=stack.auth, timeout=HANG_GUARD_S)
        assert answer.status_code == 422, (kind, answer.text[:300])
        assert len(answer.content) < 20_000, f"{kind}: a {len(answer.content)}-byte error for a 5 MB body"
        assert "bytes)" in answer.text, answer.text  # the prefix says how much was left out


def test_the_openai_sdk_with_the_token_as_api_key_reaches_the_model_server(stack: Stack) -> None:
    import openai

    base_url = f"{stack.urls['policy_model']}/v1"
    model = openai.OpenAI(base_url=base_url, api_key=stack.token, max_retries=0, timeout=HANG_GUARD_S)
    response = model.responses.create(model="scripted", input="What is the weather in Paris?")
    assert response.output[0].type == "function_call"
    stranger = openai.OpenAI(base_url=base_url, api_key="sk-not-the-token", max_retries=0, timeout=HANG_GUARD_S)
    with pytest.raises(openai.AuthenticationError):
        stranger.responses.create(model="scripted", input="hi")
