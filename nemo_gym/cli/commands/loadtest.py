"""``gym env loadtest``: start one environment's servers and drive them at a ladder of concurrencies."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from nemo_gym.cli.command import Command, Invocation
from nemo_gym.cli.commands.eval import RUN_FLAGS
from nemo_gym.cli.flags import CONFIG_FLAGS, MODEL_FLAGS, Flag
from nemo_gym.cli.output import console, err_console
from nemo_gym.loadtest.config import DEFAULT_LADDER, DEFAULT_MAX_FAILURE_RATE, DEFAULT_STEP_SECONDS

if TYPE_CHECKING:
    from nemo_gym.config.compose import ComposedConfig
    from nemo_gym.launcher.runner import Launcher
    from nemo_gym.loadtest.config import LoadtestConfig
    from nemo_gym.loadtest.probes import Watched

SCRIPTED_MODEL = "scripted_model"
_SHARED_WITH_EVAL_RUN = ("--no-auth", "--agent", "--input", "--split", "--limit", "--temperature", "--top-p",
                         "--max-output-tokens", "--server-down-deadline")  # fmt: skip

LOADTEST_FLAGS = (
    *(flag for flag in RUN_FLAGS if flag.names[0] in _SHARED_WITH_EVAL_RUN),
    Flag(("--output", "-o"), "JSON report; the PNG curve (<stem>.png) and each step's rollouts (<stem>_steps/) "
         "go beside it", field="loadtest_output_fpath", metavar="FILE.json"),
    Flag(("--concurrency",), f"the ladder, rising (default {','.join(map(str, DEFAULT_LADDER))})",
         field="loadtest_concurrency", metavar="N,N,..."),
    Flag(("--duration",), f"seconds each step starts rollouts; those in flight then finish (default "
         f"{DEFAULT_STEP_SECONDS:g})", field="loadtest_duration_seconds", metavar="SECONDS", value_type=float,
         minimum=0.1),
    Flag(("--max-failure-rate",), f"stop after a step failing more than this share (default "
         f"{DEFAULT_MAX_FAILURE_RATE:g})", field="loadtest_max_failure_rate", metavar="SHARE", value_type=float,
         minimum=0, maximum=1),
    Flag(("--max-p99-ms",), "stop after a step whose p99 rollout latency is above this", field="loadtest_max_p99_ms",
         metavar="MS", value_type=float, minimum=0.001),
    Flag(("--model-latency-ms",), "the scripted model waits this long before each reply (a model of that speed)",
         field="loadtest_model_latency_ms", metavar="MS", value_type=float, minimum=0),
)  # fmt: skip


def loadtest(invocation: Invocation) -> int:
    from nemo_gym.config.compose import ComposeOptions, compose
    from nemo_gym.jsonl import check_writable_output
    from nemo_gym.launcher import running_servers
    from nemo_gym.launcher.preflight import compose_to_start
    from nemo_gym.loadtest.config import LoadtestConfig
    from nemo_gym.loadtest.ladder import materialize, run_ladder, steps_dir
    from nemo_gym.loadtest.report import print_report, report_json, write_report
    from nemo_gym.rollouts.fd_limit import check_open_file_limit

    looked = compose(ComposeOptions(overrides=invocation.overrides, require_server_instances=True, allow_unset=True))
    settings = invocation.settings(LoadtestConfig, looked.config)
    extra = scripted_model_overrides(looked, settings, err_console.print)
    composed = compose_to_start([*invocation.overrides, *extra])
    settings = invocation.settings(LoadtestConfig, composed.config)
    output = check_writable_output(settings.loadtest_output_fpath)
    check_open_file_limit(max(settings.loadtest_concurrency), serving=True)
    inputs = materialize(settings, composed)  # a bad row is reported before any server starts
    err_console.print(f"Starting servers (logs in {Path(composed.config.results_dir) / 'logs'}) …", markup=False)
    with running_servers(config=composed) as launcher:
        result = run_ladder(settings, launcher.composed, _watched(launcher), inputs, err_console.print)
    environment = _environment_name(composed)
    report = report_json(result, environment, _settings_summary(settings))
    print_report(result, console)
    curve = write_report(report, Path(output))
    console.print(f"  report:   {output}", markup=False)
    console.print(f"  rollouts: {steps_dir(settings)}/c<N>.jsonl (one file per step)", markup=False)
    if curve is not None:
        console.print(f"  curve:    {curve}", markup=False)
    else:
        console.print("  curve:    not drawn: matplotlib is not installed (uv pip install matplotlib)", markup=False)
    return 0


def scripted_model_overrides(
    composed: ComposedConfig, settings: LoadtestConfig, say: Callable[[str], None]
) -> list[str]:
    """Overrides for the scripted model: ``--model-latency-ms`` as its reply delay, and, when no script is
    configured, per-task scripts from the environment's data (``loadtest/scripts.py``: so verify does real work)."""
    from nemo_gym.config.schemas import implementation_dir
    from nemo_gym.config.tree import plain_dict
    from nemo_gym.errors import ConfigError
    from nemo_gym.loadtest.ladder import steps_dir
    from nemo_gym.loadtest.scripts import write_scripts

    config = plain_dict(composed.config)
    scripted = [i.name for i in composed.instances if i.implementation == SCRIPTED_MODEL]
    if settings.loadtest_model_latency_ms is not None and not scripted:
        raise ConfigError("--model-latency-ms sets the scripted model's delay: add --model-type scripted_model")
    extra: list[str] = []
    for name in scripted:
        key = f"{name}.responses_api_models.{SCRIPTED_MODEL}"
        inner = config[name]["responses_api_models"][SCRIPTED_MODEL]
        if settings.loadtest_model_latency_ms is not None:
            extra.append(f"++{key}.reply_delay_s={settings.loadtest_model_latency_ms / 1000}")
        if "scripts_file" in inner or "script" in inner:
            continue
        data_dirs = [
            found / "data"
            for i in composed.instances
            if i.SERVER_TYPE == "resources_servers" and (found := implementation_dir(i.SERVER_TYPE, i.implementation))
        ]
        scripts = steps_dir(settings) / "scripts.jsonl"
        if count := write_scripts(data_dirs, scripts):
            extra.append(f"++{key}.scripts_file={scripts}")
            say(f"The scripted model answers from {count} example scripts of the environment ({scripts}).")
    return extra


