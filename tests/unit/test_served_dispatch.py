"""The base model server's dispatch serves the answer in the form its client asked for, and hands exactly that form
to ``_finalize_served_response``; external-staging capture commits (or poisons) a call before any byte of it is sent.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

import pytest
from fastapi.testclient import TestClient
from omegaconf import OmegaConf

from nemo_gym.anthropic_messages import message_events, message_from_response
from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel, _CaptureMiddleware
from nemo_gym.config.server_models import BaseServerConfig
from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import ServerClient
from nemo_gym.streaming import chat_completion_chunks, failed_response_events
from nemo_gym.token_id_capture.fingerprint import assistant_fingerprint
from nemo_gym.token_id_capture.lineage import InMemoryLineageStore
from nemo_gym.token_id_capture.records import UNCOMMITTED_CALL_REASON
from nemo_gym.token_id_capture.staging.digest import compute_chain_hash

_SERVER = {"host": "127.0.0.1", "port": 1, "entrypoint": "app.py"}
_WEATHER = {"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {}}}


def _answer(body: NeMoGymResponseCreateParamsNonStreaming) -> dict[str, Any]:
    """A Response with reasoning, a refusal part and, when the request offers a tool, a call to it."""
    output: list[dict[str, Any]] = [
        {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking it over"}]},
        {
            "id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "refusal", "refusal": "I will not."}],
        },
    ]  # fmt: skip
    if body.tools:
        output.append(
            {"id": "fc_1", "type": "function_call", "call_id": "c1", "name": body.tools[0].name, "arguments": "{}"}
        )
    return {
        "id": "resp_7",
        "object": "response",
        "created_at": 1,
        "model": "m",
        "status": "completed",
        "output": output,
    }


class _Model(SimpleResponsesAPIModel):
    served: list[Any] = []
    fail: bool = False

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming) -> dict[str, Any]:
        if self.fail:
            raise RuntimeError("the engine went away")
        return _answer(body)

    async def _finalize_served_response(self, response: Any) -> None:
        self.served.append(response)


def _client() -> tuple[_Model, TestClient]:
    head = ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=OmegaConf.create({})
    )
    model = _Model(config=BaseResponsesAPIModelConfig(name="policy", **_SERVER), server_client=head)
    return model, TestClient(model.setup_webserver())


def _data_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_a_json_answer_and_a_message_are_each_finalized_once_in_the_form_served() -> None:
    model, client = _client()
    plain = client.post("/v1/responses", json={"input": "hi"})
    assert plain.status_code == 200 and model.served == [plain.json()]
    message = client.post(
        "/v1/messages", json={"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert message.status_code == 200 and model.served[-1] == message.json()
    assert message.json()["id"] == "resp_7"  # the Response's own id, so capture and client name the call alike
    assert [block["type"] for block in message.json()["content"]] == ["thinking", "text"]
    assert "x-nemo-gym-served-as-messages" not in message.headers


def test_a_streamed_response_restores_namespaced_tools_and_a_failure_is_its_closing_event() -> None:
    model, client = _client()
    namespaced = {"type": "namespace", "name": "functions", "tools": [_WEATHER]}
    streamed = client.post("/v1/responses", json={"input": "hi", "stream": True, "tools": [namespaced]})
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    closing = _data_lines(streamed.text)[-1]
    call = closing["response"]["output"][-1]
    assert closing["type"] == "response.completed" and (call["namespace"], call["name"]) == ("functions", "weather")

    model.fail = True
    failed = client.post("/v1/responses", json={"input": "hi", "stream": True})
    assert failed.status_code == 200
    events = _data_lines(failed.text)
    assert [event["type"] for event in events] == ["response.created", "response.failed"]
    assert events[-1]["response"]["error"]["message"] == "the engine went away"
    invalid = client.post("/v1/responses", json={"input": "hi", "stream": True, "temperature": "hot"})
    assert invalid.status_code == 422  # a bad request still fails before the stream starts


def test_chat_refusals_stream_and_messages_keep_refusals_and_reasoning() -> None:
    completion = {"id": "c", "choices": [{"message": {"content": None, "refusal": "No."}, "finish_reason": "stop"}]}
    deltas = [chunk["choices"][0]["delta"] for chunk in chat_completion_chunks(completion)]
    assert {"refusal": "No."} in deltas
    message = message_from_response(_answer(NeMoGymResponseCreateParamsNonStreaming(input="hi")))
    assert message["content"][1] == {"type": "text", "text": "I will not."}
    thinking = [event["delta"] for event in message_events(message) if event["type"] == "content_block_delta"][0]
    assert thinking == {"type": "thinking_delta", "thinking": "thinking it over"}
    kinds = [event["type"] for event in failed_response_events("boom")]
    assert kinds == ["response.created", "response.failed"]


def test_replayed_thinking_blocks_do_not_change_an_assistant_fingerprint() -> None:
    text = {"type": "text", "text": "answer"}
    with_thinking = [{"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": ""}, text]}]
    assert assistant_fingerprint(with_thinking) == assistant_fingerprint([{"role": "assistant", "content": [text]}])


def test_the_lineage_index_is_reachable_bounded_and_droppable() -> None:
    store = InMemoryLineageStore(max_rollouts=2)
    store.index.for_rollout("a").record("p", [{"role": "assistant", "content": "x"}], [1], "d")
    store.index.for_rollout("b")
    store.index.for_rollout("c")
    assert len(store.index) == 2 and not store.index.for_rollout("a").by_call_id  # "a" was the least recently used
    store.index.drop("c")
    assert len(store.index) == 1  # the fresh "a" (which pushed "b" out)
    store.index.clear()
    assert len(store.index) == 0


def test_the_staging_chain_hash_has_nemo_gym_07s_v2_layout() -> None:
    ids = struct.pack(">Q", 2) + struct.pack(">Q", 5) + struct.pack(">Q", 6)
    root = hashlib.sha256(b"nemo-gym-staging-chain-v1" + b"\x00" + ids).hexdigest()
    assert compute_chain_hash(None, [5, 6]) == root
    child = hashlib.sha256(b"nemo-gym-staging-chain-v1" + b"\x01" + bytes.fromhex(root) + ids).hexdigest()
    assert compute_chain_hash(root, [5, 6]) == child


async def test_an_admitted_call_whose_handler_raises_is_poisoned_before_the_error_leaves() -> None:
    async def broken(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        raise ValueError("conversion failed after staging")

    ledger = InMemoryLineageStore()
    app = _CaptureMiddleware(
        broken,
        store=None,
        model_server_name="m",
        lineage_store=ledger,
        external_staging=True,
        token_capture_enabled=True,
    )
    path = "/ng-rollout/r1/training-token-capture/v1/responses"
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "headers": []}
    body = json.dumps({"input": [{"role": "user", "content": "hi"}]}).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        raise AssertionError("nothing is sent by a handler that raised")

    with pytest.raises(ValueError, match="conversion failed"):
        await app(scope, receive, send)
    manifest = await ledger.manifest("r1")
    assert manifest["records"] == [] and [row["reason"] for row in manifest["failures"]] == [UNCOMMITTED_CALL_REASON]
