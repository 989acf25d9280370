"""Ray path vs direct path on one machine: rollouts/s, CPU per rollout and peak memory of a whole `gym eval run`.

Both runs collect the same rollouts at the same concurrency against the scripted model (``tests/rollouts/root``: a
resources server, ``simple_agent``, the scripted model; no model cost, so what is measured is the framework):

* direct: ``gym eval run`` as usual, every server a child of the launcher;
* Ray: the same command with ``--ray-address`` to a one-node Ray cluster this script starts on 127.0.0.1 (its own
  ports, temp dir and token; 100 MB object store; killed at the end). The servers run as children of a Ray actor.

CPU is the user + system time every process used during the run: the ``gym`` process and all its descendants, and
for the Ray path every process of the cluster and its descendants (the servers), each sampled every 0.1 s (a process
that lives less than that is missed). Peak memory is the highest sum of RSS over the same processes.

    .venv/bin/python benchmarks/performance/ray/run.py --rollouts 4096 --concurrency 1024
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[3]
STACK = ROOT / "tests" / "rollouts" / "root"
CONFIG = STACK / "resources_servers" / "rollout_test_env" / "configs" / "rollout_test_env.yaml"


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for sock in sockets:
        sock.close()
    return ports


def tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


class Sampler(threading.Thread):
    """Every 0.1 s: the summed RSS of some process trees (its peak), and each process's own CPU time (its latest)."""

    def __init__(self, roots: list[psutil.Process]) -> None:
        super().__init__(daemon=True)
        self.roots, self.peak, self.done = roots, 0, threading.Event()
        self.cpu: dict[tuple[int, float], float] = {}
        """(pid, create time) -> user + system seconds, as last seen."""
        self.sample()
        self.baseline = sum(self.cpu.values())

    def sample(self) -> None:
        total = 0
        for root in self.roots:
            for process in tree(root):
                try:
                    with process.oneshot():
                        total += process.memory_info().rss
                        times = process.cpu_times()
                        self.cpu[(process.pid, process.create_time())] = times.user + times.system
                except psutil.Error:
                    pass
        self.peak = max(self.peak, total)

    def run(self) -> None:
        while not self.done.wait(0.1):
            self.sample()

    def cpu_seconds(self) -> float:
        return sum(self.cpu.values()) - self.baseline


def start_cluster(workdir: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    gcs, nm, om, client, al, ag, rt, metrics = free_ports(8)
    head = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--disable-usage-stats",
         "--node-ip-address=127.0.0.1", f"--port={gcs}", "--num-cpus=2", "--object-store-memory=100000000",
         f"--temp-dir={workdir}", "--include-dashboard=false", f"--node-manager-port={nm}",
         f"--object-manager-port={om}", f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={al}",
         f"--dashboard-agent-grpc-port={ag}", f"--runtime-env-agent-port={rt}", f"--metrics-export-port={metrics}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    address = f"127.0.0.1:{gcs}"
    wait = f"import ray, time\nray.init(address={address!r})\nwhile not ray.nodes(): time.sleep(0.2)\n"
    subprocess.run([sys.executable, "-c", wait], env=env, check=True, capture_output=True, timeout=180)
    return head, address


def stop_cluster(head: subprocess.Popen) -> None:
    family = tree(psutil.Process(head.pid))
    os.killpg(head.pid, signal.SIGKILL)
    for process in family:
        try:
            process.kill()
        except psutil.Error:
            pass
    head.wait(timeout=30)


def run_once(label: str, args: argparse.Namespace, workdir: Path, env: dict[str, str], extra: list[str],
             cluster: subprocess.Popen | None) -> dict[str, float | str]:  # fmt: skip
    data = workdir / "data.jsonl"
    with data.open("w") as f:
        for task in range(args.rollouts // args.repeats):
            f.write(json.dumps({"responses_create_params": {"input": f"question {task}"}}) + "\n")
    output = workdir / f"{label}.jsonl"
    command = [
        str(Path(sys.executable).parent / "gym"), "eval", "run", f"--config={CONFIG}", "+shared_venv=true",
        "+head_server={port: 0}", f"+results_dir={workdir / 'results'}", f"+cache_dir={workdir / 'cache'}",
        "--input", str(data), "--output", str(output), "--agent", "rollout_test_agent", "--num-repeats",
        str(args.repeats), "--concurrency", str(args.concurrency), "--disable-aggregation", "--overwrite", *extra,
    ]  # fmt: skip
    started = time.perf_counter()
    gym = subprocess.Popen(command, env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = Sampler([psutil.Process(gym.pid), *([psutil.Process(cluster.pid)] if cluster else [])])
    sampler.start()
    _, stderr = gym.communicate()
    sampler.done.set()
    sampler.join()
    cpu = sampler.cpu_seconds()
    if gym.returncode != 0:
        raise SystemExit(f"{label}: gym eval run failed:\n{stderr.decode()[-3000:]}")
    line = next(x for x in stderr.decode().splitlines() if "rollouts scored" in x)
    rate = float(line.rsplit("(", 1)[1].split("/s")[0])
    rows = sum(1 for _ in output.open())
    return {"path": label, "rollouts": rows, "rollouts_per_s": rate, "wall_s": time.perf_counter() - started,
            "cpu_ms_per_rollout": 1000 * cpu / rows, "peak_rss_mib": sampler.peak / 2**20}  # fmt: skip


def _safe(fn: Callable[[psutil.Process], float], process: psutil.Process) -> float:
    try:
        return float(fn(process))
    except psutil.Error:
        return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=1024)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rb", dir="/tmp"))
    token = workdir / "token"
    token.write_text(secrets.token_hex(32))
    env = os.environ | {"NEMO_GYM_EXTRA_ROOTS": str(STACK), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    results = [run_once("direct", args, workdir, env, [], None)]
    head, address = start_cluster(workdir, env)
    try:
        idle = sum(_safe(lambda p: p.memory_info().rss, p) for p in tree(psutil.Process(head.pid))) / 2**20
        results.append(run_once("ray", args, workdir, env, ["--ray-address", address], head))
        results[-1]["ray_cluster_idle_rss_mib"] = idle
    finally:
        stop_cluster(head)
    for result in results:
        print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