def _watched(launcher: Launcher) -> list[Watched]:
    from nemo_gym.loadtest.probes import Watched

    return [Watched(s.name, s.server_type, s.popen.pid, s.url) for s in launcher.servers if s.popen is not None]


def _environment_name(composed: ComposedConfig) -> str:
    """The resources servers (or environment servers) of the config, for the report's title."""
    for kind in ("environment_servers", "resources_servers"):
        names = sorted({i.implementation for i in composed.instances if i.SERVER_TYPE == kind})
        if names:
            return "+".join(names)
    return "+".join(sorted({i.implementation for i in composed.instances}))


def _settings_summary(settings: LoadtestConfig) -> dict[str, object]:
    fields = (
        "loadtest_concurrency",
        "loadtest_duration_seconds",
        "loadtest_max_failure_rate",
        "loadtest_max_p99_ms",
        "loadtest_model_latency_ms",
        "loadtest_max_rollouts_per_step",
        "input_jsonl_fpath",
        "split",
        "agent_name",
    )
    return {name.removeprefix("loadtest_"): getattr(settings, name, None) for name in fields}


COMMANDS: tuple[Command, ...] = (
    Command(
        "env",
        "loadtest",
        "an environment's capacity: rollouts/s, p50/p95/p99, failures and each server's CPU, memory and event-loop "
        "lag at a ladder of concurrencies, until a failure or latency limit (table, JSON, PNG curve)",
        loadtest,
        CONFIG_FLAGS + MODEL_FLAGS + LOADTEST_FLAGS,
        examples=(
            "example: gym env loadtest --resources-server example_single_tool_call --model-type scripted_model "
            "--concurrency 2,8 --duration 2 --output results/loadtest/weather.json",
        ),
    ),
)
