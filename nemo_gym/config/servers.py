"""Finding server instances in a composed config and checking the references between them."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from nemo_gym.config.keys import RESERVED_TOP_LEVEL_KEYS as RESERVED_TOP_LEVEL_KEYS  # re-exported
from nemo_gym.config.server_models import (
    AGENT_SERVER_REF_FIELD,
    SERVER_TYPES,
    AgentServerRef,
    ServerInstanceConfig,
    environment_server_agent_names,
    is_almost_server,
    is_server_ref,
    maybe_get_server_instance_config,
)
from nemo_gym.errors import AlmostServerError, ServerRefNotFoundError, UnsupportedPairingError


@dataclass
class AlmostServer:
    name: str
    errors: list[str]


def find_server_instances(config: dict[str, Any]) -> tuple[list[ServerInstanceConfig], list[AlmostServer]]:
    """Valid server instances, and blocks that look like servers but fail validation."""
    instances: list[ServerInstanceConfig] = []
    almost: list[AlmostServer] = []
    for name, value in config.items():
        if name in RESERVED_TOP_LEVEL_KEYS or not isinstance(value, dict):
            continue
        instance, error = maybe_get_server_instance_config(name, value)
        if instance is not None:
            instances.append(instance)
        elif error is not None and is_almost_server(value):
            almost.append(AlmostServer(name, summarize_validation_error(error, name)))
    return instances, almost


def summarize_validation_error(error: ValidationError, prefix: str = "") -> list[str]:
    """One readable line per problem, each starting with its key path below ``prefix`` (the instance name); a
    problem of the whole block is named by ``prefix`` alone. Literal-choice errors merge into 'must be one of: …'."""
    lines: dict[str, list[str]] = {}
    for item in error.errors():
        location = ".".join(
            [*([prefix] if prefix else []), *(str(p) for p in item["loc"] if p != "server_type_config_dict")]
        )
        if item["type"] == "literal_error":
            expected = item.get("ctx", {}).get("expected", "")
            lines.setdefault(location, []).append(expected)
        else:
            message = item["msg"].removeprefix("Value error, ")
            lines.setdefault(location, []).append(message)
    result = []
    for location, messages in lines.items():
        if len(messages) > 1 and all("'" in m for m in messages):
            result.append(f"{location}: must be one of: {', '.join(messages)}")
        elif messages and messages[0].startswith("'") and len(messages) == 1:
            result.append(f"{location}: must be {messages[0]}")
        else:
            result.append(f"{location}: {'; '.join(messages)}")
    return result


def raise_for_almost_servers(almost: list[AlmostServer]) -> None:
    described = "; ".join(
        f"{server.name!r} looks like a server but is invalid: " + "; ".join(server.errors) for server in almost
    )
    raise AlmostServerError(f"{described}. Fix it, or pass ++error_on_almost_servers=false to skip such blocks")


def check_server_refs(instances: list[ServerInstanceConfig]) -> None:
    """Every ``{type, name}`` ref in an implementation block must name an instance of that type."""
    names_by_type: dict[str, list[str]] = {t: [] for t in SERVER_TYPES}
    for instance in instances:
        names_by_type[instance.SERVER_TYPE].append(instance.name)
    problems = []
    for instance in instances:
        inner = instance.get_inner_run_server_config_dict()
        for field_name, value in inner.items():
            ref = is_server_ref(value)
            if ref is None and instance.SERVER_TYPE == "environment_servers" and field_name == AGENT_SERVER_REF_FIELD:
                # an environment server may leave its agent_server's type out (NeMo Gym 0.7): it is an agent
                names = environment_server_agent_names({field_name: value})
                ref = AgentServerRef(type="responses_api_agents", name=names[0]) if names else None
            if ref is None or ref.name in names_by_type[ref.type]:
                continue
            candidates = names_by_type[ref.type]
            close = difflib.get_close_matches(ref.name, candidates, n=3, cutoff=0.6)
            if close:
                hint = f"Did you mean: {', '.join(close)}?"
            elif candidates:
                hint = f"Defined {ref.type}: {', '.join(sorted(candidates))}."
            else:
                hint = f"No {ref.type} instance is defined; add one with --config or a selector."
            location = f"{instance.name}.{instance.SERVER_TYPE}.{instance.implementation}.{field_name!s}"
            problems.append(f"{location} refers to {ref.type} {ref.name!r}, which is not defined. {hint}")
    if problems:
        raise ServerRefNotFoundError("; ".join(problems))


ALLOW_UNSUPPORTED_PAIRING_ENV_VAR = "NEMO_GYM_ALLOW_UNSUPPORTED_PAIRING"


def check_pairings(instances: list[ServerInstanceConfig], allow_unsupported: bool = False) -> None:
    """An agent bound to a resources server that declares ``allowed_agents`` must be of one of those types, and its
    policy model of one of the ``allowed_model_types``: the environment's author knows which harnesses score it
    correctly (NeMo Gym 0.7). ``allow_unsupported_pairing`` (or the environment variable) lifts the check."""
    if allow_unsupported or os.environ.get(ALLOW_UNSUPPORTED_PAIRING_ENV_VAR, "").lower() in {"1", "true", "yes"}:
        return
    by_name = {instance.name: instance for instance in instances}
    problems = []
    for agent in instances:
        if agent.SERVER_TYPE != "responses_api_agents":
            continue
        inner = agent.get_inner_run_server_config_dict()
        resources = by_name.get(_ref_name(inner.get("resources_server")) or "")
        if resources is None or resources.SERVER_TYPE != "resources_servers":
            continue
        declared = resources.get_inner_run_server_config_dict()
        allowed_agents = _names(declared.get("allowed_agents"))
        if allowed_agents is not None and agent.implementation not in allowed_agents:
            problems.append(f"{agent.name} runs {agent.implementation}, but {resources.name} accepts only "
                            f"{', '.join(allowed_agents)}")  # fmt: skip
        model = by_name.get(_ref_name(inner.get("model_server")) or "")
        allowed_models = _names(declared.get("allowed_model_types"))
        if model is not None and allowed_models is not None and model.implementation not in allowed_models:
            problems.append(f"{agent.name}'s policy is {model.implementation}, but {resources.name} accepts only "
                            f"{', '.join(allowed_models)}")  # fmt: skip
    if problems:
        raise UnsupportedPairingError(
            "; ".join(problems) + ". Use an accepted agent or model, or pass ++allow_unsupported_pairing=true "
            f"(or set {ALLOW_UNSUPPORTED_PAIRING_ENV_VAR}=1) to run it anyway"
        )


def _ref_name(value: Any) -> str | None:
    ref = is_server_ref(value)
    return ref.name if ref is not None else None


def _names(value: Any) -> list[str] | None:
    if not value:
        return None
    return [value] if isinstance(value, str) else [str(name) for name in value]
