"""The settings of ``gym dataset export`` and their defaults, written once here (the CLI's help reads them).

Kept apart from :mod:`nemo_gym.training.export` so that the command line can show them without importing the
export's dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ExportFormat = Literal["sft", "dpo"]
PairMode = Literal["best-worst", "all"]

FORMATS: tuple[ExportFormat, ...] = ("sft", "dpo")
PAIR_MODES: tuple[PairMode, ...] = ("best-worst", "all")
DEFAULT_MIN_REWARD = 1.0
"""SFT keeps rollouts scoring at least this: with our 0/1 verifiers, the ones that solved their task."""
DEFAULT_MIN_MARGIN = 0.0
"""DPO pairs need chosen - rejected > 0 (never a tie) and >= this."""
DEFAULT_PAIR_MODE: PairMode = "best-worst"


@dataclass(frozen=True)
class ExportOptions:
    inputs: tuple[Path, ...]
    output: Path
    format: ExportFormat
    min_reward: float = DEFAULT_MIN_REWARD
    min_margin: float = DEFAULT_MIN_MARGIN
    pairs: PairMode = DEFAULT_PAIR_MODE
    keep_incomplete: bool = False
    strict: bool = False
    overwrite: bool = False
    show_progress: bool = True
