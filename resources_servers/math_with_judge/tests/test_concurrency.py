"""Acceptance: math_with_judge sustains verification under concurrency 256 without stalling other requests.

Three processes, so that each measures only what it should: the server (uvicorn, as ``gym env start`` runs it, with
its two warm math-verify workers), a load generator firing 256 concurrent ``/verify`` requests, and this test, which
meanwhile probes ``GET /`` every 20 ms. If verification ran on the server's event loop (or blocked it while waiting
for a worker), the probe would wait for whole batches of verifications; with the worker pool it waits at most for a
few request parsings.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time

import httpx
import pytest

from nemo_gym import PARENT_DIR

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CONCURRENCY = 256
PROBE_INTERVAL_S = 0.02
MAX_PROBE_LATENCY_S = float(os.environ.get("MATH_WITH_JUDGE_MAX_PROBE_LATENCY_S", "0.25"))

SERVER = """
import sys, uvicorn
from unittest.mock import MagicMock
from nemo_gym.server_utils import ServerClient
from resources_servers.math_with_judge.app import MathWithJudgeResourcesServer, MathWithJudgeResourcesServerConfig

config = MathWithJudgeResourcesServerConfig(host="127.0.0.1", port=int(sys.argv[1]), entrypoint="app.py", name="math")
server = MathWithJudgeResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))
uvicorn.run(server.setup_webserver(), host=config.host, port=config.port, log_level="warning", loop="auto")
"""

LOAD = """
import asyncio, json, sys, time
import httpx

async def main(url, rows):
    limits = httpx.Limits(max_connections=len(rows), max_keepalive_connections=len(rows))
    async with httpx.AsyncClient(limits=limits, timeout=240) as client:
        start = time.perf_counter()
        replies = await asyncio.gather(*(client.post(url + "/verify", json=row) for row in rows))
        elapsed = time.perf_counter() - start
    results = [{"status": r.status_code, "reward": r.json().get("reward"), "timed_out": r.json().get("timed_out")}
               for r in replies]
    print(json.dumps({"elapsed_s": elapsed, "results": results}))

asyncio.run(main(sys.argv[1], json.loads(sys.stdin.read())))
"""


def problems(count: int) -> list[tuple[str, str, float]]:
    """Distinct (gold, answer text, expected reward) triples, so no answer is served from math-verify's caches."""
    cases = []
    for i in range(count):
        a, b = i + 2, 2 * i + 3
        kind = i % 4
        if kind == 0:  # the same fraction, written differently
            cases.append((f"\\frac{{{a}}}{{{b}}}", f"Reduce nothing: \\boxed{{\\dfrac{{{2 * a}}}{{{2 * b}}}}}", 1.0))
        elif kind == 1:  # a decimal for a terminating fraction
            cases.append((f"\\frac{{{i}}}{{4}}", f"So it is \\boxed{{{i / 4}}}.", 1.0))
        elif kind == 2:  # an expanded polynomial against its factored form
            cases.append((f"x^2+{2 * a}x+{a * a}", f"$\\boxed{{(x+{a})^2}}$", 1.0))
        else:  # a wrong integer
            cases.append((str(a * b), f"The product is \\boxed{{{a * b + 1}}}", 0.0))
    return cases


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_verification_under_concurrency_256_does_not_stall_other_requests():
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = os.environ | {"PYTHONPATH": str(PARENT_DIR), "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], cwd=PARENT_DIR, env=env)
    cases = problems(CONCURRENCY)
    rows = [
        {"responses_create_params": {"input": "Solve."}, "expected_answer": gold,
         "response": {"id": f"r{i}", "created_at": 0, "model": "m", "object": "response", "parallel_tool_calls": True,
                      "tool_choice": "auto", "tools": [],
                      "output": [{"type": "message", "id": f"m{i}", "role": "assistant", "status": "completed",
                                  "content": [{"type": "output_text", "text": text, "annotations": []}]}]}}
        for i, (gold, text, _) in enumerate(cases)
    ]  # fmt: skip
    try:
        with httpx.Client(timeout=5) as probe:
            deadline = time.monotonic() + 180
            while True:  # uvicorn listens only once the lifespan has warmed the workers
                assert server.poll() is None, "the server exited during startup"
                assert time.monotonic() < deadline, "the server did not start"
                try:
                    if probe.get(url + "/").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            load = subprocess.Popen(
                [sys.executable, "-c", LOAD, url], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            load.stdin.write(json.dumps(rows))
            load.stdin.close()
            latencies = []
            while load.poll() is None:
                started = time.perf_counter()
                assert probe.get(url + "/").status_code == 200
                latencies.append(time.perf_counter() - started)
                time.sleep(PROBE_INTERVAL_S)
            report = json.loads(load.stdout.read())
    finally:
        server.terminate()
        server.wait(timeout=30)

    results = report["results"]
    assert [r["status"] for r in results] == [200] * CONCURRENCY
    assert [r["reward"] for r in results] == [expected for _, _, expected in cases]
    assert not any(r["timed_out"] for r in results)
    print(
        f"\n{CONCURRENCY} verifies in {report['elapsed_s']:.2f} s; {len(latencies)} probes: "
        f"median {statistics.median(latencies) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms"
    )
    assert len(latencies) >= 5, "the load finished before the probe could measure anything"
    assert max(latencies) < MAX_PROBE_LATENCY_S, f"GET / took {max(latencies) * 1000:.0f} ms while verifying"


def test_a_killed_server_leaves_no_verifier_running():
    """SIGKILL gives the server no chance to stop its workers; one stuck in SymPy must still not outlive it."""
    import signal
    import threading

    import psutil

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = os.environ | {"PYTHONPATH": str(PARENT_DIR)}
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], cwd=PARENT_DIR, env=env)
    descendants: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(url + "/", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        stuck = {"responses_create_params": {"input": "q"}, "expected_answer": "10",
                 "response": {"id": "r", "created_at": 0, "model": "m", "object": "response", "tool_choice": "auto",
                              "parallel_tool_calls": True, "tools": [],
                              "output": [{"type": "message", "id": "m", "role": "assistant", "status": "completed",
                                          "content": [{"type": "output_text", "text": "\\boxed{9^{9^{9^{9^{9}}}}}",
                                                       "annotations": []}]}]}}  # fmt: skip

        def fire() -> None:
            try:
                httpx.post(url + "/verify", json=stuck, timeout=60)
            except httpx.HTTPError:
                pass  # the server is killed under it

        threading.Thread(target=fire, daemon=True).start()
        descendants = psutil.Process(server.pid).children(recursive=True)
        busy_deadline = time.monotonic() + 30
        while not any(p.cpu_percent(0.1) > 50 for p in descendants if p.is_running()):
            assert time.monotonic() < busy_deadline, "no worker picked up the stuck verification"
        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
        gone_deadline = time.monotonic() + 15
        while alive := [p for p in descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]:
            assert time.monotonic() < gone_deadline, f"left running: {[p.pid for p in alive]}"
            time.sleep(0.1)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)
        for process in descendants:  # only if the assertion above failed: leave nothing behind
            if process.is_running():
                process.kill()
