"""Where a process's CPU goes, from the collapsed stacks ``run.py --py-spy DIR`` writes: shares by group and frame.

Two views per file. *Self*: each sample is charged to the group of its deepest frame that belongs to a group (a
builtin such as ``dict.get`` is charged to the library that called it), so the shares add up to 100%. *Inclusive*:
the share of samples with a frame of the group anywhere in the stack (everything under a middleware layer, say).
py-spy leaves idle threads out by default; samples whose leaf is the event loop's wait are dropped as well.

    .venv/bin/python benchmarks/performance/rollout_overhead/profile_groups.py prof/c1024-*.txt
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

OTHER = "builtins outside any group"
IDLE = re.compile(
    r"\b(select|poll|epoll_wait|_run_once|run_forever) \((selectors|uvloop|asyncio/base_events)"
    r"|\b(Condition\.wait|Event\.wait|Thread\.join|_wait_for_tstate_lock) \(threading"
)
GROUPS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("imports (start-up)", r"<frozen importlib\._bootstrap|importlib/"),
        ("config composition (omegaconf/yaml)", r"omegaconf/|yaml/|nemo_gym/config/"),
        ("pydantic validation/serialisation", r"pydantic/|pydantic_core"),
        ("FastAPI dependency solving", r"fastapi/dependencies/"),
        ("JSON (orjson/json)", r"orjson|json/(encoder|decoder)|jsonable_encoder"),
        ("aiohttp client", r"aiohttp/"),
        (
            "ASGI middleware stack (starlette/fastapi)",
            r"starlette/middleware|fastapi/middleware|fastapi/(telemetry|_body_limit)|starlette/_exception"
            r"|nemo_gym/transport/(access|admission)\.py|\w*Middleware\.",
        ),
        ("routing / request objects (starlette/fastapi)", r"starlette/|fastapi/"),
        ("uvicorn HTTP protocol", r"uvicorn/"),
        ("event loop / asyncio (Runner.run leaf: uvloop's C code)", r"asyncio/|uvloop"),
        ("own code (nemo_gym, servers)", r"nemo_gym/|responses_api_|resources_servers/"),
    )
)


def samples(path: Path) -> Counter[str]:
    """Collapsed stacks (``frame;frame;... count``) of one py-spy raw file."""
    out: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out[stack] += int(count)
    return out


def summarize(path: Path, top: int) -> None:
    stacks = samples(path)
    busy = {s: n for s, n in stacks.items() if not IDLE.search(s.rsplit(";", 1)[-1])}
    total = sum(busy.values())
    print(f"\n{path.name}: {total} busy samples ({sum(stacks.values()) - total} idle left out)")
    if not total:
        return
    groups: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for stack, n in busy.items():
        frames = stack.split(";")
        groups[_self_group(frames)] += n
        for name, pattern in GROUPS:
            if pattern.search(stack):
                inclusive[name] += n
        leaves[re.sub(r":\d+\)", ")", frames[-1])] += n
    print("    self  inclusive  group")
    for name, n in groups.most_common():
        print(f"  {100 * n / total:5.1f}%  {100 * inclusive.get(name, n) / total:8.1f}%  {name}")
    print("  top leaf frames:")
    for frame, n in leaves.most_common(top):
        print(f"  {100 * n / total:5.1f}%    {frame[:140]}")


def _self_group(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, pattern in GROUPS:
            if pattern.search(frame):
                return name
    return OTHER


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="py-spy raw (collapsed) files")
    parser.add_argument("--top", type=int, default=8, help="leaf frames shown per file")
    args = parser.parse_args()
    for path in args.files:
        summarize(path, args.top)


if __name__ == "__main__":
    main()
