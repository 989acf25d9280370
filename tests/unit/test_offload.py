"""``CpuOffload`` without Ray: calls run in a local process pool (never on the event loop), Ray is not used."""

from __future__ import annotations

import asyncio
import os

import pytest

from nemo_gym.verifiers.offload import RAY_ADDRESS_ENV_VAR, CpuOffload


async def test_without_a_cluster_calls_run_in_worker_processes(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(RAY_ADDRESS_ENV_VAR, raising=False)
    offload = CpuOffload(max_in_flight=3, processes=2)
    assert not offload.uses_ray
    try:
        pids = await asyncio.gather(*(offload.run(os.getpid) for _ in range(6)))
    finally:
        offload.close()
    assert os.getpid() not in pids and len(pids) == 6


def test_the_node_that_started_the_server_selects_ray(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(RAY_ADDRESS_ENV_VAR, "127.0.0.1:6379")
    assert CpuOffload().uses_ray and CpuOffload().ray_address == "127.0.0.1:6379"
    with pytest.raises(ValueError, match="max_in_flight"):
        CpuOffload(max_in_flight=0)
