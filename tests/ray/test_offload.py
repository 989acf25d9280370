"""Issue 18, acceptance 3: a verifier burning 50 ms of CPU per call, offloaded to Ray, leaves the event loop free.

Three processes, as in ``resources_servers/math_with_judge/tests/test_concurrency.py``: a resources server (uvicorn,
a ``SimpleResourcesServer`` whose ``/verify`` awaits ``CpuOffload.run(burn_cpu, 0.05)``), the load generator of that
test firing 256 concurrent ``/verify`` requests, and this test. The lag is measured inside the server, where it
happens: a task sleeps 5 ms over and over and records how late it wakes up (a blocked loop wakes it late). Thousands
of samples over the whole burst; the assertion is on their 90th percentile against the issue's 10 ms, so that a few
moments when this shared 2-core machine did not schedule the server at all (other processes, Ray's own workers) do
not decide it, while a loop that ran even one verification inline (50 ms) in every tenth sample would.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from nemo_gym import PARENT_DIR
from nemo_gym.config.ports import probe_free_port
from resources_servers.math_with_judge.tests.test_concurrency import LOAD, verify_row
from tests.ray.conftest import RayCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

CONCURRENCY = 256
BURN_S = 0.05
LAG_BOUND_S = 0.010
HANG_GUARD_S = 240.0

SERVER = """
import asyncio, sys, time, uvicorn
from unittest.mock import MagicMock
from nemo_gym.base_resources_server import (BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse,
                                            SimpleResourcesServer)
from nemo_gym.server_utils import ServerClient
from nemo_gym.verifiers.offload import CpuOffload
from tests.ray.burn import burn_cpu

port, address, burn_s = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
OFFLOAD = CpuOffload(ray_address=address, max_in_flight=256)
LAGS, WATCHER = [], []

async def watch_loop():
    while True:
        started = time.perf_counter()
        await asyncio.sleep(0.005)
        LAGS.append(time.perf_counter() - started - 0.005)

class BurnServer(SimpleResourcesServer):
    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=await OFFLOAD.run(burn_cpu, burn_s))

config = BaseResourcesServerConfig(host="127.0.0.1", port=port, entrypoint="app.py", name="burn", domain="other")
app = BurnServer(config=config, server_client=MagicMock(spec=ServerClient)).setup_webserver()

@app.post("/lag/start")
async def start_measuring():
    await asyncio.gather(*(OFFLOAD.run(burn_cpu, 0.2) for _ in range(4)))  # joined the cluster, workers warm
    LAGS.clear()
    if not WATCHER:
        WATCHER.append(asyncio.create_task(watch_loop()))
    return {"uses_ray": OFFLOAD.uses_ray}

@app.get("/lag")
async def lags():
    return {"lags": list(LAGS)}

uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""


def _free_port() -> int:
    return probe_free_port()  # outside the ephemeral range, which outgoing connections take ports from


def _wait_until_up(server: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        assert server.poll() is None, "the server exited during startup"
        assert time.monotonic() < deadline, f"the server did not start within {HANG_GUARD_S} s"
        try:
            if httpx.get(url + "/", timeout=HANG_GUARD_S).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)


def test_a_50ms_verifier_offloaded_to_ray_keeps_the_event_loop_lag_under_10ms(ray_env: RayCluster, tmp_path: Path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = ray_env.env | {"PYTHONPATH": str(PARENT_DIR), "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port), ray_env.address, str(BURN_S)], cwd=PARENT_DIR, env=env
    )
    try:
        _wait_until_up(server, url)
        assert httpx.post(url + "/lag/start", timeout=HANG_GUARD_S).json() == {"uses_ray": True}
        rows = [verify_row(i, "1", f"\\boxed{{{i}}}") for i in range(CONCURRENCY)]
        load = subprocess.run(
            [sys.executable, "-c", LOAD, url], input=json.dumps(rows), env=os.environ | {"PYTHONPATH": str(PARENT_DIR)},
            capture_output=True, text=True, timeout=HANG_GUARD_S,
        )  # fmt: skip
        assert load.returncode == 0, load.stderr[-2000:]
        lags = httpx.get(url + "/lag", timeout=HANG_GUARD_S).json()["lags"]
    finally:
        server.kill()
        server.wait(timeout=30)

    report = json.loads(load.stdout)
    assert [r["status"] for r in report["results"]] == [200] * CONCURRENCY
    assert [r["reward"] for r in report["results"]] == [1.0] * CONCURRENCY
    assert len(lags) > 100, "too few lag samples to judge"
    p50, p90, p99 = (statistics.quantiles(lags, n=100)[i - 1] for i in (50, 90, 99))
    print(
        f"\n{CONCURRENCY} verifies of {BURN_S * 1000:.0f} ms CPU on Ray in {report['elapsed_s']:.1f} s; event-loop lag "
        f"over {len(lags)} samples: p50 {p50 * 1000:.2f} ms, p90 {p90 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, "
        f"max {max(lags) * 1000:.1f} ms"
    )
    assert p90 < LAG_BOUND_S, f"event-loop lag p90 {p90 * 1000:.1f} ms (bound {LAG_BOUND_S * 1000:.0f} ms)"
