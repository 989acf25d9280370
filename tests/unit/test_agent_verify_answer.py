"""An agent's ``verify_rollout`` hands on the verifier's JSON as it came, with the answers of parsing and re-dumping it.

The general path parsed the ``/verify`` answer and dumped it again; the fast path checks it parses and sends the same
bytes on. Both give the same JSON value, and a body that is not JSON or a failing status still fails the rollout.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from omegaconf import OmegaConf

from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.config_types import BaseServerConfig
from nemo_gym.server_utils import ServerClient, json_response
from nemo_gym.transport.lean_client import LeanResponse
from nemo_gym.transport.types import ServerRequestError

pytestmark = pytest.mark.timeout(60)

ROW: dict[str, Any] = {"responses_create_params": {"input": "hi"}, "expected": "é"}
FINAL: dict[str, Any] = {"id": "r", "output": [], "usage": None}


class _Client(ServerClient):
    """Answers every call with one canned response, and records what was sent."""

    def __init__(self, status: int, body: bytes) -> None:
        config = OmegaConf.create({"env": {"resources_servers": {"env": {"host": "127.0.0.1", "port": 1}}}})
        super().__init__(head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=config)
        self._answer = (status, body)
        self._sent: list[Any] = []

    async def request(self, method: str, server_name: str, url_path: str, **kwargs: Any) -> Any:
        self._sent.append(kwargs.get("json"))
        status, body = self._answer
        loop = asyncio.get_running_loop()
        return LeanResponse(method, f"http://127.0.0.1:1{url_path}", status, "", (), body, None, (), loop)


def _agent(client: _Client) -> SimpleResponsesAPIAgent:
    config = BaseResponsesAPIAgentConfig(host="127.0.0.1", port=2, entrypoint="app.py", name="agent")
    return SimpleResponsesAPIAgent(config=config, server_client=client)


def _verify(status: int, body: bytes) -> Any:
    client = _Client(status, body)
    answer = asyncio.run(_agent(client).verify_rollout("env", ROW, FINAL, {}))
    assert client._sent == [ROW | {"response": FINAL}]
    return answer


@pytest.mark.parametrize(
    "value",
    [
        ROW | {"response": FINAL, "reward": 1.0},
        {"reward": 0.5, "nested": {"a": [1, 2.5, None, True, "ü ✓"]}, "big": 2**62},
        [1, 2],
        None,
    ],
)
def test_the_verifiers_answer_is_passed_on_as_the_json_value_it_is(value: Any) -> None:
    sent = b'  {"pretty":  true}\n' if value is None else orjson.dumps(value, option=orjson.OPT_INDENT_2)
    value = {"pretty": True} if value is None else value
    answer = _verify(200, sent)
    assert answer.status_code == 200
    assert answer.media_type == "application/json"
    assert answer.body == sent
    general = json_response(orjson.loads(sent))  # what the agent answered by parsing and re-dumping
    assert orjson.loads(answer.body) == orjson.loads(general.body) == value
    assert answer.headers["content-type"] == general.headers["content-type"]


@pytest.mark.parametrize("body", [b"", b"not json", b'{"reward": 1.0', b'{"x": NaN}'])
def test_an_answer_that_is_not_json_still_fails_the_rollout(body: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        _verify(200, body)


def test_a_failing_verifier_still_fails_the_rollout_naming_it() -> None:
    with pytest.raises(ServerRequestError, match=r"/verify.*HTTP 500.*boom"):
        _verify(500, b'{"detail": "boom"}')
