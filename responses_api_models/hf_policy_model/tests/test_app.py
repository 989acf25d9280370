"""The server's routes around a stand-in policy (the real weights are exercised in tests/training/)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from nemo_gym.training.policy_server import HFPolicyModel, HFPolicyModelConfig


class StandInPolicy:
    name = "stand-in"

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def chat(self, messages: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
        self.calls.append({"messages": messages, **options})
        message = {
            "role": "assistant", "content": "It is cold.", "tool_calls": [],
            "prompt_token_ids": [1, 2], "generation_token_ids": [3, 4], "generation_log_probs": [-0.5, -0.25],
        }  # fmt: skip
        return {
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": self.name,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
        }  # fmt: skip


def _client(policy: StandInPolicy) -> TestClient:
    config = HFPolicyModelConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="policy_model")
    return TestClient(HFPolicyModel.around(policy, config).setup_webserver())  # type: ignore[arg-type]


def test_responses_carry_token_ids_and_log_probs() -> None:
    policy = StandInPolicy()
    body = {"input": [{"role": "user", "content": "Weather in Paris?"}], "max_output_tokens": 16, "temperature": 0.5}
    answer = _client(policy).post("/v1/responses", json=body).json()
    item = answer["output"][-1]
    assert item["generation_token_ids"] == [3, 4] and item["prompt_token_ids"] == [1, 2]
    assert item["generation_log_probs"] == [-0.5, -0.25]
    assert policy.calls[0]["max_tokens"] == 16 and policy.calls[0]["temperature"] == 0.5


def test_chat_completions_and_models() -> None:
    client = _client(StandInPolicy())
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"] == "It is cold."
    assert client.get("/v1/models").json()["data"][0]["id"] == "stand-in"
