"""The inputs of a collection run: every row checked and its rollouts written (``materialize.py``) before any
rollout starts, from ``--input`` or from the agents' datasets of a split.

Nothing here loads the HTTP machinery of the rollouts, so ``forked_check.py`` can check the rows in a forked child
while the collect command itself loads that machinery; and a run from ``--input`` (:class:`RowsToCheck` without a
config) loads no config machinery either.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_gym.config.datasets import AGENT_REF_KEY, BenchmarkDatasetConfig
from nemo_gym.errors import ConfigError
from nemo_gym.jsonl import JsonlWriter, iter_jsonl
from nemo_gym.rollouts.materialize import Materialized, MaterializeOptions, materialize
from nemo_gym.rollouts.outputs import recorded_fingerprint

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from nemo_gym.config.compose import ComposedConfig
    from nemo_gym.datasets.validation import CheckedParams
    from nemo_gym.rollouts.config import RolloutCollectionConfig


def agent_names(config: ComposedConfig | DictConfig) -> list[str]:
    """Every agent instance of a config, started or not."""
    from nemo_gym.config.compose import ComposedConfig

    return [instance.name for instance in ComposedConfig.of(config).instances_of("responses_api_agents")]


@dataclass
class SplitInput:
    path: Path
    num_repeats: dict[str, int]
    """Rollouts per row that each agent's datasets ask for (their ``num_repeats``); used unless --num-repeats is set."""


def prepare_split_input(
    config: ComposedConfig | DictConfig, split: str, path: Path, agent: str | None = None
) -> SplitInput:
    """Concatenate the agents' datasets of type ``split`` into one file, each row tagged with its agent; with
    ``agent`` (``--agent``), that agent's datasets only.

    Benchmark rows are raw tasks, rendered here with their dataset's ``prompt_config``. Rows are written once and the
    datasets' ``num_repeats`` come back per agent, so ``--limit N`` means N tasks; only an agent whose datasets of
    this split disagree on ``num_repeats`` gets its rows written that many times over instead.
    """
    from nemo_gym.config.compose import ComposedConfig
    from nemo_gym.config.roots import find_path
    from nemo_gym.datasets.render import PromptRenderError, PromptTemplate

    declared = [(i.name, d) for i in ComposedConfig.of(config).instances for d in i.datasets or [] if d.type == split]
    if not declared:
        raise ConfigError(f"no agent in the config declares a dataset of type {split!r}; pass --input PATH instead")
    selected = [(name, dataset) for name, dataset in declared if agent is None or name == agent]
    if not selected:
        others = ", ".join(sorted({name for name, _ in declared}))
        raise ConfigError(
            f"--agent {agent} declares no dataset of type {split!r} (agents that do: {others}); pick one of them, "
            "or pass --input PATH"
        )
    sources: list[tuple[str, Any, Path, Any]] = []
    problems = []
    for agent, dataset in selected:
        source = find_path(dataset.jsonl_fpath)
        benchmark = isinstance(dataset, BenchmarkDatasetConfig)
        if source is None or not source.is_file():
            hint = "; write it first with `gym eval prepare --benchmark NAME`" if benchmark else ""
            problems.append(f"dataset {dataset.name!r} of agent {agent}: {dataset.jsonl_fpath} does not exist{hint}")
            continue
        prompt_config = dataset.prompt_config if isinstance(dataset, BenchmarkDatasetConfig) else None
        template = PromptTemplate.load(prompt_config) if prompt_config else None
        sources.append((agent, dataset, source, template))
    if problems:
        raise ConfigError("; ".join(problems))
    repeats_seen: dict[str, set[int]] = {}
    for agent, dataset, _, _ in sources:
        repeats_seen.setdefault(agent, set()).add(dataset.num_repeats)
    uniform = {agent: seen.pop() for agent, seen in repeats_seen.items() if len(seen) == 1}
    with JsonlWriter(path, append=False) as writer:
        for agent, dataset, source, template in sources:
            copies = 1 if agent in uniform else dataset.num_repeats
            for number, row in iter_jsonl(source):
                if template is not None:
                    try:
                        row = template.apply(row)
                    except PromptRenderError as e:
                        raise ConfigError(f"{source}:{number}: {e}") from e
                row.setdefault(AGENT_REF_KEY, {"type": "responses_api_agents", "name": agent})
                for _ in range(copies):
                    writer.write(row)
    return SplitInput(path, {agent: uniform.get(agent, 1) for agent in repeats_seen})


@dataclass
class RowsToCheck:
    """What checking a run's rows needs: its settings, the config's agent names, and the config itself only where the
    rows come from the agents' datasets (``--split``). Sent to the forked checker as it is."""

    settings: RolloutCollectionConfig
    known_agents: list[str]
    config: ComposedConfig | DictConfig | None = None

    @classmethod
    def of(cls, settings: RolloutCollectionConfig, config: ComposedConfig | DictConfig) -> RowsToCheck:
        return cls(settings, agent_names(config), None if settings.input_jsonl_fpath else config)


def prepare_inputs(
    settings: RolloutCollectionConfig,
    config: ComposedConfig | DictConfig,
    checked_params: CheckedParams | None = None,
) -> Materialized:
    """Check every input row and write the materialized rows. Needs only the config's agent names, not running
    servers, so a mistake in the data is reported before anything starts. ``checked_params``: verdicts on the
    input's create params reached ahead (see ``MaterializeOptions.checked_params``)."""
    return check_rows(RowsToCheck.of(settings, config), checked_params)


def check_rows(rows: RowsToCheck, checked_params: CheckedParams | None = None) -> Materialized:
    """:func:`prepare_inputs` of what it needs from the config."""
    settings = rows.settings
    output = Path(settings.output_jsonl_fpath).expanduser().resolve()
    num_repeats = settings.num_repeats
    if settings.input_jsonl_fpath:
        input_path = Path(settings.input_jsonl_fpath).expanduser()
    elif settings.split and rows.config is not None:
        split_input = prepare_split_input(
            rows.config, settings.split, output.with_name(f"{output.stem}_{settings.split}.jsonl"), settings.agent_name
        )
        input_path = split_input.path
        if "num_repeats" not in settings.model_fields_set:  # no --num-repeats: the datasets' own num_repeats
            num_repeats = split_input.num_repeats
    else:
        raise ConfigError(
            "say what to run: --input PATH, or --split train|validation|example|benchmark for the agents' datasets"
        )
    return materialize(
        MaterializeOptions(
            input_path=input_path,
            output_path=output,
            agent_name=settings.agent_name,
            limit=settings.limit,
            num_repeats=num_repeats,
            responses_create_params=settings.responses_create_params,
            num_repeats_add_seed=settings.num_repeats_add_seed,
            known_agents=rows.known_agents,
            resume_fingerprint=recorded_fingerprint(output) if settings.resume_from_cache else None,
            checked_params=checked_params,
        )
    )
