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
from nemo_gym.global_config import parse_global_config_dict

EXIT_INVALID_ROWS = 3
"""Exit code of a collate run that skipped offending rows (each reported as file:line; the output lacks them)."""
EXIT_METRICS_CONFLICT = 4
"""Exit code of a collate run whose metrics disagree with a metrics file on disk (see the *_conflict.json files)."""

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


def collate(invocation: Invocation) -> int:
    from nemo_gym.datasets.collate import CollateConfig
    from nemo_gym.datasets.collate import collate as run_collate

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

    config = parse_global_config_dict(invocation.overrides, dummy_model=True)
    settings = RenderConfig.model_validate(dict(config))
    result = render_file(
        Path(settings.input_jsonl_fpath).expanduser(),
        settings.prompt_config,
        Path(settings.output_jsonl_fpath).expanduser(),
    )
    console.print(f"Rendered {result.rows} row(s) into {result.output_path}", markup=False)
    return 0


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
)
