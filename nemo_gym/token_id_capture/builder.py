"""Join a frozen rollout's ``TokenEntry`` records into chains of calls and project one as a trainable response.

A link is trusted only when proven: an entry's recorded parent must be in the snapshot and the parent-length prefix
of the entry's prompt must hash to the parent's digest (a mismatch quarantines the entry). A parent missing from the
snapshot (say, an empty generation that was left out) may be recovered by exact token-prefix matching, but never
across an unresolved boundary: an entry recorded as ``UNRESOLVED`` starts a fragment of its own. Order of capture
does not matter. The projection gives each call's output the full prompt it was generated from, so consecutive
items are prefix-contiguous; masks follow provenance (generated tokens 1, prompt tokens 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nemo_gym.token_id_capture.records import ParentResolutionStatus, TokenEntry, compute_digest


@dataclass
class Chain:
    """Calls from a root to a leaf, each entry holding its full (never delta) prompt."""

    chain_id: str
    entries: list[TokenEntry] = field(default_factory=list)

    def validate(self) -> None:
        for entry in self.entries:
            if len(entry.generation_token_ids) != len(entry.generation_log_probs):
                raise ValueError(f"call {entry.model_call_id} has ids and log-probs of different lengths")


@dataclass
class BuildNotes:
    """What the build kept, dropped and could not decide; the consumer turns these into metrics."""

    roots: int = 0
    chains: int = 0
    generated_tokens_captured: int = 0
    generated_tokens_delivered: int = 0
    delivered_fraction: float = 0.0
    unresolved_retries: list[str] = field(default_factory=list)
    unresolved_parent_calls: list[str] = field(default_factory=list)
    empty_generation_calls: list[str] = field(default_factory=list)
    parent_link_failures: dict[str, int] = field(default_factory=dict)
    terminal_chain: str = ""
    """"" (no terminal named), "delivered", "broken" (crosses a refused link) or "not_captured"."""


@dataclass
class BuildOutput:
    chains: list[Chain]
    quarantined: list[str] = field(default_factory=list)
    notes: BuildNotes = field(default_factory=BuildNotes)


def _full_prompts(entries: list[TokenEntry], notes: BuildNotes) -> tuple[list[TokenEntry], list[str]]:
    """Entries with delta prompts rebuilt from their parents; entries whose chain cannot be rebuilt are returned apart."""
    by_id = {entry.model_call_id: entry for entry in entries}
    sequences: dict[str, list[int] | None] = {}

    def sequence(call_id: str, depth: int = 0) -> list[int] | None:
        if call_id not in sequences:
            entry = by_id.get(call_id)
            if entry is None or depth > len(by_id):
                return None
            head: list[int] | None = []
            if entry.prompt_is_delta:
                head = sequence(entry.parent_call_id or "", depth + 1)
            sequences[call_id] = None if head is None else [*head, *entry.prompt_token_ids, *entry.generation_token_ids]
        return sequences[call_id]

    rebuilt, broken = [], []
    for entry in entries:
        if not entry.prompt_is_delta:
            rebuilt.append(entry)
            continue
        full = sequence(entry.model_call_id)
        if full is None:
            broken.append(entry.model_call_id)
            notes.parent_link_failures["delta_chain_broken"] = (
                notes.parent_link_failures.get("delta_chain_broken", 0) + 1
            )
            continue
        prompt = full[: len(full) - len(entry.generation_token_ids)]
        rebuilt.append(entry.model_copy(update={"prompt_token_ids": prompt, "prompt_is_delta": False}))
    return rebuilt, broken


def _prefix_parent(entry: TokenEntry, candidates: list[TokenEntry]) -> TokenEntry | None:
    """The unique candidate with the longest full sequence that the entry's prompt starts with."""
    prompt = entry.prompt_token_ids
    fitting = [
        other
        for other in candidates
        if other is not entry
        and len(other.prompt_token_ids) + len(other.generation_token_ids) <= len(prompt)
        and prompt[: len(other.prompt_token_ids)] == other.prompt_token_ids
        and prompt[len(other.prompt_token_ids) : len(other.prompt_token_ids) + len(other.generation_token_ids)]
        == other.generation_token_ids
    ]
    if not fitting:
        return None
    longest = max(len(other.prompt_token_ids) + len(other.generation_token_ids) for other in fitting)
    best = [other for other in fitting if len(other.prompt_token_ids) + len(other.generation_token_ids) == longest]
    return best[0] if len(best) == 1 else None


