"""One rollout batch of an RL trainer, collected the way NeMo RL collects it: ``RolloutCollectionHelper``.

NeMo RL starts the environment's servers, then in every training step hands a batch of rows to
``RolloutCollectionHelper.run_examples`` and reads back each row's scored rollout: the ``response`` (every model turn,
tool call and tool result, with token ids and logprobs when the model server returns them, as ``vllm_model`` does)
and the ``reward`` from the resources server's ``/verify``. This script is that step, without the trainer: it sends
every row ``--group-size`` times (GRPO's group), and turns the rewards into group-relative advantages.

Start servers first, in another terminal (any environment and model; the scripted model needs no weights):

    gym env start --resources-server example_single_tool_call --model-type scripted_model

then run:

    python docs/examples/rollout_collection_helper.py \\
        --input resources_servers/example_single_tool_call/data/example.jsonl \\
        --agent example_single_tool_call_simple_agent

The helper finds the servers through the head server (``--head-server``, default ``127.0.0.1:11000``, what
``gym env start`` prints) and the run's token in the token file ``gym env start`` wrote for that address.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from nemo_gym.rollout_collection import NG_FAILURE_CLASS_KEY, BaseServerConfig, RolloutCollectionHelper

GROUP_KEY = "example_group"
"""Which input row a rollout came from; any extra field of a row comes back with it."""


def batch(input_path: Path, agent: str, group_size: int, limit: int | None) -> list[dict[str, Any]]:
    """Each input row ``group_size`` times, addressed to ``agent`` (``agent_ref``) and tagged with its group."""
    lines = [line for line in input_path.read_text(encoding="utf-8").splitlines() if line.strip()][:limit]
    rows = []
    for group, line in enumerate(lines):
        row = json.loads(line)
        rows += [{**row, "agent_ref": {"name": agent}, GROUP_KEY: group} for _ in range(group_size)]
    return rows


async def collect(rows: list[dict[str, Any]], head: BaseServerConfig) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every rollout of the batch, in the order they finish; a failed one comes back marked, it does not raise."""
    helper = RolloutCollectionHelper()
    return [(row, result) async for row, result in helper.run_examples(rows, head_server_config=head)]


def advantages(results: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[dict[str, Any]]:
    """GRPO's signal: each rollout's reward minus the mean reward of its group (failed rollouts left out)."""
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row, result in results:
        if NG_FAILURE_CLASS_KEY not in result:
            groups[row[GROUP_KEY]].append(result)
    scored = []
    for group, members in sorted(groups.items()):
        baseline = sum(r["reward"] for r in members) / len(members)
        for result in members:
            output = result["response"]["output"]
            scored.append({
                "group": group, "reward": result["reward"], "advantage": result["reward"] - baseline,
                "generated_items": sum(item.get("type") != "function_call_output" for item in output),
                "tool_calls": sum(item.get("type") == "function_call" for item in output),
            })  # fmt: skip
    return scored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, required=True, help="JSONL rows (responses_create_params, ...)")
    parser.add_argument("--agent", required=True, help="the agent instance that runs each row")
    parser.add_argument("--head-server", default="127.0.0.1:11000", help="HOST:PORT of the running head server")
    parser.add_argument("--group-size", type=int, default=2, help="rollouts per row")
    parser.add_argument("--limit", type=int, default=None, help="only the first N rows")
    args = parser.parse_args()

    host, _, port = args.head_server.rpartition(":")
    rows = batch(args.input, args.agent, args.group_size, args.limit)
    results = asyncio.run(collect(rows, BaseServerConfig(host=host, port=int(port))))
    scored = advantages(results)
    for entry in scored:
        print(json.dumps(entry))
    failed = [result[NG_FAILURE_CLASS_KEY] for _, result in results if NG_FAILURE_CLASS_KEY in result]
    mean = sum(s["reward"] for s in scored) / len(scored) if scored else 0.0
    print(f"{len(results)} rollouts, {len(failed)} failed {sorted(set(failed))}, mean reward {mean:.3f}")


if __name__ == "__main__":
    main()
