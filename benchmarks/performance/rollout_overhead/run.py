"""Rollout overhead benchmark: how many complete rollouts per second the framework itself can carry on this machine.

The stack is the weather environment with an instant model, started as real server processes by the launcher:
``scripted_model`` (Responses API, first answers with a ``get_weather`` call, then with a message),
``example_single_tool_call`` (the tool and the verifier) and ``simple_agent``. One rollout is one ``POST /run`` on the
agent, which makes ``/seed_session``, two model calls, one ``/get_weather`` call and ``/verify``. No model time is
involved, so every millisecond measured is framework overhead: HTTP, JSON, validation and the agent loop.

This benchmark process is the rollout driver: a bounded pool of aiohttp workers keeps exactly ``concurrency``
rollouts in flight. For each concurrency it reports throughput, CPU per rollout summed over every process (driver
and servers), peak resident memory of the whole stack, latency percentiles and failures. With ``--client collect``
it drives nothing itself: each point is the whole ``gym eval run --no-serve`` command (``collect_point.py``).

    .venv/bin/python benchmarks/performance/rollout_overhead/run.py --concurrency 16,256,1024,4096 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from collect_point import (  # noqa: E402
    CollectRun,
    collect_command,
    count_scored,
    first_run_env,
    run_collect,
    write_rows,
)
from point_results import PointResult, print_collect_table, print_table, summarize  # noqa: E402
from stack_probe import (  # noqa: E402
    MemorySampler,
    Stack,
    cpu_calibration_ms,
    machine_busy_s,
    machine_info,
    machine_steal_s,
    profiling,
    raise_open_file_limit,
    rss_growth,
)
from startup_floor import floor_for_rows  # noqa: E402

from nemo_gym.launcher import running_servers  # noqa: E402
from nemo_gym.row_fields import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY  # noqa: E402
from nemo_gym.transport import access  # noqa: E402

ENVIRONMENT = "example_single_tool_call"
AGENT = f"{ENVIRONMENT}_simple_agent"
EPISODE_CONFIG = REPO / "environments" / "example_single_tool_call_episode" / "config.yaml"
ENVIRONMENT_SERVER = f"{ENVIRONMENT}_environment_server"
"""``--path relay`` and ``--path episode``: the environment server put in front of the agent."""
RELAY = {
    ENVIRONMENT_SERVER: {
        "environment_servers": {
            "legacy_agent": {"entrypoint": "app.py", "agent_server": {"type": "responses_api_agents", "name": AGENT}}
        }
    }
}
"""``--path relay``: NeMo Gym 0.7's ``legacy_agent`` relay declared in front of the weather agent."""
NO_PROGRESS_ABORT_S = 60.0
ROLES = {
    "responses_api_agents": "agent",
    "responses_api_models": "model",
    "resources_servers": "resources",
    "environment_servers": "env server",
}
"""Short names for the collect table's CPU columns."""
STACK_HOOK = Path(__file__).resolve().parent / "server_stack"
"""The folder whose ``sitecustomize.py`` swaps the servers' HTTP server (``--stack``)."""
STACK_ENV = "ROLLOUT_BENCH_SERVER_STACK"
STACKS = ("fast", "uvicorn", "granian")
"""``--stack``: our former fast path (uvicorn with ``transport/server_protocol.py``, deleted by issue 36: run it from a
checkout at dcf2ba4), plain uvicorn with httptools (what the servers run now), granian."""


# --------------------------------------------------------------------------------------------------------------------
# Driving rollouts


def load_rows() -> list[dict[str, Any]]:
    path = REPO / "resources_servers" / ENVIRONMENT / "data" / "example.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class FrameworkClient:
    """The framework's own transport, called exactly as ``gym eval run`` calls ``/run``.

    Pooled: at most ``limit_per_host`` connections to the agent (1024 by default), further rollouts wait in the
    client's first-come-first-served queue, holding no socket.
    """

    name = "framework"

    def __init__(self, concurrency: int, timeout_s: float) -> None:
        from nemo_gym.transport.http_client import TransportConfig

        self._config = TransportConfig(total_timeout_s=timeout_s, max_attempts=1)

    async def post(self, url: str, row: dict[str, Any]) -> tuple[int, bytes]:
        from nemo_gym.transport import http_client

        resp = await http_client.request("POST", url, json=row, url_path="/run", config=self._config, retry=False)
        return resp.status, await resp.read()

    async def close(self) -> None:
        from nemo_gym.transport import http_client

        await http_client.close_session()


