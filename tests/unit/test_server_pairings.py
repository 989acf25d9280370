"""NeMo Gym 0.7's allowed_agents / allowed_model_types: a resources server names the harnesses that score it."""

from __future__ import annotations

import pytest

from nemo_gym.errors import UnsupportedPairingError
from nemo_gym.global_config import parse_global_config_dict as parse
from tests.helpers import write

CONFIG = """
weather:
  resources_servers:
    example_single_tool_call:
      entrypoint: app.py
      domain: agent
      {declared}
weather_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {{type: resources_servers, name: weather}}
      model_server: {{type: responses_api_models, name: policy_model}}
policy_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_base_url: http://127.0.0.1:1/v1
      openai_api_key: x
      openai_model: m
"""


def _compose(workdir, declared: str, *extra: str):
    path = write(workdir / "c.yaml", CONFIG.format(declared=declared))
    return parse([f"+config_paths=[{path}]", *extra])


def test_an_agent_of_an_accepted_type_or_no_declaration_composes(workdir) -> None:
    _compose(workdir, "allowed_agents: [simple_agent, gymnasium_agent]")
    _compose(workdir, "")


def test_an_agent_of_another_type_is_refused_naming_both_and_the_way_out(workdir) -> None:
    with pytest.raises(UnsupportedPairingError) as error:
        _compose(workdir, "allowed_agents: [gymnasium_agent]")
    message = str(error.value)
    assert "weather_simple_agent runs simple_agent, but weather accepts only gymnasium_agent" in message
    assert "++allow_unsupported_pairing=true" in message


def test_a_model_type_left_out_is_refused(workdir) -> None:
    with pytest.raises(UnsupportedPairingError, match="policy is openai_model, but weather accepts only vllm_model"):
        _compose(workdir, "allowed_model_types: [vllm_model]")


def test_the_check_can_be_lifted(workdir, monkeypatch: pytest.MonkeyPatch) -> None:
    _compose(workdir, "allowed_agents: [gymnasium_agent]", "++allow_unsupported_pairing=true")
    monkeypatch.setenv("NEMO_GYM_ALLOW_UNSUPPORTED_PAIRING", "1")
    _compose(workdir, "allowed_agents: [gymnasium_agent]")
