"""``gym dataset ...``: prepare datasets for training and evaluation.

``collate`` (legacy ``ng_prepare_data``) validates the agents' datasets, saves their statistics and writes one
collated file per dataset type; ``render`` (legacy ``ng_materialize_prompts``) applies a prompt template to raw rows.
Both only read configs (a dummy policy model stands in), so no server or model is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_gym.cli.command import Command, Invocation
from nemo_gym.cli.flags import CONFIG_FLAGS, Flag
from nemo_gym.cli.output import GymConsole, console, err_console
from nemo_gym.errors import ConfigError
from nemo_gym.training.export_config import DEFAULT_MIN_MARGIN, DEFAULT_MIN_REWARD, DEFAULT_PAIR_MODE

EXIT_INVALID_ROWS = 3
"""Exit code of a collate run that skipped offending rows (each reported as file:line; the output lacks them)."""
EXIT_METRICS_CONFLICT = 4
"""Exit code of a collate run whose metrics disagree with a metrics file on disk (see the *_conflict.json files)."""
MAX_PROBLEMS_SHOWN = 20
"""Problem rows listed by ``gym dataset export`` (the rest are counted)."""

COLLATE_FLAGS = (
    Flag(("--mode",), "train_preparation (train, validation, benchmark datasets) or example_validation (example)",
         override_key="mode", metavar="MODE"),
    Flag(("--output-dir", "-o"), "directory for the collated <type>.jsonl files and their metrics",
         override_key="output_dirpath", metavar="DIR"),
    Flag(("--download",), "first download missing datasets from their `source:`", override_key="should_download",
         switch=True),
    Flag(("--overwrite-metrics",), "replace metrics files that disagree with the data instead of failing",
         override_key="overwrite_metrics_conflicts", switch=True),
)  # fmt: skip

RENDER_FLAGS = (
    Flag(("--input", "-i"), "raw JSONL rows", override_key="input_jsonl_fpath", metavar="PATH"),
    Flag(("--prompt-config",), "prompt YAML with a `user` (and optional `system`) template",
         override_key="prompt_config", metavar="PATH"),
    Flag(("--output", "-o"), "JSONL file for the rendered rows", override_key="output_jsonl_fpath", metavar="PATH"),
)  # fmt: skip

EXPORT_FLAGS = (
    Flag(("--format", "-f"), "sft: conversations of well-scored rollouts; dpo: chosen/rejected pairs per task",
         metavar="sft|dpo"),
    Flag(("--input", "-i"), "rollouts .jsonl written by `gym eval run` (repeatable: runs of the same inputs)",
         repeatable=True, metavar="PATH"),
    Flag(("--output", "-o"), "JSONL file for the dataset", metavar="PATH"),
    Flag(("--min-reward",), f"sft: keep rollouts with reward >= this (default {DEFAULT_MIN_REWARD:g})",
         value_type=float),
    Flag(("--pairs",), f"dpo: best-worst (one pair per task) or all (every two rollouts whose rewards differ; "
         f"default {DEFAULT_PAIR_MODE})", metavar="best-worst|all"),
    Flag(("--min-margin",), f"dpo: chosen's reward must exceed rejected's by at least this (ties never pair; default "
         f"{DEFAULT_MIN_MARGIN:g})", value_type=float, minimum=0),
    Flag(("--keep-incomplete",), "also export responses cut off at their token limit (status: incomplete)",
         switch=True),
    Flag(("--strict",), "stop at the first row that cannot be used (default: skip it, report it as file:line, exit 3)",
         switch=True),
    Flag(("--overwrite",), "replace an existing --output", switch=True),
)  # fmt: skip


def collate(invocation: Invocation) -> int:
    from nemo_gym.datasets.collate import CollateConfig
    from nemo_gym.datasets.collate import collate as run_collate
    from nemo_gym.global_config import parse_global_config_dict

    config = parse_global_config_dict(invocation.overrides, dummy_model=True)
    settings = CollateConfig.model_validate(dict(config))
    result = run_collate(settings, config)
    _print_collate_report(result, err_console)
    if result.conflicts:
        return EXIT_METRICS_CONFLICT
    if result.problems:
        return EXIT_INVALID_ROWS
    return 0


def _averages(metrics: dict[str, Any]) -> str:
    from nemo_gym.datasets import statistics as s

    def average(key: str) -> str:
        value = (metrics.get(key) or {}).get(s.AVERAGE)
        return "-" if value is None else f"{value}"

    return (
        f"{metrics[s.EXAMPLES_KEY]} examples; avg tools {average(s.TOOLS_KEY)}, avg turns {average(s.TURNS_KEY)}, "
        f"avg words {average(s.WORDS_KEY)}"
        + (f", avg tokens {average(s.TOKENS_KEY)}" if s.TOKENS_KEY in metrics else "")
        + f"; {metrics[s.UNIQUE_PARAMS_KEY]} unique create params, "
        f"{metrics[s.UNIQUE_USER_MESSAGES_KEY]} unique user messages"
    )


def _print_collate_report(result: Any, stderr: GymConsole) -> None:
    out = console
    if result.agents_without_datasets:
        out.print(f"Agents without datasets: {', '.join(result.agents_without_datasets)}", markup=False)
    for label in result.downloaded:
        out.print(f"Downloaded {label}", markup=False)
    for report in result.datasets:
        skipped = f", {len(report.problems)} invalid row(s) skipped" if report.problems else ""
        repeats = report.job.dataset.num_repeats
        out.print(f"{report.job.label}, x{repeats}: {_averages(report.statistics.to_metrics())}{skipped}", markup=False)
        if report.metrics_file is not None:
            out.print(f"  metrics: {report.metrics_file.path} ({report.metrics_file.status})", markup=False)
    if result.problems:
        stderr.print(f"{len(result.problems)} invalid row(s), not written to the output:", markup=False)
        for problem in result.problems:
            stderr.print(f"  {problem}", markup=False)
    for conflict in result.conflicts:
        stderr.print(
            f"metrics conflict: {conflict.path} disagrees with the data (new metrics: {conflict.conflict_path}):",
            markup=False,
        )
        for difference in conflict.differences:
            stderr.print(f"  {difference}", markup=False)
    if result.conflicts:
        stderr.print("Check the data; re-run with --overwrite-metrics to accept the new metrics.", markup=False)
    warnings = [r.metrics_file for r in result.datasets if r.metrics_file and r.metrics_file.warning]
    for metrics_file in warnings + [a for a in result.aggregates.values() if a.warning]:
        stderr.print(f"warning: {metrics_file.warning}", markup=False)
    out.print(f"Collated ({result.mode}) into {result.output_dir}:", markup=False)
    for dataset_type, path in result.outputs.items():
        aggregate = result.aggregates[dataset_type]
        out.print(f"  {dataset_type}: {path} ({result.rows_per_type[dataset_type]} rows)", markup=False)
        out.print(f"    metrics: {aggregate.path} ({aggregate.status})", markup=False)


def render(invocation: Invocation) -> int:
    from nemo_gym.datasets.render import RenderConfig, render_file
    from nemo_gym.global_config import parse_global_config_dict

    config = parse_global_config_dict(invocation.overrides, dummy_model=True)
    settings = RenderConfig.model_validate(dict(config))
    result = render_file(
        Path(settings.input_jsonl_fpath).expanduser(),
        settings.prompt_config,
        Path(settings.output_jsonl_fpath).expanduser(),
    )
    console.print(f"Rendered {result.rows} row(s) into {result.output_path}", markup=False)
    return 0


def export(invocation: Invocation) -> int:
    from nemo_gym.training.export import export_rollouts
    from nemo_gym.training.export_config import ExportOptions

    stray = [token for token in invocation.overrides if token != "++verbose=true"]
    if stray:
        raise ConfigError(f"gym dataset export: unknown argument {stray[0]!r}; see `gym dataset export --help`")
    export_format = invocation.get("format")
    if not export_format or not invocation.get("output"):
        raise ConfigError("gym dataset export needs --format sft|dpo, --input ROLLOUTS.jsonl and --output PATH")
    only_for = {
        "min_reward": ("--min-reward", "sft"),
        "pairs": ("--pairs", "dpo"),
        "min_margin": ("--min-margin", "dpo"),
    }
    for name, (flag, wanted) in only_for.items():
        if invocation.get(name) is not None and export_format != wanted:
            raise ConfigError(f"{flag} applies to --format {wanted} only")
    options = ExportOptions(
        inputs=tuple(Path(p).expanduser() for p in invocation.get("input") or ()),
        output=Path(invocation.get("output")).expanduser(),
        format=export_format,
        min_reward=_given(invocation, "min_reward", DEFAULT_MIN_REWARD),
        min_margin=_given(invocation, "min_margin", DEFAULT_MIN_MARGIN),
        pairs=_given(invocation, "pairs", DEFAULT_PAIR_MODE),
        keep_incomplete=bool(invocation.get("keep_incomplete")),
        strict=bool(invocation.get("strict")),
        overwrite=bool(invocation.get("overwrite")),
    )
    stats = export_rollouts(options)
    for line in stats.lines():
        console.print(line, markup=False)
    if stats.problems:
        err_console.print(f"{len(stats.problems)} row(s) could not be used, not exported (--strict stops at the first):",
                          markup=False)  # fmt: skip
        for problem in stats.problems[:MAX_PROBLEMS_SHOWN]:
            err_console.print(f"  {problem}", markup=False)
        if len(stats.problems) > MAX_PROBLEMS_SHOWN:
            err_console.print(f"  … {len(stats.problems) - MAX_PROBLEMS_SHOWN} more", markup=False)
        return EXIT_INVALID_ROWS
    if not stats.rows_written:
        err_console.print("warning: the dataset is empty; see what was left out above", markup=False)
    return 0


def _given(invocation: Invocation, name: str, default: Any) -> Any:
    value = invocation.get(name)
    return default if value is None else value


COMMANDS: tuple[Command, ...] = (
    Command(
        "dataset",
        "collate",
        "validate the agents' datasets, save their statistics, and collate them per type (train, validation, ...)",
        collate,
        CONFIG_FLAGS + COLLATE_FLAGS,
        description=(
            "Validate every in-scope dataset of every agent (each bad row is reported as file:line and left out),\n"
            "save <stem>_metrics.json beside each dataset, and write <type>.jsonl and <type>_metrics.json into the\n"
            f"output directory. Exit {EXIT_INVALID_ROWS}: invalid rows were skipped. Exit {EXIT_METRICS_CONFLICT}: the "
            "metrics disagree with\nan existing metrics file (the new ones are in <stem>_metrics_conflict.json)."
        ),
        examples=(
            "example: gym dataset collate --resources-server example_multi_step --mode example_validation "
            "--output-dir data/example_multi_step",
        ),
    ),
    Command(
        "dataset",
        "render",
        "apply a prompt template to raw rows (fills responses_create_params.input)",
        render,
        RENDER_FLAGS,
        examples=("example: gym dataset render --input raw.jsonl --prompt-config prompt.yaml --output rows.jsonl",),
    ),
    Command(
        "dataset",
        "export",
        "turn scored rollouts into a TRL-ready SFT (conversations) or DPO (chosen/rejected pairs) dataset",
        export,
        EXPORT_FLAGS,
        description=(
            "SFT: one conversation (messages with tool calls and results, the tools' schemas) per rollout whose reward\n"
            "is at least --min-reward. DPO: the rollouts of each task (_ng_task_index) paired by reward, chosen above\n"
            "rejected. Prints what was read, kept and left out. A row that cannot be used is reported as file:line\n"
            f"and skipped (exit {EXIT_INVALID_ROWS}); --strict stops at the first. Responses cut off at their token "
            "limit are left out\nunless --keep-incomplete. An existing --output is replaced only with --overwrite."
        ),
        examples=(
            "example: gym dataset export --format sft --input resources_servers/example_single_tool_call/data/"
            "example_rollouts.jsonl --output data/example_sft.jsonl",
            "example: gym dataset export --format dpo --input results/shard_0.jsonl --input results/shard_1.jsonl "
            "--output data/shard_pairs.jsonl --pairs all --min-margin 0.5",
        ),
    ),
)
