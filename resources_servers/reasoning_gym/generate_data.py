"""Write reasoning_gym train/validation JSONL files with the reasoning-gym generators (offline, deterministic).

    python resources_servers/reasoning_gym/generate_data.py --tasks leg_counting,basic_arithmetic \\
        --train-size 1000 --validation-size 100 --seed 7

Each row holds the prompt plus the generator's ``question``, ``answer`` and ``metadata``, everything the scorer needs,
so a file can be verified anywhere. Train and validation are drawn with different seeds. Every row is checked on the
way out: a reference answer that does not score 1.0 after the JSON round trip is reported (tasks whose puzzles have
many valid answers store none, and are not checked).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_TASKS = (
    "basic_arithmetic",
    "leg_counting",
    "gcd",
    "fraction_simplification",
    "number_sorting",
    "word_sorting",
    "spell_backward",
    "family_relationships",
    "knights_knaves",
    "simple_equations",
)
INSTRUCTION = (
    "Solve the task below. Think it through, then give only your final answer inside <answer></answer> tags, "
    "for example <answer>42</answer>."
)
logger = logging.getLogger("reasoning_gym.generate_data")


def _plain(value: Any) -> Any:
    """JSON-safe copy of generator metadata (tuples become lists, sets sorted lists, odd objects strings)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def make_row(entry: dict[str, Any]) -> dict[str, Any]:
    question = str(entry["question"])
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"{INSTRUCTION}\n\n{question}"}]},
        "question": question,
        "answer": _plain(entry.get("answer")),
        "metadata": _plain(entry.get("metadata") or {}),
    }


def generate_rows(tasks: list[str], size: int, seed: int) -> Iterator[dict[str, Any]]:
    """``size`` rows per task, interleaved task by task so a prefix of the file covers every task."""
    import reasoning_gym

    datasets = [reasoning_gym.create_dataset(task, size=size, seed=seed + i) for i, task in enumerate(tasks)]
    scorers = {task: reasoning_gym.get_score_answer_fn(task) for task in tasks}
    for index in range(size):
        for task, dataset in zip(tasks, datasets, strict=True):
            row = make_row(dataset[index])
            row["metadata"].setdefault("source_dataset", task)
            if row["answer"] is not None:
                entry = {"question": row["question"], "answer": row["answer"], "metadata": row["metadata"]}
                score = scorers[task](answer=str(row["answer"]), entry=json.loads(json.dumps(entry)))
                if score < 1.0:
                    logger.warning("%s #%d: its reference answer scores %.3f after JSON; kept", task, index, score)
            yield row


def write_jsonl(path: Path, rows: Iterator[dict[str, Any]]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS), help="comma-separated reasoning-gym task names")
    parser.add_argument("--train-size", type=int, default=1000, help="rows per task in the train file")
    parser.add_argument("--validation-size", type=int, default=100, help="rows per task in the validation file")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--output-dir", type=Path, default=HERE / "data")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from reasoning_gym.factory import DATASETS

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = sorted(set(tasks) - set(DATASETS))
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}; known: {', '.join(sorted(DATASETS))}")
    # Validation seeds are offset far from train seeds so the two splits are drawn independently.
    splits = (("train", args.train_size, args.seed), ("validation", args.validation_size, args.seed + 1_000_003))
    for split, size, seed in splits:
        if size > 0:
            path = args.output_dir / f"{split}.jsonl"
            count = write_jsonl(path, generate_rows(tasks, size, seed))
            logger.info("wrote %d rows to %s", count, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
