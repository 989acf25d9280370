"""The ladder: the same rows driven through running servers at each concurrency in turn, each step for a set time.

Each step is one collection by the collector of ``gym eval run`` (``rollouts/collector.py``) over the same
materialized rows, told to start no rollout after the step's duration (those in flight finish) and to stamp every
record with when it was sent and how long it took. Its rollouts and failures go to ``<stem>_steps/c<N>.jsonl`` and
``c<N>_failures.jsonl``, and the step's numbers are read back from those files (``limits.count_step``), so they can
be recounted from them. The ladder stops after the first step over a stated limit (failure rate, p99).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nemo_gym.config.compose import ComposedConfig
from nemo_gym.loadtest.config import LoadtestConfig
from nemo_gym.loadtest.limits import MachineUse, ServerUse, StepCounts, count_step, stated_limit, step_limit
from nemo_gym.loadtest.probes import StepProbe, Watched
from nemo_gym.rollouts.collector import RolloutCollector, failures_path
from nemo_gym.rollouts.materialize import Materialized
from nemo_gym.rollouts.run import agent_urls, collection_options, collector_loop_factory, prepare_inputs
from nemo_gym.transport import http_client


@dataclass
class Step:
    concurrency: int
    counts: StepCounts
    wall_s: float
    """From the step's start until its last rollout ended (the duration, then the drain)."""
    servers: list[ServerUse]
    machine: MachineUse
    rollouts_path: Path
    exhausted: bool
    """Every materialized rollout ran before the duration ended: the step was shorter than asked."""
    limit: str | None = None
    """The limit this step shows (``limits.step_limit``), if any."""


@dataclass
class LadderResult:
    steps: list[Step]
    stopped_by: str | None
    """The stated limit that ended the ladder, or None when every step ran."""
    inputs: Materialized

    @property
    def first_limit(self) -> str:
        """The first limit the ladder met, as measured, or what was measured when it met none."""
        for step in self.steps:
            if step.limit:
                return f"at concurrency {step.concurrency}: {step.limit}"
        if self.stopped_by:
            return f"the stated limit ({self.stopped_by}); no CPU, file or memory limit measured"
        top = self.steps[-1].concurrency if self.steps else 0
        return f"none up to concurrency {top}: no server near its CPU, file or memory limit, throughput still rising"


def steps_dir(settings: LoadtestConfig) -> Path:
    output = Path(settings.loadtest_output_fpath).expanduser().resolve()
    return output.with_name(f"{output.stem}_steps")


def materialize(settings: LoadtestConfig, composed: ComposedConfig) -> Materialized:
    """The rows every step runs: the input (or split) repeated up to ``loadtest_max_rollouts_per_step`` rollouts."""
    folder = steps_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    once = settings.model_copy(update={"output_jsonl_fpath": str(folder / "inputs.jsonl"), "num_repeats": 1})
    first = prepare_inputs(once, composed)
    repeats = max(1, math.ceil(settings.loadtest_max_rollouts_per_step / max(1, first.num_rows)))
    if repeats == 1:
        return first
    return prepare_inputs(once.model_copy(update={"num_repeats": repeats}), composed)


def run_ladder(
    settings: LoadtestConfig,
    composed: ComposedConfig,
    watched: list[Watched],
    inputs: Materialized,
    say: Callable[[str], None],
) -> LadderResult:
    """Run every step (or until a stated limit) against the running servers of ``composed``."""
    with asyncio.Runner(loop_factory=collector_loop_factory()) as runner:
        return runner.run(_ladder(settings, composed, watched, inputs, say))


async def _ladder(
    settings: LoadtestConfig,
    composed: ComposedConfig,
    watched: list[Watched],
    inputs: Materialized,
    say: Callable[[str], None],
) -> LadderResult:
    result = LadderResult([], None, inputs)
    try:
        for concurrency in settings.loadtest_concurrency:
            step = await _step(settings, composed, watched, inputs, concurrency)
            previous = result.steps[-1].counts if result.steps else None
            step.limit = step_limit(step.counts, previous, step.servers, step.machine, step.wall_s)
            result.steps.append(step)
            c = step.counts
            say(
                f"concurrency {concurrency}: {c.completed} scored, {c.failed} failed in {step.wall_s:.1f}s, "
                f"{c.rollouts_per_s:.1f} rollouts/s, p99 {c.latency_ms(0.99) or 0:.0f} ms"
            )
            stop = stated_limit(c, settings.loadtest_max_failure_rate, settings.loadtest_max_p99_ms)
            if stop is not None:
                result.stopped_by = f"{stop} at concurrency {concurrency}"
                break
    finally:
        await http_client.close_session()
    return result


async def _step(
    settings: LoadtestConfig, composed: ComposedConfig, watched: list[Watched], inputs: Materialized, concurrency: int
) -> Step:
    output = steps_dir(settings) / f"c{concurrency}.jsonl"
    step_settings = settings.model_copy(
        update={"output_jsonl_fpath": str(output), "num_samples_in_parallel": concurrency}
    )
    started = time.monotonic()
    options = dataclasses.replace(
        collection_options(step_settings, composed, show_progress=False),
        stop_starting_at=started + settings.loadtest_duration_seconds,
        stamp_times=True,
    )
    probe = StepProbe(watched)
    probe.start()
    summary = await RolloutCollector(inputs, agent_urls(composed), options).run()
    machine = await probe.stop()
    wall = time.monotonic() - started
    counts = count_step(output, failures_path(output))
    exhausted = summary.succeeded + summary.failed >= inputs.num_rows
    return Step(concurrency, counts, wall, list(probe.use.values()), machine, output, exhausted)
