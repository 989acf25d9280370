"""Write Blackjack task rows: the same instructions for every row, one deck seed per row.

The deal happens on the server at ``/reset`` (from ``seed``), so a row is only the prompt, the action tool and the
seed. ``data/example.jsonl`` is ``python resources_servers/blackjack/generate_data.py`` (five fixed seeds chosen to
cover a hit-then-win hand, a natural and plain hands); ``--size N --first-seed S --output PATH`` writes training rows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ACTION_TOOL = "blackjack_action"  # kept in step with app.ACTION_TOOL (checked by the tests)
EXAMPLE_SEEDS = (3, 2, 11, 17, 25)

SYSTEM_PROMPT = (
    "You are playing one hand of Blackjack against the dealer. Cards 2-10 count their number, J, Q and K count 10, "
    "an ace counts 11 or 1. Get closer to 21 than the dealer without going over. Each turn, choose one action: "
    "'hit' takes another card, 'stand' ends your turn, then the dealer draws until reaching 17 or more. "
    f"Give your action by calling the {ACTION_TOOL} tool, or by writing <action>hit</action> or "
    "<action>stand</action> in your reply. Win +1, draw 0, lose -1, blackjack (ace + ten-value card) +1.5."
)

ACTION_TOOL_SPEC: dict[str, Any] = {
    "type": "function",
    "name": ACTION_TOOL,
    "description": "Take your Blackjack action for this turn.",
    "parameters": {
        "type": "object",
        "properties": {"action": {"type": "string", "enum": ["hit", "stand"], "description": "hit or stand"}},
        "required": ["action"],
        "additionalProperties": False,
    },
    "strict": True,
}


def build_row(seed: int) -> dict[str, Any]:
    return {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": "Deal me in."},
            ],
            "tools": [ACTION_TOOL_SPEC],
            "parallel_tool_calls": False,
        },
        "seed": seed,
        "agent_ref": {"type": "responses_api_agents", "name": "blackjack_gymnasium_agent"},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "data" / "example.jsonl")
    parser.add_argument("--size", type=int, default=None, help="rows with consecutive seeds (default: the examples)")
    parser.add_argument("--first-seed", type=int, default=1000)
    args = parser.parse_args(argv)
    seeds = EXAMPLE_SEEDS if args.size is None else range(args.first_seed, args.first_seed + args.size)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("w", encoding="utf-8") as out:
        for seed in seeds:
            out.write(json.dumps(build_row(seed)) + "\n")


if __name__ == "__main__":
    main()