def _parent(entry: TokenEntry, by_id: dict[str, TokenEntry], kept: list[TokenEntry]) -> tuple[TokenEntry | None, str]:
    """(parent or None, why the recorded link was not used as recorded: "" when it was)."""
    status = entry.parent_resolution
    if status == ParentResolutionStatus.ROOT:
        return None, ""
    if status == ParentResolutionStatus.UNRESOLVED:
        return None, "parent_unresolved"
    if status is None and entry.parent_call_id is None:
        return None, "missing_resolution"
    parent = by_id.get(entry.parent_call_id or "")
    if parent is None:
        recovered = _prefix_parent(entry, kept)
        return recovered, "parent_call_id_missing_recovered" if recovered else "parent_call_id_missing"
    cumulative = [*parent.prompt_token_ids, *parent.generation_token_ids]
    length = parent.cum_len if parent.cum_len is not None else len(cumulative)
    expected = parent.digest or compute_digest(cumulative)
    prompt = entry.prompt_token_ids
    if length <= len(prompt) and compute_digest(list(prompt[:length])) == expected:
        return parent, ""
    return None, "parent_digest_mismatch"


def _path(leaf: TokenEntry, parents: dict[str, TokenEntry | None]) -> list[TokenEntry]:
    path = [leaf]
    while (parent := parents.get(path[-1].model_call_id)) is not None:
        path.append(parent)
    return path[::-1]


def prefix_merging(entries: list[TokenEntry], terminal_call_id: str | None = None) -> BuildOutput:
    """Link the entries into a forest, then return its root-to-leaf chains, the main one first."""
    notes = BuildNotes()
    full, broken = _full_prompts(list(entries), notes)
    notes.generated_tokens_captured = sum(len(entry.generation_token_ids) for entry in entries)
    kept = [entry for entry in full if entry.generation_token_ids]
    notes.empty_generation_calls = [entry.model_call_id for entry in full if not entry.generation_token_ids]
    by_id = {entry.model_call_id: entry for entry in kept}
    parents: dict[str, TokenEntry | None] = {}
    quarantined = list(broken)
    for entry in sorted(kept, key=lambda item: len(item.prompt_token_ids)):
        parent, why = _parent(entry, by_id, kept)
        if why:
            notes.parent_link_failures[why] = notes.parent_link_failures.get(why, 0) + 1
        if why == "parent_digest_mismatch":
            quarantined.append(entry.model_call_id)
        elif why in ("parent_unresolved", "parent_call_id_missing", "missing_resolution"):
            notes.unresolved_parent_calls.append(entry.model_call_id)
        parents[entry.model_call_id] = parent
    usable = [entry for entry in kept if entry.model_call_id not in quarantined]
    for entry in usable:  # a child of a quarantined call is cut loose too
        parent = parents.get(entry.model_call_id)
        if parent is not None and parent.model_call_id in quarantined:
            parents[entry.model_call_id] = None
            notes.unresolved_parent_calls.append(entry.model_call_id)
    children: dict[str, list[TokenEntry]] = {}
    for entry in usable:
        parent = parents.get(entry.model_call_id)
        if parent is not None:
            children.setdefault(parent.model_call_id, []).append(entry)
    leaves = [entry for entry in usable if entry.model_call_id not in children]
    notes.roots = sum(1 for entry in usable if parents.get(entry.model_call_id) is None)
    notes.unresolved_retries = sorted(
        leaf.model_call_id
        for leaf in leaves
        if (parent := parents.get(leaf.model_call_id)) is not None and len(children[parent.model_call_id]) > 1
    )
    chains = [Chain(chain_id=leaf.model_call_id, entries=_path(leaf, parents)) for leaf in leaves]
    notes.chains = len(chains)
    main: Chain | None = None
    if terminal_call_id is not None:
        terminal = by_id.get(terminal_call_id)
        if terminal is None or terminal_call_id in quarantined:
            notes.terminal_chain = "not_captured" if terminal is None else "broken"
        else:
            path = _path(terminal, parents)
            notes.terminal_chain = "delivered" if path[0].parent_resolution == ParentResolutionStatus.ROOT else "broken"
            main = Chain(chain_id="main", entries=path)
    if main is None and chains:
        longest = max(
            chains,
            key=lambda chain: (sum(len(e.generation_token_ids) for e in chain.entries), -chain.entries[0].created_at),
        )
        main = Chain(chain_id="main", entries=longest.entries)
    if main is not None:
        chains = [main, *(chain for chain in chains if chain.entries[-1] is not main.entries[-1])]
        notes.generated_tokens_delivered = sum(len(entry.generation_token_ids) for entry in main.entries)
    captured = notes.generated_tokens_captured
    notes.delivered_fraction = round(notes.generated_tokens_delivered / captured, 4) if captured else 0.0
    return BuildOutput(chains=chains, quarantined=quarantined, notes=notes)