class RawClient:
    """A plain aiohttp session with one connection per rollout in flight: a trainer or script with its own client.

    Every rollout reaches the agent at once, so this is the case the agent's admission bound is for.
    """

    name = "raw"

    def __init__(self, concurrency: int, timeout_s: float) -> None:
        import aiohttp  # here: this process also stands for the launcher, which loads no HTTP client library

        self._headers = {"Content-Type": "application/json"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)  # connecting counts too: a swamped server accepts late
        # Idle connections are dropped before the servers' 30 s keep-alive would close them under a request.
        connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency, keepalive_timeout=15)
        self._session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)

    async def post(self, url: str, row: dict[str, Any]) -> tuple[int, bytes]:
        data = orjson.dumps(row)
        token = access.registered_token(url)  # the run's token, as a trainer with its own client sends it
        headers = {**self._headers, access.TOKEN_HEADER: token} if token else self._headers
        async with self._session.post(url, data=data, headers=headers, timeout=self._timeout) as resp:
            return resp.status, await resp.read()

    async def close(self) -> None:
        await self._session.close()


CLIENTS: dict[str, type[FrameworkClient | RawClient]] = {"framework": FrameworkClient, "raw": RawClient}
PATHS = ("direct", "relay", "episode")
"""Where a rollout enters the stack (``--path``)."""
COLLECT = "collect"
"""The third ``--client``: no driver of ours, the whole ``gym eval run --no-serve`` command (``collect_point.py``)."""


@dataclass
class Target:
    """Where a point's rollouts go: the agent's ``/run`` for our own clients; for ``--client collect`` the head
    server the collect command is pointed at and the model server whose reads time the model requests."""

    url: str
    rows: list[dict[str, Any]]
    head: tuple[str, int]
    model_pid: int
    workdir: Path


async def drive(
    url: str, rows: list[dict[str, Any]], concurrency: int, total: int, args: argparse.Namespace
) -> tuple[list[float], Counter[str], int, str, float]:
    """Run ``total`` rollouts with ``concurrency`` workers; return latencies, failures, ok count, abort reason, wall."""
    latencies: list[float] = []
    failures: Counter[str] = Counter()
    state = {"next": 0, "done": 0, "ok": 0, "stop_issuing": False}
    client = CLIENTS[args.client](concurrency, args.request_timeout)
    max_point_s = args.max_point_seconds
    clock = time.perf_counter

    async def worker() -> None:
        while not state["stop_issuing"] and state["next"] < total:
            i = state["next"]
            state["next"] = i + 1
            # Indexed as `gym eval run` indexes rows: each rollout its own id (an episode's id comes from them).
            row = rows[i % len(rows)] | {TASK_INDEX_KEY: i % len(rows), ROLLOUT_INDEX_KEY: i // len(rows)}
            started = clock()
            try:
                status, body = await client.post(url, row)
                if status != 200:
                    failures[f"http_{status}"] += 1
                elif orjson.loads(body).get("reward") != 1.0:
                    failures["wrong_reward"] += 1
                else:
                    state["ok"] += 1
            except Exception as e:  # counted by type (TimeoutError: the per-request deadline), never fatal to the run
                failures[type(e).__name__] += 1
            latencies.append(clock() - started)
            state["done"] += 1

    started = clock()
    tasks = [asyncio.create_task(worker()) for _ in range(min(concurrency, total))]
    abort = ""
    last_done, last_progress = 0, clock()
    try:
        pending: set[asyncio.Task[None]] = set(tasks)
        while pending:
            # Wakes the moment the last worker ends, so the wall time is exact, not rounded to the poll period.
            _, pending = await asyncio.wait(pending, timeout=0.5)
            now = clock()
            if state["done"] != last_done:
                last_done, last_progress = state["done"], now
            elif now - last_progress > NO_PROGRESS_ABORT_S:
                abort = f"no rollout finished for {NO_PROGRESS_ABORT_S:g} s: aborted"
                for t in tasks:
                    t.cancel()
                break
            if now - started > max_point_s and not state["stop_issuing"]:
                # Bounded runtime: stop handing out new rollouts, let those in flight finish.
                state["stop_issuing"] = True
                abort = f"point ran past {max_point_s:g} s: stopped early after {state['next']} rollouts"
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        wall = clock() - started
        await client.close()
    in_flight_lost = state["next"] - state["done"]
    if in_flight_lost > 0:
        failures["hung"] += in_flight_lost
    return latencies, failures, state["ok"], abort, wall


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def run_collect_point(
    stack: Stack, target: Target, concurrency: int, total: int, args: argparse.Namespace
) -> tuple[CollectRun, Counter[str]]:
    """One whole collect command with ``total`` rows; failures by kind as ``drive`` counts them."""
    label = f"c{concurrency}-{time.monotonic_ns()}"
    inputs = write_rows(target.rows, total, target.workdir / f"{label}-in.jsonl")
    output = target.workdir / f"{label}-out.jsonl"
    command = collect_command(AGENT, inputs, output, concurrency, target.head, target.workdir)
    spy = args.py_spy / f"c{concurrency}-collector.txt" if args.py_spy else None
    collect = await run_collect(command, target.model_pid, stack.processes, output, spy)
    failures: Counter[str] = Counter()
    if collect.exit_code:
        failures[f"exit_{collect.exit_code}"] += 1
        print(f"collect command exited {collect.exit_code}:\n{collect.output_tail}", file=sys.stderr, flush=True)
    if collect.failed:
        failures["not_reward_1"] += collect.failed
    if collect.ok + collect.failed < total:
        failures["missing"] += total - collect.ok - collect.failed
    return collect, failures


async def collect_warmup(target: Target, total: int) -> tuple[int, float]:
    """Warm the stack up with a small collect command of its own: this process then loads no HTTP client, as the
    launcher it stands for (``gym env start``) does not; its memory column stays the launcher's."""
    inputs = write_rows(target.rows, total, target.workdir / "warmup-in.jsonl")
    output = target.workdir / "warmup-out.jsonl"
    command = collect_command(AGENT, inputs, output, 32, target.head, target.workdir)
    started = time.perf_counter()
    env = first_run_env()
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env
    )
    _, err = await proc.communicate()
    if proc.returncode:
        print(f"warm-up collect command exited {proc.returncode}:\n{err.decode(errors='replace')[-2000:]}", flush=True)
    return count_scored(output)[0] if output.exists() else 0, time.perf_counter() - started


