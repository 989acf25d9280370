"""``gym eval ...``: collect scored rollouts and compute their metrics."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from nemo_gym.cli.command import Command, Invocation
from nemo_gym.cli.commands.export import COMMANDS as EXPORT_COMMANDS
from nemo_gym.cli.flags import AUTH_FLAG, CONFIG_FLAGS, MODEL_FLAGS, RAY_FLAG, Flag
from nemo_gym.cli.output import GymConsole, console, err_console
from nemo_gym.rollouts.config import (
    DEFAULT_CONCURRENCY,
    DEFAULT_REVERIFY_CONCURRENCY,
    DEFAULT_SERVER_DOWN_DEADLINE_S,
)

if TYPE_CHECKING:
    from nemo_gym.config.compose import ComposedConfig
    from nemo_gym.rollouts.run import RunResult

EXIT_SOME_ROLLOUTS_FAILED = 3
"""Exit code of a run that finished but left failed rollouts (listed in the failures file; --resume retries them)."""
DEFAULT_PROFILE_ROWS = 20
"""Tasks shown by ``gym eval profile`` without ``--max-rows``."""

RUN_FLAGS = (
    Flag(("--no-serve",), "use servers already started with `gym env start` instead of starting them", switch=True),
    AUTH_FLAG,
    RAY_FLAG,
    Flag(("--agent", "-a"), "agent instance for rows without agent_ref", field="agent_name", metavar="NAME"),
    Flag(("--input", "-i"), "JSONL rows to run", field="input_jsonl_fpath", metavar="PATH"),
    Flag(("--output", "-o"), "JSONL file for scored rollouts", field="output_jsonl_fpath", metavar="PATH"),
    Flag(("--split",), "without --input: run the agents' datasets of this type (with --agent: its own only)",
         field="split",
         metavar="train|validation|example|benchmark"),
    Flag(("--limit",), "only the first N rows", field="limit", metavar="N", value_type=int, minimum=1),
    Flag(("--num-repeats",), "rollouts per row", field="num_repeats", metavar="N", value_type=int, minimum=1),
    Flag(("--concurrency",), f"rollouts in flight at once (default {DEFAULT_CONCURRENCY})",
         field="num_samples_in_parallel", metavar="N", value_type=int, minimum=1),
    Flag(("--resume",), "continue a previous run: skip finished rollouts, retry failed ones",
         field="resume_from_cache", switch=True),
    Flag(("--overwrite",), "replace an earlier run's results in --output (without this or --resume, a run that "
         "finds them is refused)", field="overwrite", switch=True),
    Flag(("--temperature",), "sampling temperature for every row", field="responses_create_params.temperature",
         value_type=float, minimum=0),
    Flag(("--top-p",), "nucleus sampling for every row", field="responses_create_params.top_p",
         value_type=float, minimum=0, maximum=1),
    Flag(("--max-output-tokens",), "output token limit for every row",
         field="responses_create_params.max_output_tokens", value_type=int, minimum=1),
    Flag(("--disable-aggregation",), "do not compute aggregate metrics", field="disable_aggregation", switch=True),
    Flag(("--count-failures-as-zero",), "failure classes or kinds counted as reward 0 in the aggregate metrics "
         "(e.g. agent_run_error); the files are unchanged", field="count_failure_classes_as_zero", metavar="CLASS",
         many=True),
    Flag(("--no-health-check",), "skip the rollout health checks after the run", field="disable_health_check",
         switch=True),
    Flag(("--health-check-ignore",), "health-check ids to leave out (comma-separated)",
         field="health_check_ignored_checks", metavar="CHECK[,CHECK...]"),
    Flag(("--server-down-deadline",), "seconds to wait for a server that went down (rollouts paused, its failures "
         f"not charged) before stopping the run; --resume continues it (default {DEFAULT_SERVER_DOWN_DEADLINE_S:g})",
         field="server_down_deadline_seconds", metavar="SECONDS", value_type=float, minimum=0.001),
)  # fmt: skip


def run(invocation: Invocation) -> int:
    if invocation.get("no_serve"):
        return _collect_from_running_servers(invocation)
    return _start_servers_and_collect(invocation)


def _collect_from_running_servers(invocation: Invocation) -> int:
    from nemo_gym.rollouts.forked_check import ForkedRowCheck

    # Forked before anything else is imported (by the entry point, usually): the child loads what checking rows needs
    # while this process loads and composes the config and asks the head server for the running one.
    with ForkedRowCheck.early_or_new() as row_check:
        from nemo_gym.config.compose import ComposeOptions, compose
        from nemo_gym.jsonl import check_writable_output
        from nemo_gym.rollouts.claim import claim_output
        from nemo_gym.rollouts.config import RolloutCollectionConfig
        from nemo_gym.rollouts.fd_limit import check_open_file_limit

        composed = compose(ComposeOptions(overrides=invocation.overrides, dummy_model=True))
        settings = invocation.settings(RolloutCollectionConfig, composed.config)
        check_writable_output(settings.output_jsonl_fpath)
        check_open_file_limit(settings.num_samples_in_parallel, serving=False)

        def collect() -> RunResult:
            with claim_output(settings):  # held until the metrics are written: one writer per output
                running = _head_server_config(composed)
                # The rows are checked and written while the HTTP machinery of the rollouts is imported here.
                materialized = row_check.run(settings, running, meanwhile=_load_collection)
                from nemo_gym.rollouts.run import run_collection, tune_garbage_collector

                tune_garbage_collector()
                return run_collection(settings, running, materialized=materialized)

        return _run_reporting(collect, settings, err_console)


def _start_servers_and_collect(invocation: Invocation) -> int:
    from nemo_gym.jsonl import check_writable_output
    from nemo_gym.launcher import running_servers
    from nemo_gym.launcher.preflight import compose_to_start
    from nemo_gym.rollouts.claim import claim_output
    from nemo_gym.rollouts.config import RolloutCollectionConfig
    from nemo_gym.rollouts.fd_limit import check_open_file_limit
    from nemo_gym.rollouts.run import prepare_inputs, run_collection

    composed = compose_to_start(invocation.overrides)  # the checks of `gym env validate`, the same lines
    settings = invocation.settings(RolloutCollectionConfig, composed.config)
    check_writable_output(settings.output_jsonl_fpath)
    check_open_file_limit(settings.num_samples_in_parallel, serving=True)  # the servers inherit the limit

    def start_and_collect() -> RunResult:
        with claim_output(settings):  # held until the metrics are written: one writer per output
            materialized = prepare_inputs(settings, composed)  # a bad row is reported before any server starts
            err_console.print(
                f"Starting servers (logs in {Path(composed.config.results_dir) / 'logs'}) …", markup=False
            )
            with running_servers(config=composed) as launcher:
                return run_collection(settings, launcher.composed, materialized=materialized)

    return _run_reporting(start_and_collect, settings, err_console)


def _load_collection() -> None:
    import nemo_gym.rollouts.run  # noqa: F401 - the collector, its HTTP client and the metrics


def _run_reporting(collect: Callable[[], Any], settings: Any, stderr: GymConsole) -> int:
    from nemo_gym.rollouts.materialize import materialized_inputs_path
    from nemo_gym.rollouts.outputs import failures_path

    try:
        result = collect()
    except KeyboardInterrupt:
        from nemo_gym.rollouts.claim import result_files

        output = Path(settings.output_jsonl_fpath)
        if any(path.is_file() and path.stat().st_size for path in result_files(output)):  # what --resume continues
            stderr.print(
                f"[yellow]Interrupted.[/yellow] Finished rollouts are in {escape(str(output))}; "
                "run the same command with --resume to finish the rest."
            )
        else:  # stopped while starting up (the rows being checked, say) or before any rollout ended
            stderr.print("[yellow]Interrupted[/yellow] before any rollout finished: nothing to resume yet.")
        return 130
    summary = result.summary
    if result.metrics:
        from nemo_gym.rollouts.aggregate import print_key_metrics

        print_key_metrics(result.metrics, stderr)
    rate = summary.succeeded / summary.elapsed_s if summary.elapsed_s else 0.0
    stderr.print(
        f"{summary.succeeded} rollouts scored, {summary.failed} failed"
        + (f" ({_counts(summary.failure_kinds)})" if summary.failed else "")
        + (f", {summary.skipped_done} already done" if summary.skipped_done else "")
        + (f", {summary.skipped_exhausted} out of attempts" if summary.skipped_exhausted else "")
        + f" in {summary.elapsed_s:.1f}s ({rate:.1f}/s)"
    )
    output = summary.output_path
    if summary.served_by:  # replicas on a Ray cluster: where the rollouts ran
        served = ", ".join(f"{name} {count}" for name, count in sorted(summary.served_by.items()))
        stderr.print(f"  served by:           {served}", markup=False)
    stderr.print(f"  rollouts:            {output}", markup=False)
    stderr.print(f"  materialized inputs: {materialized_inputs_path(output)}", markup=False)
    if summary.failed:
        stderr.print(f"  failures:            {failures_path(output)}  (retry them with --resume)", markup=False)
    if result.metrics_path:
        counted = f"  ({result.counted_failures} failures counted as 0)" if result.counted_failures else ""
        stderr.print(f"  aggregate metrics:   {result.metrics_path}{counted}", markup=False)
    if result.health is not None:
        from nemo_gym.health.report import format_health_report

        stderr.print(format_health_report(result.health), markup=False)
    stderr.print(f"  look at them:        gym view {shlex.quote(str(output))}", markup=False)
    sys.stderr.flush()
    return 0 if not summary.failed else EXIT_SOME_ROLLOUTS_FAILED


AGGREGATE_FLAGS = (
    Flag(("--input-glob",), "comma-separated globs of rollout shards, e.g. 'results/a_*.jsonl,b/*.jsonl'",
         field="input_glob", metavar="GLOBS"),
    Flag(("--output", "-o"), "merged rollouts file (metrics: <stem>_aggregate_metrics.json)",
         field="output_jsonl_fpath", metavar="PATH"),
    Flag(("--no-merge",), "only compute the metrics, do not write the merged file", switch=True),
    Flag(("--count-failures-as-zero",), "failure classes or kinds counted as reward 0 in the aggregate metrics "
         "(e.g. agent_run_error); the files are unchanged", field="count_failure_classes_as_zero", metavar="CLASS",
         many=True),
    Flag(("--servers",), "ask the running agents' /aggregate_metrics (environment-specific metrics); found via the "
         "head server of `gym env start`", switch=True),
)  # fmt: skip

PROFILE_FLAGS = (
    Flag(("--rollouts",), "scored rollouts of a run", field="rollouts_jsonl_fpath", metavar="PATH"),
    Flag(("--inputs",), "the run's materialized inputs (default: <rollouts stem>_materialized_inputs.jsonl)",
         field="materialized_inputs_jsonl_fpath", metavar="PATH"),
    Flag(("--allow-partial",), "profile an unfinished run, reporting the missing rollouts",
         field="allow_partial_rollouts", switch=True),
    Flag(("--max-rows",), f"tasks shown in the table (hardest first; default {DEFAULT_PROFILE_ROWS})", metavar="N",
         value_type=int, minimum=1),
)  # fmt: skip

REVERIFY_FLAGS = (
    Flag(("--no-serve",), "use servers already started with `gym env start` instead of starting them", switch=True),
    AUTH_FLAG,
    Flag(("--rollouts",), "stored rollouts to re-score", field="rollouts_jsonl_fpath", metavar="PATH"),
    Flag(("--inputs",), "the run's materialized inputs (default: <rollouts stem>_materialized_inputs.jsonl)",
         field="materialized_inputs_jsonl_fpath", metavar="PATH"),
    Flag(("--output", "-o"), "new rollouts file (the stored files are never edited)", field="output_jsonl_fpath",
         metavar="PATH"),
    Flag(("--concurrency",), f"verifications in flight at once (default {DEFAULT_REVERIFY_CONCURRENCY})",
         field="num_samples_in_parallel", metavar="N", value_type=int, minimum=1),
    Flag(("--limit",), "only the first N stored rollouts", field="limit", metavar="N", value_type=int, minimum=1),
    Flag(("--force",), "verify even where a resources server's /reverify_mode is not 'stateless'", field="force",
         switch=True),
    Flag(("--disable-aggregation",), "do not compute aggregate metrics", field="disable_aggregation", switch=True),
    Flag(("--atif-manifest",), "an ATIF export of `gym eval export` (its folder or manifest.jsonl) instead of "
         "--rollouts: its trajectories are scored again and each reward that differs is named (exit 4)",
         metavar="PATH"),
    Flag(("--input-format",), "what is re-verified: gym rollouts (--rollouts, the default) or atif "
         "(--atif-manifest)", metavar="gym|atif"),
)  # fmt: skip


COMPARE_FLAGS = (
    Flag(("--baseline",), "rollouts file of the baseline run", metavar="PATH"),
    Flag(("--candidates",), "rollouts files of the runs compared with it, of the same tasks (space- or "
         "comma-separated)", metavar="PATH", many=True),
    Flag(("--output-dir", "-o"), "folder for compare_report.md / compare_report.json (default: the last "
         "candidate's folder)", metavar="DIR"),
    Flag(("--report-format",), "reports to write: md, json or both (default both)", metavar="md|json|both"),
)  # fmt: skip


def _head_server_config(composed: ComposedConfig) -> ComposedConfig:
    """The config of running servers, asked from the head server the composed config points at."""
    from nemo_gym.config.compose import ComposedConfig
    from nemo_gym.config.head_fetch import fetch_config_from_head_server
    from nemo_gym.config.server_models import BaseServerConfig

    head = composed.config.head_server
    return ComposedConfig.of(fetch_config_from_head_server(BaseServerConfig(host=head.host, port=head.port)))


def _inputs_path(settings: Any) -> Path:
    from nemo_gym.rollouts.materialize import materialized_inputs_path

    rollouts = Path(settings.rollouts_jsonl_fpath).expanduser()
    return Path(settings.materialized_inputs_jsonl_fpath or materialized_inputs_path(rollouts)).expanduser()


def aggregate(invocation: Invocation) -> int:
    from nemo_gym.config.compose import ComposeOptions, compose
    from nemo_gym.rollouts.aggregate import print_key_metrics, run_now
    from nemo_gym.rollouts.config import AggregateRolloutsConfig
    from nemo_gym.rollouts.run import agent_urls
    from nemo_gym.rollouts.shards import aggregate_shards

    composed = compose(ComposeOptions(overrides=invocation.overrides, dummy_model=True))
    settings = invocation.settings(AggregateRolloutsConfig, composed.config)
    urls = None
    if invocation.get("servers"):
        urls = agent_urls(_head_server_config(composed))
    result = run_now(
        aggregate_shards(
            settings.input_glob,
            Path(settings.output_jsonl_fpath),
            merge=settings.merge_shards and not invocation.get("no_merge"),
            agent_urls=urls,
            count_failure_classes_as_zero=settings.count_failure_classes_as_zero,
        )
    )
    if urls is not None:
        local = sorted(e["agent_ref"]["name"] for e in result.metrics if e["agent_ref"]["name"] not in urls)
        if local:
            console.print(f"[yellow]note:[/yellow] agents not running, default metrics used: {', '.join(local)}")
    print_key_metrics(result.metrics, console)
    console.print(f"{result.num_rows} rollouts from {len(result.shards)} shard file(s):")
    for shard in result.shards:
        console.print(f"  {shard}", markup=False)
    if result.skipped:
        console.print(f"skipped (sidecar or output files): {', '.join(str(p) for p in result.skipped)}", markup=False)
    if result.skipped_failure_rows:
        console.print(f"skipped {result.skipped_failure_rows} failure record(s): failures are never metrics")
    if settings.count_failure_classes_as_zero:
        console.print(
            f"counted {result.counted_failures} failed rollout(s) as 0 in the metrics "
            f"({', '.join(settings.count_failure_classes_as_zero)})",
            markup=False,
        )
    if result.merged_path:
        console.print(f"  merged rollouts:   {result.merged_path}", markup=False)
    console.print(f"  aggregate metrics: {result.metrics_path}", markup=False)
    return 0


def profile(invocation: Invocation) -> int:
    from nemo_gym.config.compose import ComposeOptions, compose
    from nemo_gym.rollouts.config import RewardProfileConfig
    from nemo_gym.rollouts.profile import print_profile, profile_rewards

    composed = compose(ComposeOptions(overrides=invocation.overrides, dummy_model=True))
    settings = invocation.settings(RewardProfileConfig, composed.config)
    rollouts = Path(settings.rollouts_jsonl_fpath).expanduser()
    result = profile_rewards(_inputs_path(settings), rollouts, allow_partial=settings.allow_partial_rollouts)
    print_profile(result, console, max_rows=invocation.get("max_rows") or DEFAULT_PROFILE_ROWS)
    if result.missing_keys:
        shown = ", ".join(f"{t}:{r}" for t, r in result.missing_keys[:10])
        more = f", … {len(result.missing_keys) - 10} more" if len(result.missing_keys) > 10 else ""
        console.print(f"[yellow]missing rollouts[/yellow] (task:rollout): {shown}{more}")
    console.print(f"  reward profiling: {result.profiling_path}", markup=False)
    console.print(f"  agent metrics:    {result.agent_metrics_path}", markup=False)
    return 0


def reverify(invocation: Invocation) -> int:
    if invocation.get("atif_manifest") or invocation.get("input_format") not in (None, "gym"):
        from nemo_gym.cli.commands.export import reverify_atif

        return reverify_atif(invocation)
    return report_reverify(reverify_summary(invocation), err_console)


def reverify_summary(invocation: Invocation) -> Any:
    """Re-verify the stored rollouts the flags name, starting the verifying servers unless ``--no-serve``."""
    from nemo_gym.config.compose import ComposeOptions, compose
    from nemo_gym.jsonl import check_writable_output
    from nemo_gym.rollouts.config import ReverifyConfig
    from nemo_gym.rollouts.reverify import (
        ReverifyOptions,
        config_for_reverify,
        plan_reverify,
        reverify_rollouts,
        verifier_of_agents,
    )

    stderr = err_console
    no_serve = bool(invocation.get("no_serve"))
    composed = compose(
        ComposeOptions(
            overrides=invocation.overrides,
            dummy_model=True,
            reserve_ports=not no_serve,
            require_server_instances=not no_serve,
        )
    )
    settings = invocation.settings(ReverifyConfig, composed.config)
    options = ReverifyOptions(
        inputs_path=_inputs_path(settings),
        rollouts_path=Path(settings.rollouts_jsonl_fpath).expanduser(),
        output_path=check_writable_output(settings.output_jsonl_fpath).resolve(),
        concurrency=settings.num_samples_in_parallel,
        force=settings.force,
        limit=settings.limit,
        disable_aggregation=settings.disable_aggregation,
        verify_timeout_s=settings.verify_timeout_seconds,
    )
    plan = plan_reverify(options)  # every file problem is reported before a server starts
    if no_serve:
        summary = reverify_rollouts(plan, _head_server_config(composed))
    else:
        from nemo_gym.launcher import running_servers

        routes = verifier_of_agents(composed, list(plan.rollouts_per_agent))
        needed = sorted(set(routes.values()))
        stderr.print(f"Starting {', '.join(needed)} and what they need (logs in results/logs/) …")
        with running_servers(config=config_for_reverify(composed, set(needed))) as launcher:
            summary = reverify_rollouts(plan, launcher.composed, routes)
    return summary


def report_reverify(summary: Any, stderr: GymConsole) -> int:
    from nemo_gym.rollouts.aggregate import print_key_metrics

    if summary.metrics:
        print_key_metrics(summary.metrics, stderr)
    if summary.unsafe_servers:
        stderr.print(
            f"[yellow]warning:[/yellow] forced past /reverify_mode of {', '.join(summary.unsafe_servers)}: "
            "their new rewards may be wrong (rows marked _ng_reverify_unsafe)"
        )
    line = f"Re-verified {summary.verified} rollouts"
    if summary.failed:
        line += f", {summary.failed} failed ({dict(summary.failure_classes)})"
    line += f" in {summary.elapsed_s:.1f}s: {summary.changed} reward(s) changed"
    line += f" ({summary.increased} up, {summary.decreased} down)"
    if summary.verified:
        before = summary.previous_reward_sum / summary.verified
        line += f"; mean reward {before:.4f} -> {summary.reward_sum / summary.verified:.4f}"
    stderr.print(line)
    stderr.print(f"  rollouts:          {summary.output_path}", markup=False)
    if summary.failed:
        stderr.print(f"  failures:          {summary.failures_path}", markup=False)
    if summary.metrics_path:
        stderr.print(f"  aggregate metrics: {summary.metrics_path}", markup=False)
    sys.stderr.flush()
    return 0 if not summary.failed else EXIT_SOME_ROLLOUTS_FAILED


def compare(invocation: Invocation) -> int:
    """Each candidate against the baseline: reports written, one summary line per candidate printed."""
    from nemo_gym.errors import ConfigError
    from nemo_gym.rollouts.compare import REPORT_FORMATS, read_run, write_reports
    from nemo_gym.run_comparison import compare_runs

    report_format = invocation.get("report_format") or "both"
    if report_format not in REPORT_FORMATS:
        raise ConfigError(f"--report-format must be one of {', '.join(REPORT_FORMATS)}, got {report_format!r}")
    baseline_path = invocation.get("baseline")
    candidate_paths = [p.strip() for value in invocation.get("candidates") or [] for p in value.split(",") if p.strip()]
    if not baseline_path or not candidate_paths:
        raise ConfigError("gym eval compare needs --baseline PATH and --candidates PATH [PATH ...]")
    baseline = read_run(Path(baseline_path).expanduser())
    comparisons = [compare_runs(baseline, read_run(Path(p).expanduser())) for p in candidate_paths]
    output_dir = Path(invocation.get("output_dir") or Path(candidate_paths[-1]).expanduser().parent)
    written = write_reports(comparisons, output_dir, report_format)
    for c in comparisons:
        console.print(
            f"{c.candidate}: mean reward {c.baseline_mean:.4f} -> {c.candidate_mean:.4f}, difference "
            f"{c.mean_difference:+.4f} ({c.confidence:.0%} CI [{c.ci_low:+.4f}, {c.ci_high:+.4f}]) over "
            f"{len(c.tasks)} tasks; {len(c.fail_to_pass)} fail -> pass, {len(c.pass_to_fail)} pass -> fail; "
            f"failed rollouts {c.baseline_failed} baseline, {c.candidate_failed} candidate",
            markup=False,
        )
    for path in written:
        console.print(f"  report: {path}", markup=False)
    return 0


COMMANDS: tuple[Command, ...] = (
    Command(
        "eval",
        "run",
        "collect scored rollouts (starts the servers unless --no-serve)",
        run,
        CONFIG_FLAGS + MODEL_FLAGS + RUN_FLAGS,
        examples=(
            "example: gym eval run --resources-server example_single_tool_call "
            "--input resources_servers/example_single_tool_call/data/example.jsonl "
            "--agent example_single_tool_call_simple_agent --output results/weather.jsonl",
        ),
    ),
    Command(
        "eval",
        "aggregate",
        "merge rollout shards and compute their metrics from the files (servers only with --servers)",
        aggregate,
        AGGREGATE_FLAGS,
        examples=("example: gym eval aggregate --input-glob 'results/shard_*.jsonl' --output results/all.jsonl",),
    ),
    Command(
        "eval",
        "profile",
        "per-task pass rates and pass@k of a run, from its rollouts and materialized inputs",
        profile,
        PROFILE_FLAGS,
        examples=("example: gym eval profile --rollouts results/weather.jsonl",),
    ),
    Command(
        "eval",
        "compare",
        "a baseline run against candidate runs of the same tasks: mean reward difference with a 95% interval, "
        "pass@k, flipped tasks",
        compare,
        COMPARE_FLAGS,
        examples=(
            "example: gym eval compare --baseline results/weather.jsonl --candidates results/weather.jsonl "
            "-o results/compare",
        ),
    ),
    Command(
        "eval",
        "reverify",
        "re-score stored rollouts with the current verifier, no inference (starts servers unless --no-serve)",
        reverify,
        CONFIG_FLAGS + MODEL_FLAGS + REVERIFY_FLAGS,
        examples=(
            "example: gym eval reverify --resources-server example_single_tool_call --rollouts results/weather.jsonl "
            "--output results/weather_reverified.jsonl",
            "ATIF:    gym eval reverify --resources-server example_single_tool_call --atif-manifest results/weather_atif",
        ),
    ),
)


def prepare(invocation: Invocation) -> int:
    """Write the data of every benchmark in the composed config by running its prepare script."""
    from nemo_gym.benchmarks import PrepareBenchmarksConfig, prepare_benchmarks
    from nemo_gym.config.compose import ComposeOptions, compose

    composed = compose(ComposeOptions(overrides=invocation.overrides, dummy_model=True))
    settings = invocation.settings(PrepareBenchmarksConfig, composed.config)
    for result in prepare_benchmarks(composed.config, settings):
        with result.path.open("rb") as handle:
            rows = sum(1 for line in handle if line.strip())
        state = "cached  " if result.cached else "prepared"
        console.print(f"{state} {result.job.label}: {rows} rows in {result.path}", markup=False)
    return 0


COMMANDS += (
    Command(
        "eval",
        "prepare",
        "write the data of the benchmarks in the config by running their prepare scripts",
        prepare,
        CONFIG_FLAGS,
        examples=(
            "example: gym eval prepare --benchmark arithmetic '+prepare_script_args={num_problems: 50}'",
            "options: +use_cached_prepared_benchmarks=true  +num_prepare_benchmark_processes=N",
        ),
    ),
)
COMMANDS += EXPORT_COMMANDS


def _counts(counter: Any) -> str:
    """``transport_timeout: 2, verifier_error: 1``, most frequent first."""
    return ", ".join(f"{name}: {count}" for name, count in counter.most_common())
