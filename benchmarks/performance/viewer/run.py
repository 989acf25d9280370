"""Viewer benchmark: how soon `gym view` answers on a 100,000-rollout (~1 GB) file, and at what peak memory.

It writes a rollouts file of ``--rows`` realistic rows (~``--row-kb`` KB each: system and user input, reasoning, a few
``get_weather`` calls with their outputs, a long final answer, usage, reward and verifier fields), starts a real
``gym view`` process on it, and times: the URL printed, the first page (the overview, served while the index is
still being built), the whole file indexed, then a filtered list (reward 0), a text search and one trajectory page.
Peak memory is the server's VmHWM (Linux). The same is measured on a file ``--small-factor`` times smaller, to show
that memory does not grow with the file.

    .venv/bin/python benchmarks/performance/viewer/run.py --json results/viewer_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[3]
HANG_GUARD_S = 600.0
WORDS = ("weather cold warm rain city forecast wind humidity tomorrow sunny cloud the a is in of and to call tool "
         "answer temperature degrees north south report check user asks model").split()  # fmt: skip


def text_pool(seed: int = 7, size: int = 1 << 17) -> str:
    rng = random.Random(seed)
    words: list[str] = []
    total = 0
    while total < size:
        words.append(rng.choice(WORDS))
        total += len(words[-1]) + 1
    return " ".join(words)


def make_row(k: int, pool: str, row_bytes: int, rng: random.Random) -> dict:
    """Rollout ``k``: task k // 4, rollout k % 4, a reward of 0 or 1, and text filling it to about ``row_bytes``."""
    calls = 1 + k % 4
    start = rng.randrange(0, len(pool) - row_bytes)
    budget = max(row_bytes - 1500 - calls * 350, 200)
    reasoning, answer = pool[start : start + budget // 3], pool[start + budget // 3 : start + budget]
    output: list[dict] = [
        {"type": "reasoning", "id": f"rs_{k}", "summary": [{"type": "summary_text", "text": reasoning}]}
    ]
    for c in range(calls):
        call_id = f"call_{k}_{c}"
        output.append({"type": "function_call", "call_id": call_id, "name": "get_weather", "id": call_id,
                       "arguments": json.dumps({"city": f"City{k // 4}"}), "status": "completed"})  # fmt: skip
        output.append({"type": "function_call_output", "call_id": call_id,
                       "output": json.dumps({"city": f"City{k // 4}", "weather_description": pool[start : start + 200]})})  # fmt: skip
    output.append({"type": "message", "id": f"msg_{k}", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": answer, "annotations": []}]})  # fmt: skip
    reward = float((k * 2654435761) % 7 < 4)
    return {
        "responses_create_params": {
            "input": [
                {
                    "role": "system",
                    "content": "You are a helpful assistant. Use the get_weather tool to look up the weather.",
                },
                {"role": "user", "content": f"What is the weather in City{k // 4} right now?"},
            ],
            "tools": [
                {
                    "type": "function",
                    "name": "get_weather",
                    "description": "Get the current weather of a city.",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                }
            ],
            "temperature": 0.2,
            "max_output_tokens": 2048,
        },  # fmt: skip
        "response": {
            "id": f"resp_{k}",
            "object": "response",
            "model": "bench",
            "status": "completed",
            "output": output,
            "usage": {
                "input_tokens": 300 + calls * 60,
                "output_tokens": len(answer) // 4,
                "total_tokens": 300 + calls * 60 + len(answer) // 4,
            },
        },  # fmt: skip
        "reward": reward,
        "extracted_city": f"City{k // 4}",
        "_ng_task_index": k // 4,
        "_ng_rollout_index": k % 4,
        "agent_ref": {"type": "responses_api_agents", "name": "weather_simple_agent"},
    }


def write_file(path: Path, rows: int, row_kb: float) -> int:
    pool, rng = text_pool(), random.Random(11)
    with path.open("wb") as f:
        for k in range(rows):
            f.write(orjson.dumps(make_row(k, pool, int(row_kb * 1024), rng)) + b"\n")
    return path.stat().st_size


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=HANG_GUARD_S) as answer:
        return answer.read()


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(path: Path, rows: int) -> dict:
    """One `gym view` process on ``path``: the timings and its peak RSS."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "nemo_gym.cli.main", "view", str(path), "--port", "0"],
                               cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "http://" not in line:
            raise SystemExit(f"gym view did not start: {line!r}")
        url = line[line.index("http://") :].split()[0].rstrip("/")
        figures = {"url_printed_s": time.perf_counter() - started}
        get(url + "/run/0")
        figures["first_page_s"] = time.perf_counter() - started
        while json.loads(get(url + "/status.json"))["indexing"]:
            if time.perf_counter() - started > HANG_GUARD_S:
                raise SystemExit("indexing did not finish")
            time.sleep(0.05)
        figures["fully_indexed_s"] = time.perf_counter() - started
        for name, page in (("reward_0_list_s", "/run/0/rollouts?reward=0"), ("sorted_by_length_s", "/run/0/rollouts?sort=length&desc=1"),
                           ("text_search_s", "/run/0/rollouts?agent=weather_simple_agent&q=City7%22"),
                           ("overview_indexed_s", "/run/0"), ("trajectory_s", f"/run/0/r/{rows // 2}")):  # fmt: skip
            t = time.perf_counter()
            get(url + page)
            figures[name] = time.perf_counter() - t
        figures["rows"] = json.loads(get(url + "/status.json"))["runs"][0]["rollouts"]
        figures["peak_rss_mb"] = peak_rss_mb(process.pid)
        return figures
    finally:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--row-kb", type=float, default=10.0, help="approximate size of one row (default 10 KB)")
    parser.add_argument("--small-factor", type=int, default=10, help="the comparison file has rows / this many rows")
    parser.add_argument("--dir", type=Path, help="where the files go (default: a temporary folder, removed after)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        report: dict = {"rows": args.rows, "row_kb": args.row_kb}
        for label, rows in (("small", max(args.rows // args.small_factor, 1)), ("large", args.rows)):
            path = Path(folder) / f"{label}_rollouts.jsonl"
            t = time.perf_counter()
            size = write_file(path, rows, args.row_kb)
            figures = measure(path, rows)
            figures.update(file_mb=size / 2**20, generate_s=time.perf_counter() - t - figures["fully_indexed_s"])
            report[label] = figures
            print(f"{label}: {rows} rollouts, {size / 2**20:,.0f} MiB: first page {figures['first_page_s']:.2f} s, "
                  f"fully indexed {figures['fully_indexed_s']:.1f} s, peak RSS {figures['peak_rss_mb']:.0f} MiB; "
                  f"reward-0 list {figures['reward_0_list_s']:.2f} s, text search {figures['text_search_s']:.2f} s, "
                  f"trajectory {figures['trajectory_s']:.3f} s", flush=True)  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
