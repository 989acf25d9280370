"""The package's layering holds: imports only point down (or sideways), and no two parts import each other.

Each top-level module or folder of ``nemo_gym`` has a layer below, numbered as in docs/architecture.md's "Layers". Every import, including one inside a function,
must go to the same or a lower layer, and the graph of imports between parts must have no cycle. A new module gets
a row here, which is where its place in docs/architecture.md's "Layers" is decided.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "nemo_gym"

LAYERS: dict[str, int] = {
    # 1: the error tree
    "errors": 1,
    "failure_kinds": 1,
    # 2: wire format and helpers that know nothing of servers
    "__init__": 2,
    "checkout": 2,
    "roots": 2,
    "openai_base": 2,
    "openai_chat_utils": 2,
    "openai_responses": 2,
    "openai_response_items": 2,
    "openai_response_params": 2,
    "openai_usage": 2,
    "responses_converter": 2,
    "chat_to_responses": 2,
    "streaming": 2,
    "chat_protocol": 2,
    "embedded_model": 2,
    "anthropic_messages": 2,
    "anthropic_policy": 2,
    "anthropic_converter": 2,
    "streaming_dialects": 2,
    "responses_streaming": 2,
    "chat_streaming": 2,
    "openai_hosted": 2,
    "jsonl": 2,
    "session_store": 2,
    "metrics": 2,
    "row_fields": 2,
    "episode_types": 2,
    "tool_access": 2,
    "task_materialization": 2,
    "reward_profile": 2,
    "run_comparison": 2,
    "profiling": 2,
    "sandbox/": 2,
    "task_data": 2,
    "verifier_fixture": 2,
    "deliverables": 2,
    "verifiers/": 2,
    # 3: transport, and the face that offers the wire models with the OpenAI-compatible client
    "transport/": 3,
    "telemetry/": 3,
    "openai_utils": 3,
    # 4: config
    "config/": 4,
    "global_config": 4,
    # 5: the server kit
    "server_utils": 5,
    "base_resources_server": 5,
    "base_responses_api_model": 5,
    "served_answers": 5,
    "base_responses_api_agent": 5,
    "base_gymnasium_server": 5,
    "base_environment_server": 5,
    "resources_sessions": 5,
    "agent_sessions": 5,
    "single_agent_turn_types": 5,
    "judge": 5,
    "mcp_exposure": 5,
    "observability/": 5,
    "token_id_capture/": 5,
    "rollout_correlation": 5,
    "rollout_observability": 5,
    # a module held apart from its folder: the sandboxed agents' helpers call the run's servers
    "sandbox/agent_tools": 5,
    # 6: orchestration and data, and the faces that re-export from them
    "datasets/": 6,
    "rollouts/": 6,
    "launcher/": 6,
    "authoring/": 6,
    "environment/": 6,
    "training/": 6,
    "assets": 6,
    "benchmarks": 6,
    "testing/": 6,
    "health/": 6,
    "atif/": 6,
    "rollout_health": 6,
    "prompt": 6,
    "path_utils": 6,
    "registry": 6,
    "config_types": 6,
    "rollout_collection": 6,
    "skills": 6,
    "mcp_auto_exposure": 6,
    "viewer/": 6,
    "loadtest/": 6,
    # 7: the command line
    "cli/": 7,
}


def _part(module: str) -> str | None:
    """``nemo_gym.rollouts.run`` → ``rollouts/``; ``nemo_gym.jsonl`` → ``jsonl``; outside the package → None.

    A module that LAYERS names as ``folder/module`` is its own part (``nemo_gym.sandbox.agent_tools``)."""
    parts = module.split(".")
    if parts[0] != "nemo_gym":
        return None
    if len(parts) == 1:
        return "__init__"
    if len(parts) > 2 and f"{parts[1]}/{parts[2]}" in LAYERS:  # a module with a layer of its own inside a folder
        return f"{parts[1]}/{parts[2]}"
    if (PACKAGE / parts[1]).is_dir():
        return parts[1] + "/"
    if (PACKAGE / f"{parts[1]}.py").is_file():
        return parts[1]
    return None


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    module = _module_name(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")
                package = base if path.name == "__init__.py" else base[:-1]
                package = package[: len(package) - node.level + 1]
                found.add(".".join(package + ([node.module] if node.module else [])))
            elif node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _part(_module_name(path))
        assert source is not None
        edges[source]
        for imported in _imports(path):
            target = _part(imported)
            if target is not None and target != source:
                edges[source].add(target)
    return edges


def test_every_part_has_a_layer():
    missing = sorted(part for part in _graph() if part not in LAYERS)
    assert not missing, f"give these parts of nemo_gym a layer in {__file__}: {missing}"
    stale = sorted(part for part in LAYERS if part not in _graph())
    assert not stale, f"these layers name parts that no longer exist: {stale}"


def test_imports_never_point_up():
    upward = [
        f"{source} (layer {LAYERS[source]}) imports {target} (layer {LAYERS[target]})"
        for source, targets in sorted(_graph().items())
        for target in sorted(targets)
        if source in LAYERS and target in LAYERS and LAYERS[target] > LAYERS[source]
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycles_between_parts():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycles.append(path[path.index(target) :] + [target] if target in path else [node, target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """The graph must count an import inside a function and a relative import, or it could miss an upward edge."""
    source = PACKAGE / "datasets" / "storage" / "__init__.py"
    imported = _imports(source)
    assert "nemo_gym.datasets.storage.local" in imported  # imported lazily inside get_registry
    sample = PACKAGE / "rollouts" / "__init__.py"
    assert _part(_module_name(sample)) == "rollouts/"
