"""``gym eval ...``: collect scored rollouts and compute their metrics."""

from __future__ import annotations

import sys

from rich.console import Console

from nemo_gym.cli.flags import CONFIG_FLAGS, MODEL_FLAGS, Flag
from nemo_gym.cli.registry import Command, Invocation
from nemo_gym.config_types import BaseServerConfig
from nemo_gym.global_config import parse_global_config_dict

EXIT_SOME_ROLLOUTS_FAILED = 3
"""Exit code of a run that finished but left failed rollouts (listed in the failures file; --resume retries them)."""

RUN_FLAGS = (
    Flag(("--no-serve",), "use servers already started with `gym env start` instead of starting them", switch=True),
    Flag(("--agent", "-a"), "agent instance for rows without agent_ref", override_key="agent_name", metavar="NAME"),
    Flag(("--input", "-i"), "JSONL rows to run", override_key="input_jsonl_fpath", metavar="PATH"),
    Flag(("--output", "-o"), "JSONL file for scored rollouts", override_key="output_jsonl_fpath", metavar="PATH"),
    Flag(("--split",), "without --input: run the agents' datasets of this type", override_key="split",
         metavar="train|validation|example"),
    Flag(("--limit",), "only the first N rows", override_key="limit", metavar="N", value_type=int),
    Flag(("--num-repeats",), "rollouts per row", override_key="num_repeats", metavar="N", value_type=int),
    Flag(("--concurrency",), "rollouts in flight at once (default 256)", override_key="num_samples_in_parallel",
         metavar="N", value_type=int),
    Flag(("--resume",), "continue a previous run: skip finished rollouts, retry failed ones",
         override_key="resume_from_cache", switch=True),
    Flag(("--temperature",), "sampling temperature for every row", override_key="responses_create_params.temperature",
         value_type=float),
    Flag(("--top-p",), "nucleus sampling for every row", override_key="responses_create_params.top_p",
         value_type=float),
    Flag(("--max-output-tokens",), "output token limit for every row",
         override_key="responses_create_params.max_output_tokens", value_type=int),
    Flag(("--disable-aggregation",), "do not compute aggregate metrics", override_key="disable_aggregation",
         switch=True),
)  # fmt: skip


def run(invocation: Invocation) -> int:
    from nemo_gym.rollouts.config import RolloutCollectionConfig
    from nemo_gym.rollouts.run import run_collection

    stderr = Console(stderr=True, highlight=False)
    if invocation.get("no_serve"):
        from nemo_gym.server_utils import fetch_config_from_head_server

        config = parse_global_config_dict(invocation.overrides, dummy_model=True)
        settings = RolloutCollectionConfig.model_validate(dict(config))
        head = BaseServerConfig(host=config.head_server.host, port=config.head_server.port)
        result = _run_reporting(lambda: run_collection(settings, fetch_config_from_head_server(head)), settings, stderr)
    else:
        from nemo_gym.launcher import running_servers

        config = parse_global_config_dict(invocation.overrides, reserve_ports=True, require_server_instances=True)
        settings = RolloutCollectionConfig.model_validate(dict(config))
        stderr.print("Starting servers (logs in results/logs/) …")

        def start_and_collect():
            with running_servers(config=config) as launcher:
                return run_collection(settings, launcher.config)

        result = _run_reporting(start_and_collect, settings, stderr)
    return result


def _run_reporting(collect, settings, stderr: Console) -> int:
    from nemo_gym.rollouts.aggregate import print_key_metrics
    from nemo_gym.rollouts.collector import failures_path
    from nemo_gym.rollouts.materialize import materialized_inputs_path

    try:
        result = collect()
    except KeyboardInterrupt:
        stderr.print(
            f"[yellow]Interrupted.[/yellow] Finished rollouts are in {settings.output_jsonl_fpath}; run the same "
            "command with --resume to finish the rest."
        )
        return 130
    summary = result.summary
    if result.metrics:
        print_key_metrics(result.metrics, stderr)
    rate = summary.succeeded / summary.elapsed_s if summary.elapsed_s else 0.0
    stderr.print(
        f"{summary.succeeded} rollouts scored, {summary.failed} failed"
        + (f" ({dict(summary.failure_classes)})" if summary.failed else "")
        + (f", {summary.skipped_done} already done" if summary.skipped_done else "")
        + (f", {summary.skipped_exhausted} out of attempts" if summary.skipped_exhausted else "")
        + f" in {summary.elapsed_s:.1f}s ({rate:.1f}/s)"
    )
    output = summary.output_path
    stderr.print(f"  rollouts:            {output}")
    stderr.print(f"  materialized inputs: {materialized_inputs_path(output)}")
    if summary.failed:
        stderr.print(f"  failures:            {failures_path(output)}  (retry them with --resume)")
    if result.metrics_path:
        stderr.print(f"  aggregate metrics:   {result.metrics_path}")
    sys.stderr.flush()
    return 0 if not summary.failed else EXIT_SOME_ROLLOUTS_FAILED


COMMANDS = (
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
)