async def run_point(
    stack: Stack, target: Target, concurrency: int, total: int, args: argparse.Namespace
) -> PointResult:
    result = PointResult(concurrency=concurrency, requested=total, calibration_ms=cpu_calibration_ms())
    with MemorySampler(stack) as sampler, profiling(stack, args.py_spy, f"c{concurrency}"):
        await asyncio.sleep(0.3)  # a few samples of the resting stack
        result.rss_start_mb = sampler.samples[-1][1] if sampler.samples else 0.0
        cpu_before = stack.cpu_seconds()
        machine_before = machine_busy_s()
        steal_before = machine_steal_s()
        sampler_cpu_before = sampler.thread_cpu_s
        drive_started = time.monotonic() - sampler.t0
        collect: CollectRun | None = None
        latencies: list[float]
        if args.client == COLLECT:
            collect, failures = await run_collect_point(stack, target, concurrency, total, args)
            latencies, ok, abort, wall = [], collect.ok, "", collect.wall_s
        else:
            latencies, failures, ok, abort, wall = await drive(target.url, target.rows, concurrency, total, args)
        cpu_after = stack.cpu_seconds()
        machine_after = machine_busy_s()
        steal_after = machine_steal_s()
        await asyncio.sleep(0.3)
    result.completed = collect.ok + collect.failed if collect else len(latencies)
    result.ok = ok
    result.wall_s = round(wall, 3)
    result.rollouts_per_s = round(ok / wall, 1) if wall > 0 else 0.0
    zero = (0.0, 0.0)
    cpu = {name: round(sum(cpu_after[name]) - sum(cpu_before.get(name, zero)), 3) for name in cpu_after}
    result.cpu_system_s = round(sum(after[1] - cpu_before.get(name, zero)[1] for name, after in cpu_after.items()), 3)
    if collect is not None:
        # The probes' threads run in the launcher process; their CPU is the benchmark's, not the stack's.
        probes = collect.probe_cpu_s + sampler.thread_cpu_s - sampler_cpu_before
        cpu["launcher"] = round(max(0.0, cpu["launcher"] - probes), 3)
        cpu["collector"] = round(collect.cpu_s, 3)
        result.cpu_system_s = round(result.cpu_system_s + collect.cpu_system_s, 3)
        if collect.steady_s:
            result.steady_rollouts_per_s = round(ok / collect.steady_s, 1)
        result.first_model_request_s = round(collect.first_model_s or 0.0, 3)
        result.startup_cpu_s = round(collect.cpu_before_first_model_s or 0.0, 3)
        result.collector_reported_per_s = collect.reported_per_s or 0.0
        result.collector_rss_peak_mb = round(collect.peak_rss_mb, 1)
        # Outside the point's CPU and memory window, on the same rows: start-up beside what it cannot skip.
        result.startup_floor_s = round(await asyncio.to_thread(floor_for_rows, target.rows, total, target.workdir), 3)
    result.cpu_s_by_process = cpu
    result.cpu_ms_per_rollout = round(1000 * sum(cpu.values()) / max(ok, 1), 3)
    result.background_cpu_s = round(max(0.0, machine_after - machine_before - sum(cpu.values())), 2)
    result.steal_s = round(steal_after - steal_before, 2)
    result.rss_peak_mb = round(sampler.peak_total / 2**20, 1)
    result.rss_end_mb = round(sampler.samples[-1][1], 1) if sampler.samples else 0.0
    result.rss_peak_by_process_mb = {k: round(v / 2**20, 1) for k, v in sampler.peak_by_process.items()}
    result.pss_peak_mb = round(sampler.pss_peak_total / 2**20, 1)
    result.pss_peak_by_process_mb = {k: round(v / 2**20, 1) for k, v in sampler.pss_peak_by_process.items()}
    result.fds_peak = sampler.fds_peak
    result.rss_growth_mb = rss_growth(sampler.samples, drive_started, wall)
    result.rss_growth_by_process_mb = {
        name: rss_growth(series, drive_started, wall) for name, series in sampler.samples_by_process.items()
    }
    step = max(1, len(sampler.samples) // 200)
    result.rss_timeline_mb = [(t, round(mb, 1)) for t, mb in sampler.samples[::step]]
    result.latency_ms = {f"p{q:g}": round(1000 * percentile(latencies, q), 2) for q in (50, 90, 99, 99.9)} | {
        "max": round(1000 * max(latencies, default=float("nan")), 2)
    }
    result.failures = dict(failures)
    result.aborted = abort
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--concurrency", default="16,256,1024,4096", help="comma-separated rollouts in flight")
    parser.add_argument(
        "--rollouts-per-point",
        type=int,
        default=0,
        help="rollouts measured per concurrency and round (default: max(5000, 3 x concurrency))",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="times the whole sweep is repeated, interleaved, so a slow moment of the box hits each\n"
        "concurrency once at most; the table shows medians (default: 3)",
    )
    parser.add_argument("--warmup", type=int, default=500, help="unmeasured rollouts before the first point")
    parser.add_argument("--request-timeout", type=float, default=120.0, help="seconds one /run may take")
    parser.add_argument("--max-point-seconds", type=float, default=120.0, help="stop issuing rollouts after this")
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto", help="the driver's loop")
    parser.add_argument(
        "--client",
        choices=(*CLIENTS, COLLECT),
        default="framework",
        help="framework: the framework's pooled transport, as `gym eval run` uses it (default);\n"
        "raw: one aiohttp connection per rollout in flight, as an external trainer might;\n"
        "collect: no driver of ours: each point runs the whole `gym eval run --no-serve` command\n"
        "(rows = rollouts per point) and times it start to exit, with steady state and start-up tax",
    )
    parser.add_argument(
        "--path",
        choices=PATHS,
        default="direct",
        help="direct: rollouts go to the agent's /run (default);\n"
        "relay: to an environment server in front of it that relays /run (legacy_agent), NeMo Gym 0.7's hop;\n"
        "episode: to single_agent_turn_legacy, which runs 0.7's episode: it seeds the resources session,\n"
        "opens, drives and closes an agent session, verifies and closes the resources session",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra config override for the stack, e.g. +server_event_loop=asyncio (repeatable)",
    )
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment variable for the server processes only (repeatable)",
    )
    parser.add_argument(
        "--stack",
        default="",
        help="comma-separated HTTP servers to serve the stack with, each in turn in every round, on one new stack\n"
        f"each time (server_stack/sitecustomize.py): {', '.join(STACKS)}; default: the servers as they are",
    )
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--keep-logs", type=Path, help="keep the servers' logs in this directory")
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="profile every process during each point with py-spy (collapsed stacks, DIR/c<N>-<process>.txt)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    fd_limits = raise_open_file_limit()
    info = machine_info(fd_limits, REPO)
    print(
        f"{info['cpus']} CPUs ({info['cpu_model']}), Python {info['python']}, open files {fd_limits['soft']}, "
        f"commit {info['git']['commit'][:12]}{' (dirty)' if info['git']['dirty'] else ''}",
        flush=True,
    )

    driver_loop_factory = loop_factory(args.loop)  # imported before --server-env can hide anything from us
    for item in args.server_env:
        key, _, value = item.partition("=")
        os.environ[key] = value  # the launcher hands its environment to every server
    stacks = [name.strip() for name in args.stack.split(",") if name.strip()]
    unknown = sorted(set(stacks) - set(STACKS))
    if unknown:
        raise SystemExit(f"--stack: unknown {', '.join(unknown)} (known: {', '.join(STACKS)})")
    if "granian" in stacks:
        # granian binds its TCP address itself and serves no second socket: every stack of the run goes over TCP.
        args.override = [*args.override, "+server_unix_socket=false"]
        print("--stack granian: every stack of this run serves TCP alone (+server_unix_socket=false)", flush=True)
    # With several stacks, each round runs each of them on a new stack in turn, so a slow moment of the box hits one
    # round of one stack, not one stack's every round.
    blocks = (
        [(round_number, name) for round_number in range(1, args.rounds + 1) for name in stacks] if stacks else [(0, "")]
    )
    results: list[PointResult] = []
    startups: dict[str, list[float]] = {}
    roles: dict[str, str] = {}
    for round_number, name in blocks:
        rounds = range(round_number, round_number + 1) if round_number else range(1, args.rounds + 1)
        with server_stack(name):
            points, roles, startup_s = measure_new_stack(args, levels, rounds, name, driver_loop_factory)
        results += points
        startups.setdefault(name, []).append(round(startup_s, 2))

    summaries = summarize(results)
    print()
    if args.client == COLLECT:
        print_collect_table(summaries, roles)
    else:
        print_table(summaries)
    if results:
        print(
            f"whole run: peak RSS {max(r.rss_peak_mb for r in results):.0f} MB, "
            f"peak PSS {max(r.pss_peak_mb for r in results):.0f} MB, "
            f"{sum(r.failed for r in results)} failed of {sum(r.completed for r in results)} rollouts"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "benchmark": "rollout_overhead",
            "workload": "simple_agent + scripted_model + example_single_tool_call: /run = seed_session, "
            "2 model calls, 1 get_weather, verify",
            "machine": info,
            "startup_s": startups,
            "stacks": stacks,
            "driver_loop": args.loop,
            "client": args.client,
            "path": args.path,
            "process_roles": roles,
            "overrides": args.override,
            "server_env": args.server_env,
            "summary": [asdict(s) for s in summaries],
            "points": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(payload, indent=1))
        print(f"\nwrote {args.json}")
    return 1 if any(r.failed or r.aborted.startswith("no rollout") for r in results) else 0


