"""``/verify`` answers of several environments' shapes are byte for byte FastAPI's own on our routes.

Our servers serve a typed route with ``BodyRoute`` (one ``model_validate_json``, the answer validated and dumped by
the response field's pydantic-core calls, see ``nemo_gym/transport/routes.py``). Here the same verifiers, written as
NeMo Gym environments write them (``XVerifyResponse(**body.model_dump(), reward=...)``, subclasses with task and
result fields, several rewards, a judge that cannot be asked), are served by FastAPI's own ``APIRoute`` and by ours,
and every answer is compared on the Responses models' real trajectories: tool calls, reasoning, training items with
token ids, hosted-tool items, string input.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from nemo_gym.base_resources_server import BaseMultiRewardVerifyResponse, BaseVerifyRequest, BaseVerifyResponse
from nemo_gym.judge import JudgeError, judge_failsafe
from nemo_gym.transport.routes import BodyRoute
from tests.helpers import app_with_routes

pytestmark = pytest.mark.timeout(60)


class MathVerifyRequest(BaseVerifyRequest):
    expected_answer: str


class MathVerifyResponse(MathVerifyRequest, BaseVerifyResponse):
    extracted_answer: str | None
    library_reward: float | None = None
    judge_evaluations: list[dict[str, Any]] | None = None


class ToolMultiRewardResponse(BaseMultiRewardVerifyResponse):
    num_tool_calls: int


def _last_text(body: BaseVerifyRequest) -> str:
    for item in reversed(body.response.output):
        if getattr(item, "type", None) == "message" and isinstance(getattr(item, "content", None), list):
            return "".join(getattr(part, "text", "") for part in item.content)
    return ""


def _app(general: bool) -> FastAPI:
    app = app_with_routes(APIRoute if general else BodyRoute)

    async def single(body: BaseVerifyRequest) -> BaseVerifyResponse:
        called = any(getattr(item, "type", None) == "function_call" for item in body.response.output)
        return BaseVerifyResponse(**body.model_dump(), reward=1.0 if called else 0.0)

    async def math(body: MathVerifyRequest) -> MathVerifyResponse:
        if body.expected_answer == "judge down":
            raise JudgeError("judge unreachable", server="judge", url_path="/v1/responses", status=503)
        text = _last_text(body)
        return MathVerifyResponse(
            **body.model_dump(),
            reward=float(body.expected_answer in text),
            extracted_answer=text or None,
            judge_evaluations=[{"verdict": "A=B", "score": 1.5}],
        )

    async def multi(body: BaseVerifyRequest) -> ToolMultiRewardResponse:
        calls = sum(getattr(item, "type", None) == "function_call" for item in body.response.output)
        return ToolMultiRewardResponse(
            **body.model_dump(), reward=0.5, reward_components={"format": 1.0, "tools": 0.0}, num_tool_calls=calls
        )

    async def declared_base(body: MathVerifyRequest) -> BaseVerifyResponse:
        # Declared as the base class, answers a subclass: FastAPI dumps the declared fields only.
        return MathVerifyResponse(**body.model_dump(), reward=1.0, extracted_answer="x")

    async def as_dict(body: BaseVerifyRequest) -> BaseVerifyResponse:
        return body.model_dump() | {"reward": 0.25}  # type: ignore[return-value]

    for path, verify in [
        ("/single", single),
        ("/math", math),
        ("/multi", multi),
        ("/declared_base", declared_base),
        ("/as_dict", as_dict),
    ]:
        app.post(path)(judge_failsafe(verify))
    return app


TOKENS = {"prompt_token_ids": [1, 2], "generation_token_ids": [3, 4], "generation_log_probs": [-0.25, -1.5]}
CALL = {"id": "fc_0", "call_id": "call_0", "status": "completed", "type": "function_call", "name": "get_weather"}
MESSAGE = {"id": "msg_1", "role": "assistant", "status": "completed", "type": "message"}
TEXT = {"annotations": [], "logprobs": [], "type": "output_text", "text": "The answer is 42. é \u2028"}
TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Weather.", "strict": True}
    | {"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
]


def _row(output: list[dict[str, Any]], params: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    params = params or {"input": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": TOOLS}
    response = {"id": "resp_1", "object": "response", "created_at": 1700000000, "model": "m", "status": "completed"}
    response |= {"output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": TOOLS}
    response |= {"temperature": None, "top_p": None}
    response["usage"] = {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 50,
        "output_tokens_details": {"reasoning_tokens": 7},
        "total_tokens": 150,
    }
    return {"responses_create_params": params, "response": response, "expected_answer": "42"} | extra


ROWS: dict[str, dict[str, Any]] = {
    "tool call then answer": _row(
        [
            CALL | {"arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_0", "output": '{"weather": "cold"}'},
            MESSAGE | {"content": [TEXT]},
        ]
    ),
    "reasoning and training items": _row(
        [
            {"id": "rs_0", "type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
            CALL | {"arguments": "{}"} | TOKENS,
            MESSAGE | {"content": [TEXT]} | TOKENS,
        ]
    ),
    "string input, sampling params, no output": _row(
        [], {"input": "Say 42.", "temperature": 0.5, "max_output_tokens": 64, "metadata": {"k": "v"}}
    ),
    "hosted tool item and refusal": _row(
        [
            {
                "type": "web_search_call",
                "id": "ws_0",
                "status": "completed",
                "action": {"type": "search", "query": "q"},
            },
            MESSAGE | {"content": [{"type": "refusal", "refusal": "no"}]},
        ]
    ),
    "extra task fields": _row([MESSAGE | {"content": [TEXT]}], task_id=7, _ng_task_index=3, meta={"a": [1, None]}),
    "judge cannot be asked": _row([MESSAGE | {"content": [TEXT]}], expected_answer="judge down"),
}


@pytest.fixture(scope="module")
def clients() -> Any:
    with (
        TestClient(_app(general=True), raise_server_exceptions=False) as general,
        TestClient(_app(general=False), raise_server_exceptions=False) as ours,
    ):
        yield general, ours


@pytest.mark.parametrize("path", ["/single", "/math", "/multi", "/declared_base", "/as_dict"])
@pytest.mark.parametrize("case", list(ROWS))
def test_a_verify_answer_is_fastapis_own(clients: Any, path: str, case: str) -> None:
    body = orjson.dumps(ROWS[case])
    headers = {"content-type": "application/json"}
    general, ours = (client.post(path, content=body, headers=headers) for client in clients)
    assert (ours.status_code, ours.content) == (general.status_code, general.content), case
    assert sorted(ours.headers.items()) == sorted(general.headers.items()), case
    assert ours.status_code == 200, ours.text


def test_the_rows_are_scored_as_written(clients: Any) -> None:
    _, ours = clients
    answer = ours.post("/math", json=ROWS["tool call then answer"]).json()
    assert (answer["reward"], answer["extracted_answer"]) == (1.0, TEXT["text"])
    assert answer["response"]["output"][0]["arguments"] == '{"city": "Paris"}'
    failed = ours.post("/math", json=ROWS["judge cannot be asked"]).json()
    assert (failed["reward"], failed["_ng_failure_class"]) == (0.0, "judge_failed")
    multi = ours.post("/multi", json=ROWS["reasoning and training items"]).json()
    assert multi["reward_components"] == {"format": 1.0, "tools": 0.0} and multi["num_tool_calls"] == 1
    assert multi["response"]["output"][1]["generation_log_probs"] == [-0.25, -1.5]
