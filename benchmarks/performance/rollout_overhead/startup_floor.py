"""The least time a collect command can take to its first rollout on this machine, from what it cannot skip.

Two processes share the start-up of ``gym eval run --no-serve`` (``rollouts/forked_check.py``): the command, and the
row checker it forks as it starts. Each has a floor of its own.

**The row checker.** ``gym eval run`` checks every row before any rollout starts (a bad line is reported first, with
its line number). The check needs the Responses models (the same pydantic models the agent validates a ``/run`` with,
so a row that passes here is a row the agent takes) and one validation per row. That work is one process's, in order:
the models must be imported before the first row is checked. Measured here as the collect command's row checker does it, each in a fresh
interpreter started the way ``gym`` starts (the venv's Python, site packages and the editable install included):

* ``interpreter``: ``python -c pass``;
* ``import models``: the interpreter, then importing ``nemo_gym.datasets.validation`` (pydantic and the Responses models);
* ``check rows``: that, then every row of the file parsed and its create params validated
  (``check_params_ahead``, what the checker runs while the command starts);
* ``materialize``: that, then the materialized inputs written as the run writes them
  (``rollouts.materialize.materialize``, which checks each row as it writes it).

**The command.** Before its first ``/run`` leaves, the command's own process needs the libraries the framework is
built on for that path: pydantic (its typed settings), OmegaConf and PyYAML (composing the config from
``config_paths``, ``env.yaml`` and the overrides, which say where the head server is), orjson, and uvloop with
httptools (the collector's loop and its HTTP client). ``command libraries`` is a fresh interpreter importing just
those, none of the framework's own code.

Each is a floor for "collect command start -> first model request", whatever runs beside it: the first ``/run`` can
only leave after both, and the agent's own ``/seed_session`` and the model call come after that. On 2 cores the two
processes also share the machine with the agent that takes the first ``/run``. ::

    .venv/bin/python benchmarks/performance/rollout_overhead/startup_floor.py              # 10,000 rows, 7 starts each
    .venv/bin/python benchmarks/performance/rollout_overhead/startup_floor.py --rows 1000,10000,65536
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from collect_point import first_run_env, write_rows

STAGES: dict[str, str] = {
    "interpreter": "pass",
    "command libraries": "import pydantic, omegaconf, yaml, orjson, uvloop, httptools",
    "import models": "import nemo_gym.datasets.validation",
    "check rows": (
        "import sys\n"
        "from pathlib import Path\n"
        "from nemo_gym.datasets.validation import check_params_ahead\n"
        "checked = check_params_ahead(Path(sys.argv[1]), stop=lambda: False)\n"
        "assert checked is not None and not any(checked.problems), checked\n"
    ),
    "materialize": (
        "import sys\n"
        "from pathlib import Path\n"
        "from nemo_gym.rollouts.materialize import MaterializeOptions, materialize\n"
        "materialize(MaterializeOptions(input_path=Path(sys.argv[1]), output_path=Path(sys.argv[2]),\n"
        "                               agent_name='example_single_tool_call_simple_agent'))\n"
    ),
}
ROW_STAGES = frozenset({"check rows", "materialize"})
"""The stages whose time depends on the rows; the others are timed once per start and shown for every row count."""
FLOOR_STAGES = ("command libraries", "materialize")
"""One per process of the command: the floor is the longer of the two (they run side by side)."""


def time_stage(code: str, input_path: Path, output_path: Path, env: dict[str, str] | None = None) -> float:
    """Wall-clock seconds from starting a fresh interpreter that runs ``code`` to its exit."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, str(input_path), str(output_path)], check=True, env=env)
    return time.perf_counter() - started


def floor_for_rows(rows: list[dict[str, Any]], total: int, workdir: Path) -> float:
    """The floor for ``total`` rows cycling over ``rows`` (the rows ``run.py --client collect`` gives its command):
    the longer of the row checker's path (to its materialized inputs) and the command's libraries, each timed once."""
    input_path = write_rows(rows, total, workdir / f"floor_rows_{total}.jsonl")
    output_path = workdir / f"floor_out_{total}.jsonl"
    return max(time_stage(STAGES[stage], input_path, output_path) for stage in FLOOR_STAGES)


def main() -> None:
    from run import load_rows

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="10000", help="comma-separated row counts (default 10000)")
    parser.add_argument("--starts", type=int, default=7, help="fresh interpreters per stage and row count, interleaved")
    args = parser.parse_args()
    counts = [int(c) for c in args.rows.split(",")]
    examples = load_rows()
    with tempfile.TemporaryDirectory(prefix="startup-floor-") as tmp:
        workdir = Path(tmp)
        inputs = {count: write_rows(examples, count, workdir / f"rows_{count}.jsonl") for count in counts}
        for code in STAGES.values():  # untimed: a first start writes the bytecode, as a user's first command does
            time_stage(code, inputs[counts[0]], workdir / "warm.jsonl", first_run_env())
        times: dict[tuple[int | None, str], list[float]] = {}
        for _ in range(args.starts):  # interleaved, so a slow moment of the box touches every stage alike
            for stage, code in STAGES.items():
                for count in counts if stage in ROW_STAGES else [None]:
                    input_path = inputs[count if count is not None else counts[0]]
                    seconds = time_stage(code, input_path, workdir / f"out_{count}.jsonl")
                    times.setdefault((count, stage), []).append(seconds)
    print(f"fresh interpreter -> exit, {args.starts} starts each: median (fastest)")
    print(f"{'rows':>7} " + " ".join(f"{stage:>18}" for stage in STAGES))
    for count in counts:
        cells = [times[count if stage in ROW_STAGES else None, stage] for stage in STAGES]
        print(f"{count:>7} " + " ".join(f"{statistics.median(t):>9.3f} ({min(t):.3f})" for t in cells))


if __name__ == "__main__":
    main()