def measure_new_stack(
    args: argparse.Namespace,
    levels: list[int],
    rounds: range,
    stack_name: str,
    driver_loop_factory: Callable[[], asyncio.AbstractEventLoop] | None,
) -> tuple[list[PointResult], dict[str, str], float]:
    """Start the stack, run ``rounds`` of the sweep on it, stop it: the points, the servers' roles, the start-up."""
    with contextlib.ExitStack() as stack_cm:
        label = f"{stack_name}-r{rounds.start}" if stack_name else ""
        if args.keep_logs:
            workdir = args.keep_logs / label if label else args.keep_logs
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(stack_cm.enter_context(tempfile.TemporaryDirectory(prefix="rollout-bench-")))
        configs = [
            EPISODE_CONFIG
            if args.path == "episode"
            else REPO / "resources_servers" / ENVIRONMENT / "configs" / f"{ENVIRONMENT}.yaml",
            REPO / "responses_api_models" / "scripted_model" / "configs" / "scripted_model.yaml",
        ]
        if args.path == "relay":
            relay = workdir / "relay.yaml"
            relay.write_text(json.dumps(RELAY))  # JSON is YAML
            configs.append(relay)
        overrides = [
            "+config_paths=[" + ",".join(str(c) for c in configs) + "]",
            "+shared_venv=true",
            "+head_server={port: 0}",
            f"+results_dir={workdir / 'results'}",
            f"+cache_dir={workdir / 'cache'}",
            *args.override,
        ]
        started = time.monotonic()
        run = stack_cm.enter_context(running_servers(overrides, echo=False, startup_timeout_s=120))
        startup_s = time.monotonic() - started
        server_pids = {s.name: s.popen.pid for s in run.servers if s.popen is not None}
        stack = Stack(server_pids, self_name="launcher" if args.client == COLLECT else "driver")
        host, _, port = run.head_url.removeprefix("http://").rpartition(":")
        model_pid = next(s.popen.pid for s in run.servers if s.popen and s.implementation == "scripted_model")
        roles = {s.name: ROLES.get(s.server_type, s.server_type) for s in run.servers}
        entry = AGENT if args.path == "direct" else ENVIRONMENT_SERVER
        target = Target(f"{run.urls[entry]}/run", load_rows(), (host, int(port)), model_pid, workdir)
        pids = ", ".join(f"{s.name} (pid {s.popen.pid})" for s in run.servers if s.popen is not None)
        served = f", stack: {stack_name}" if stack_name else ""
        print(f"stack ready in {startup_s:.1f} s: {pids}; client: {args.client}, path: {args.path}{served}", flush=True)
        points = run_sweep(stack, target, levels, rounds, args, driver_loop_factory)
    for point in points:
        point.stack = stack_name
    return points, roles, startup_s


