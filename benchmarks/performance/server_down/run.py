"""Server-down benchmark: a model server dies under ``gym eval run``; how soon is it told, restarted, and used again.

A real ``gym eval run`` (the weather environment with the instant ``scripted_model``, ``--concurrency 64``) runs a
long job. Each cycle waits for ``--rows-between`` more scored rollouts, kills the model server's process group
(SIGKILL) and times, from the kill: the run's "model server ... is down" line (the collector's breaker), the
launcher's "server 'policy_model' ... is back on" line (its supervisor restarted it on the same address), and the
first rollout scored after that. Then the run is interrupted (Ctrl-C) and the figures printed. The goal is under 5 s
from the kill to the "down" line.

    .venv/bin/python benchmarks/performance/server_down/run.py --kills 3 --json results/server_down.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ENVIRONMENT = "example_single_tool_call"
GOAL_S = 5.0
HANG_GUARD_S = 300.0


def children(parent: int) -> Iterator[int]:
    """The processes whose parent is ``parent`` (Linux ``/proc``)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                yield int(entry.name)


def child_serving(parent: int, instance: str) -> int:
    """The server process a launcher (``parent``) started for ``instance`` (its ``NEMO_GYM_CONFIG_PATH``)."""
    for pid in children(parent):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # gone, or a zombie not yet reaped
            continue
        if f"NEMO_GYM_CONFIG_PATH={instance}\0".encode() in environ:
            return pid
    raise LookupError(f"no server {instance!r} among the children of {parent}")


def kill_for_restart(pid: int) -> Callable[[], subprocess.Popen]:
    """SIGKILL a launched server's process group; return how to start it again: same command, directory and
    environment, no inherited socket, so it binds the host and port of the run's config file itself."""
    proc = Path(f"/proc/{pid}")
    args = [part.decode() for part in (proc / "cmdline").read_bytes().split(b"\0") if part]
    cwd = os.readlink(proc / "cwd")
    items = (proc / "environ").read_bytes().split(b"\0")
    environ = dict(item.decode().split("=", 1) for item in items if b"=" in item)
    environ.pop("NEMO_GYM_LISTEN_FD", None)
    os.killpg(pid, signal.SIGKILL)
    return lambda: subprocess.Popen(
        args, cwd=cwd, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


class Lines:
    """A process's output lines as they come, each with the time it was read."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.lines: list[tuple[float, str]] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._changed.notify_all()

    def wait_for(self, text: str, after: int) -> tuple[float, str]:
        """The first line from index ``after`` on that contains ``text``."""
        deadline = time.monotonic() + HANG_GUARD_S
        with self._changed:
            while True:
                for at, line in self.lines[after:]:
                    if text in line:
                        return at, line
                if self.process.poll() is not None or time.monotonic() > deadline:
                    tail = "\n".join(line for _, line in self.lines[-30:])
                    raise SystemExit(f"no line with {text!r}; the run's output ends with:\n{tail}")
                self._changed.wait(0.2)


def scored(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3, help="kill-and-restart cycles (default 3)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rows-between", type=int, default=300, help="scored rollouts before each kill")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="server-down-bench-") as tmp:
        workdir = Path(tmp)
        output = workdir / "rollouts.jsonl"
        configs = [
            REPO / "resources_servers" / ENVIRONMENT / "configs" / f"{ENVIRONMENT}.yaml",
            REPO / "responses_api_models" / "scripted_model" / "configs" / "scripted_model.yaml",
        ]
        command = [
            sys.executable, "-m", "nemo_gym.cli.main", "eval", "run", "--agent", f"{ENVIRONMENT}_simple_agent",
            "--input", str(REPO / "resources_servers" / ENVIRONMENT / "data" / "example.jsonl"),
            "--num-repeats", "100000", "--concurrency", str(args.concurrency), "--output", str(output),
            "+config_paths=[" + ",".join(str(c) for c in configs) + "]", "+shared_venv=true",
            "+head_server={port: 0}", f"+results_dir={workdir / 'results'}", f"+cache_dir={workdir / 'cache'}",
        ]  # fmt: skip
        env = os.environ | {"NEMO_GYM_ENV_YAML": ""}
        run = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = Lines(run)
        to_down: list[float] = []
        to_back: list[float] = []
        to_rollout: list[float] = []
        try:
            for cycle in range(1, args.kills + 1):
                target = scored(output) + args.rows_between
                while scored(output) < target:
                    if run.poll() is not None:
                        raise SystemExit("the run ended early:\n" + "\n".join(line for _, line in lines.lines[-30:]))
                    time.sleep(0.05)
                seen = len(lines.lines)
                os.killpg(child_serving(run.pid, "policy_model"), signal.SIGKILL)
                killed_at = time.monotonic()
                down_at, down = lines.wait_for("is down", seen)
                back_at, back = lines.wait_for("(responses_api_models/scripted_model) is back on", seen)
                after_back = scored(output)
                while scored(output) <= after_back:
                    if run.poll() is not None:
                        raise SystemExit("the run ended before a rollout after the restart")
                    time.sleep(0.01)
                to_down.append(down_at - killed_at)
                to_back.append(back_at - killed_at)
                to_rollout.append(time.monotonic() - killed_at)
                print(f"cycle {cycle}: kill -> 'down' {to_down[-1]:.2f} s, -> restarted {to_back[-1]:.2f} s, "
                      f"-> first rollout after it {to_rollout[-1]:.2f} s", flush=True)  # fmt: skip
                if cycle == 1:
                    print(f"  {down}\n  {back}", flush=True)
        finally:
            run.send_signal(signal.SIGINT)
            run.wait(timeout=HANG_GUARD_S)

    worst = max(to_down)
    print(
        f"kill -> 'model server ... is down' line: median {statistics.median(to_down):.2f} s, max {worst:.2f} s over "
        f"{len(to_down)} kills at concurrency {args.concurrency} (goal < {GOAL_S:g} s: {'met' if worst < GOAL_S else 'MISSED'})"
    )
    print(
        f"kill -> restarted (the supervisor's 'is back' line): median {statistics.median(to_back):.2f} s; "
        f"-> first rollout scored after it: median {statistics.median(to_rollout):.2f} s"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"concurrency": args.concurrency, "kill_to_down_s": to_down, "kill_to_restarted_s": to_back,
                  "kill_to_first_rollout_s": to_rollout}  # fmt: skip
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if worst < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