def run_builder(
    entries: list[TokenEntry], builder: str = "prefix_merging", terminal_call_id: str | None = None
) -> BuildOutput:
    if builder != "prefix_merging":
        raise ValueError(f"unknown trajectory builder {builder!r} (there is prefix_merging)")
    return prefix_merging(entries, terminal_call_id=terminal_call_id)


def project_chain_to_output_items(chain: Chain) -> list[dict[str, Any]]:
    """Each call's output items, the token-carrying one holding the call's full prompt, generation and log-probs."""
    items: list[dict[str, Any]] = []
    for entry in chain.entries:
        tokens = {
            "prompt_token_ids": list(entry.prompt_token_ids),
            "generation_token_ids": list(entry.generation_token_ids),
            "generation_log_probs": list(entry.generation_log_probs),
        }
        own = [dict(item) for item in entry.output_items]
        if entry.token_item_index is None:
            own.append({"type": "message", "role": "assistant", "content": [], **tokens})
        else:
            own[entry.token_item_index].update(tokens)
        items += own
    return items


def project_main_chain_response(rollout_id: str, out: BuildOutput, model: str = "") -> dict[str, Any]:
    """The main chain as a Responses object whose token-carrying items form one unbroken sequence."""
    if not out.chains:
        raise ValueError("the capture produced no chain that is safe to train on")
    output = project_chain_to_output_items(out.chains[0])
    generated = [item for item in output if item.get("generation_token_ids")]
    if not generated:
        raise ValueError("the capture produced no generated tokens")
    return {
        "id": f"proj-{rollout_id}",
        "model": model,
        "object": "response",
        "output": output,
        "usage": {
            "input_tokens": len(generated[0]["prompt_token_ids"]),
            "output_tokens": sum(len(item["generation_token_ids"]) for item in generated),
        },
    }


def assert_prefix_contiguity(response: dict[str, Any]) -> None:
    """Every token-carrying item's prompt extends everything before it (prompt and generations)."""
    carriers = [
        item for item in response.get("output", []) if isinstance(item, dict) and "generation_token_ids" in item
    ]
    so_far: list[int] = []
    for position, item in enumerate(carriers):
        prompt = list(item.get("prompt_token_ids") or [])
        if len(prompt) < len(so_far) or prompt[: len(so_far)] != so_far:
            raise AssertionError(f"token-carrying item {position} does not extend the tokens before it")
        so_far = prompt + list(item["generation_token_ids"] or [])