@contextlib.contextmanager
def server_stack(name: str) -> Iterator[None]:
    """The environment that makes the launched servers serve with ``name`` (``server_stack/sitecustomize.py``)."""
    if not name:
        yield
        return
    saved = {key: os.environ.get(key) for key in (STACK_ENV, "PYTHONPATH")}
    os.environ[STACK_ENV] = name
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(STACK_HOOK), saved["PYTHONPATH"]) if p)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_sweep(
    stack: Stack,
    target: Target,
    levels: list[int],
    rounds: range,
    args: argparse.Namespace,
    driver_loop_factory: Callable[[], asyncio.AbstractEventLoop] | None,
) -> list[PointResult]:
    async def sweep() -> list[PointResult]:
        # The launcher's objects live as long as the run: keep the collector from walking them over and over.
        gc.collect()
        gc.freeze()
        if args.warmup:
            if args.client == COLLECT:
                ok, wall = await collect_warmup(target, args.warmup)
            else:
                warm = await drive(target.url, target.rows, 32, args.warmup, args)
                ok, wall = warm[2], warm[4]
            print(f"warm-up: {ok}/{args.warmup} ok in {wall:.1f} s", flush=True)
        results = []
        for round_number, concurrency in ((n, c) for n in rounds for c in levels):
            total = args.rollouts_per_point or max(5000, 3 * concurrency)
            result = await run_point(stack, target, concurrency, total, args)
            result.round = round_number
            if args.client == COLLECT:
                rates = (
                    f"{result.rollouts_per_s:.1f} rollouts/s end to end, {result.steady_rollouts_per_s:.1f}/s steady, "
                    f"first model request after {result.first_model_request_s:.2f} s "
                    f"({result.startup_cpu_s:.2f} s of the command's CPU)"
                )
            else:
                rates = (
                    f"{result.rollouts_per_s:.1f} rollouts/s, "
                    f"p50 {result.latency_ms['p50']:.0f} ms, p99 {result.latency_ms['p99']:.0f} ms"
                )
            print(
                f"round {round_number}, c={concurrency}: {result.ok}/{total} ok, {rates}, "
                f"{result.cpu_ms_per_rollout:.2f} CPU ms/rollout, peak RSS {result.rss_peak_mb:.0f} MB "
                f"(PSS {result.pss_peak_mb:.0f} MB), calib {result.calibration_ms:.0f} ms"
                + (f", failures {result.failures}" if result.failures else "")
                + (f" [{result.aborted}]" if result.aborted else ""),
                flush=True,
            )
            results.append(result)
        return results

    with asyncio.Runner(loop_factory=driver_loop_factory) as runner:
        return runner.run(sweep())


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The driver's event loop: uvloop where installed (``auto``), as a real rollout collector would use."""
    if choice == "asyncio" or (choice == "auto" and importlib.util.find_spec("uvloop") is None):
        return None
    import uvloop

    return uvloop.new_event_loop


if __name__ == "__main__":
    sys.exit(main())
