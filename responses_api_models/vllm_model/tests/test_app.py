"""vllm_model against a real (scripted) Chat Completions engine on loopback: in-process through the ASGI app, and over
HTTP through the official ``openai`` client."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import httpx
import openai
import pytest
from omegaconf import OmegaConf

from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.server_utils import ServerClient
from nemo_gym.testing import FakeUpstream, Reply, serve_in_thread
from nemo_gym.transport.http_client import close_session
from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

pytestmark = pytest.mark.timeout(60)

CHAT = "/v1/chat/completions"
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CHAT_WEATHER_TOOL = {"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}


def chat_reply(
    content: str | None = "Hello.", finish_reason: str = "stop", tool_calls: list[dict] | None = None, **message: Any
) -> dict[str, Any]:
    """A Chat completion as vLLM sends it (including its null extras)."""
    return {
        "id": "chatcmpl-up",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "engine-model",
        "choices": [
            {
                "index": 0,
                "finish_reason": finish_reason,
                "logprobs": None,
                "stop_reason": None,
                "message": {"role": "assistant", "content": content, "tool_calls": tool_calls or [], **message},
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "prompt_tokens_details": None},
        "prompt_logprobs": None,
    }


def replying(chat: dict[str, Any] | Callable[[Any], dict[str, Any]]) -> Callable[[str, Any], Reply]:
    def responder(path: str, body: Any) -> Reply:
        if path != CHAT:
            return 404, {"error": f"no route {path}"}
        return 200, chat(body) if callable(chat) else chat

    return responder


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    fake = FakeUpstream(replying(chat_reply())).start()
    yield fake
    fake.stop()


def make_server(base_url: str | list[str], **config: Any) -> VLLMModel:
    settings = {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py", "name": "policy_model"}
    settings |= {"base_url": base_url, "api_key": "engine-key", "model": "policy"} | config
    return VLLMModel(config=VLLMModelConfig(**settings), server_client=MagicMock(spec=ServerClient))


@pytest.fixture
async def connect() -> AsyncIterator[Callable[..., httpx.AsyncClient]]:
    """httpx clients bound to a model server's ASGI app (each client has its own cookie jar, i.e. its own session)."""
    clients: list[httpx.AsyncClient] = []

    def factory(server: VLLMModel, cookies: dict[str, str] | None = None) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=server.setup_webserver(), raise_app_exceptions=False)
        client = httpx.AsyncClient(transport=transport, base_url="http://model", cookies=cookies, timeout=30)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        await client.aclose()
    await close_session()


async def test_responses_forces_model_and_merges_extra_body_metadata_and_overrides(upstream, connect):
    server = make_server(
        upstream.url,
        extra_body={"top_k": 20, "seed": 1, "temperature": 0.9},
        chat_template_kwargs={"enable_thinking": True, "other": 1},
        sampling_overrides={"temperature": 1.0, "top_p": 1.0},
    )
    body = {
        "model": "caller-choice",
        "input": "hi",
        "temperature": 0.2,
        "max_output_tokens": 64,
        "metadata": {"extra_body": '{"seed": 7}', "chat_template_kwargs": '{"enable_thinking": false}'},
    }
    answer = await connect(server).post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.text
    response = NeMoGymResponse.model_validate(answer.json())
    assert response.status == "completed" and response.output_text == "Hello."
    assert response.metadata == body["metadata"]  # echoed back, as the Responses API does

    [sent] = upstream.bodies(CHAT)
    assert sent["model"] == "policy"
    assert sent["seed"] == 7 and sent["top_k"] == 20  # metadata.extra_body over config extra_body
    assert sent["chat_template_kwargs"] == {"enable_thinking": False, "other": 1}
    assert (sent["temperature"], sent["top_p"]) == (1.0, 1.0)  # sampling_overrides beat the request
    assert sent["max_tokens"] == 64
    assert sent["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert "metadata" not in sent and "logprobs" not in sent
    assert upstream.received[0].headers["Authorization"] == "Bearer engine-key"


async def test_request_fields_win_over_extra_body(upstream, connect):
    server = make_server(upstream.url, extra_body={"temperature": 0.9, "top_k": 5})
    await connect(server).post("/v1/responses", json={"input": "hi", "temperature": 0.3})
    [sent] = upstream.bodies(CHAT)
    assert (sent["temperature"], sent["top_k"]) == (0.3, 5)


async def test_the_hosted_only_strict_flag_never_reaches_the_engine(upstream, connect):
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}, "strict": True}
    answer = await connect(make_server(upstream.url)).post("/v1/responses", json={"input": "hi", "tools": [tool]})
    assert answer.status_code == 200, answer.text
    [sent] = upstream.bodies(CHAT)
    assert sent["tools"] == [{"type": "function", "function": {"name": "f", "parameters": tool["parameters"]}}]


async def test_bad_metadata_json_is_a_client_error(upstream, connect):
    answer = await connect(make_server(upstream.url)).post(
        "/v1/responses", json={"input": "hi", "metadata": {"extra_body": "{not json"}}
    )
    assert answer.status_code == 400 and "metadata.extra_body" in answer.text
    assert upstream.received == []


async def test_engine_reasoning_becomes_reasoning_item_and_tool_calls_function_calls(upstream, connect):
    upstream.responder = replying(chat_reply(None, "tool_calls", [TOOL_CALL], reasoning_content="Need weather."))
    answer = await connect(make_server(upstream.url)).post(
        "/v1/responses", json={"input": "Weather in Oslo?", "tools": [WEATHER_TOOL]}
    )
    response = NeMoGymResponse.model_validate(answer.json())
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    assert response.output[0].summary[0].text == "Need weather."
    call = response.output[1]
    assert (call.name, call.call_id, call.arguments) == ("get_weather", "call_1", '{"city": "Oslo"}')
    [sent] = upstream.bodies(CHAT)
    assert sent["tools"][0]["function"]["name"] == "get_weather" and sent["tool_choice"] == "auto"


async def test_inline_think_spans_and_newer_reasoning_field(upstream, connect):
    server = make_server(upstream.url)
    client = connect(server)
    upstream.responder = replying(chat_reply("<think>a</think>Answer <think>b</think>"))
    inline = NeMoGymResponse.model_validate((await client.post("/v1/responses", json={"input": "q"})).json())
    assert [part.text for part in inline.output[0].summary] == ["a", "b"]
    assert inline.output_text.strip() == "Answer"

    upstream.responder = replying(chat_reply("Answer", reasoning="r"))
    parsed = NeMoGymResponse.model_validate((await client.post("/v1/responses", json={"input": "q"})).json())
    assert [item.type for item in parsed.output] == ["reasoning", "message"]


async def test_parsed_reasoning_without_a_reasoning_parser_is_a_misconfiguration(upstream, connect):
    upstream.responder = replying(chat_reply("x", reasoning_content="r"))
    answer = await connect(make_server(upstream.url, uses_reasoning_parser=False)).post(
        "/v1/responses", json={"input": "q"}
    )
    assert answer.status_code == 500 and "uses_reasoning_parser" in answer.text


async def test_past_reasoning_goes_to_reasoning_content_and_developer_to_system(upstream, connect):
    server = make_server(upstream.url, replace_developer_role_with_system=True)
    history = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "call the tool"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "cold"},
    ]
    await connect(server).post("/v1/responses", json={"input": history, "tools": [WEATHER_TOOL]})
    [sent] = upstream.bodies(CHAT)
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assistant = sent["messages"][2]
    assert assistant["content"] is None and assistant["tool_calls"][0]["id"] == "call_1"
    assert assistant["reasoning_content"] == assistant["reasoning"] == "call the tool"
    assert sent["messages"][3] == {"role": "tool", "tool_call_id": "call_1", "content": "cold"}


def training_reply(body: Any, **choice_extra: Any) -> dict[str, Any]:
    reply = chat_reply("<think>hm</think>Done.")
    reply["choices"][0]["logprobs"] = {
        "content": [
            {"token": "token_id:11", "logprob": -0.5, "bytes": None, "top_logprobs": []},
            {"token": "token_id:12", "logprob": -0.25, "bytes": None, "top_logprobs": []},
        ]
    }
    reply["choices"][0].update(choice_extra)
    return reply


async def test_training_mode_returns_token_ids_on_the_last_item(upstream, connect):
    upstream.responder = replying(lambda body: training_reply(body, token_ids=[11, 12]) | {"prompt_token_ids": [1, 2]})
    server = make_server(upstream.url, return_token_id_information=True)
    answer = await connect(server).post("/v1/responses", json={"input": "q"})
    assert answer.status_code == 200, answer.text
    output = answer.json()["output"]
    assert [item["type"] for item in output] == ["reasoning", "message"]
    assert "prompt_token_ids" not in output[0]
    assert output[1]["prompt_token_ids"] == [1, 2]
    assert output[1]["generation_token_ids"] == [11, 12]
    assert output[1]["generation_log_probs"] == [-0.5, -0.25]
    [sent] = upstream.bodies(CHAT)
    assert sent["logprobs"] is True and sent["top_logprobs"] == 0
    assert sent["return_tokens_as_token_ids"] is True and sent["return_token_ids"] is True

    # The next turn replays that item: its tokens stay in this server and never bloat the engine request.
    await connect(server).post("/v1/responses", json={"input": [{"role": "user", "content": "q"}, *output]})
    replayed = upstream.bodies(CHAT)[1]["messages"][1]
    assert replayed["content"] == "Done." and replayed["reasoning_content"] == "hm"
    assert not set(replayed) & {"prompt_token_ids", "generation_token_ids", "generation_log_probs"}


async def test_training_mode_chat_route_tokenizes_the_prompt_when_the_engine_does_not_return_it(upstream, connect):
    def responder(path: str, body: Any) -> Reply:
        if path == "/tokenize":
            return 200, {"count": 3, "max_model_len": 4096, "tokens": [7, 8, 9]}
        return 200, training_reply(body, token_ids=[11, 12])

    upstream.responder = responder
    server = make_server(upstream.url, return_token_id_information=True, request_prompt_and_generation_token_ids=False)
    body = {"messages": [{"role": "user", "content": "q"}], "tools": [CHAT_WEATHER_TOOL]}
    answer = await connect(server).post(CHAT, json=body)
    assert answer.status_code == 200, answer.text
    message = answer.json()["choices"][0]["message"]
    assert (message["prompt_token_ids"], message["generation_token_ids"]) == ([7, 8, 9], [11, 12])
    assert answer.json()["choices"][0].get("logprobs") is None  # requested by the server, not by the caller
    assert "token_ids" not in answer.json()["choices"][0]
    [tokenize] = upstream.bodies("/tokenize")
    assert tokenize["add_generation_prompt"] is True and tokenize["model"] == "policy"
    assert tokenize["messages"] == [{"role": "user", "content": "q"}] and tokenize["tools"] == body["tools"]
    assert "return_token_ids" not in upstream.bodies(CHAT)[0]


async def test_training_mode_refuses_disagreeing_token_sources(upstream, connect):
    upstream.responder = replying(lambda body: training_reply(body, token_ids=[11, 99]) | {"prompt_token_ids": [1]})
    answer = await connect(make_server(upstream.url, return_token_id_information=True)).post(
        "/v1/responses", json={"input": "q"}
    )
    assert answer.status_code == 500 and "disagree" in answer.text


async def test_finish_reason_length_makes_the_response_incomplete(upstream, connect):
    upstream.responder = replying(chat_reply("cut off mid", "length"))
    response = (await connect(make_server(upstream.url)).post("/v1/responses", json={"input": "q"})).json()
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}


@pytest.mark.parametrize(
    "error",
    [
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.",
        "'max_tokens' or 'max_completion_tokens' is too large: 9000.",
        "the request exceeds the available context size, try increasing it",
    ],
)
async def test_context_length_400_ends_the_turn_instead_of_failing(upstream, connect, error):
    upstream.responder = lambda path, body: (400, {"object": "error", "message": error, "code": 400})
    answer = await connect(make_server(upstream.url)).post("/v1/responses", json={"input": "q"})
    assert answer.status_code == 200, answer.text
    response = NeMoGymResponse.model_validate(answer.json())
    assert response.status == "incomplete" and response.output_text == ""
    assert [item.type for item in response.output] == ["message"]


async def test_other_400s_and_500s_fail_with_502_naming_the_upstream(upstream, connect):
    client = connect(make_server(upstream.url))
    upstream.responder = lambda path, body: (400, {"message": "bad tool schema"})
    assert (await client.post("/v1/responses", json={"input": "q"})).status_code == 502
    upstream.responder = lambda path, body: (500, "engine exploded")
    answer = await client.post("/v1/responses", json={"input": "q"})
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert f"{upstream.url}/chat/completions" in error and "500" in error and "engine exploded" in error
    assert "engine-key" not in error


def _session_ids_for_each_replica(server: VLLMModel, count: int) -> list[str]:
    """Deterministic session ids (32 hex chars, as the session middleware issues) landing on each replica."""
    found: dict[str, str] = {}
    for n in range(1000):
        session_id = hashlib.md5(str(n).encode()).hexdigest()
        found.setdefault(server.base_url_for_session(session_id), session_id)
        if len(found) == count:
            return [found[url] for url in server._base_urls]
    raise AssertionError("no session id found for some replica")


async def test_base_url_is_sticky_per_session(connect):
    replicas = [FakeUpstream(replying(chat_reply(f"from replica {i}"))).start() for i in range(2)]
    try:
        server = make_server([replica.url for replica in replicas])
        cookie = server.session_cookie_name
        for index, session_id in enumerate(_session_ids_for_each_replica(server, 2)):
            client = connect(server, cookies={cookie: session_id})
            for _ in range(3):
                text = NeMoGymResponse.model_validate(
                    (await client.post("/v1/responses", json={"input": "q"})).json()
                ).output_text
                assert text == f"from replica {index}"
        assert [len(replica.received) for replica in replicas] == [3, 3]

        fresh = connect(server)  # a new client gets a session from the server, then sticks to one replica
        for _ in range(4):
            await fresh.post(CHAT, json={"messages": [{"role": "user", "content": "q"}]})
        assert sorted(len(replica.received) for replica in replicas) == [3, 7]
    finally:
        for replica in replicas:
            replica.stop()


def test_session_hash_is_stable_and_single_url_needs_none():
    assert make_server("http://a/v1/").base_url_for_session("anything") == "http://a/v1"
    server = make_server(["http://a/v1", "http://b/v1", "http://c/v1"])
    session_id = "0123456789abcdef0123456789abcdef"
    expected = int(hashlib.sha256(session_id.encode()).hexdigest(), 16) % 3
    assert server.base_url_for_session(session_id) == server._base_urls[expected]
    with pytest.raises(ValueError):
        VLLMModelConfig(host="h", port=1, entrypoint="app.py", name="n", base_url=[], model="m")


def test_official_openai_client_gets_valid_responses_and_chat_completions(upstream):
    upstream.responder = replying(chat_reply("<think>plan</think>", "tool_calls", [TOOL_CALL]))
    with serve_in_thread(make_server(upstream.url).setup_webserver()) as base_url:
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=20, max_retries=0)
        response = client.responses.create(model="m", input="Weather in Oslo?", tools=[WEATHER_TOOL])
        assert response.status == "completed"
        assert [item.type for item in response.output] == ["reasoning", "function_call"]
        assert response.output[1].name == "get_weather" and response.output[1].call_id == "call_1"

        completion = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            tools=[CHAT_WEATHER_TOOL],
        )
        message = completion.choices[0].message
        assert message.tool_calls[0].function.name == "get_weather"
        assert message.content == "<think>plan</think>"
        client.close()
    assert all(body["model"] == "policy" for body in upstream.bodies(CHAT))


@pytest.mark.parametrize(("config_name", "training"), [("vllm_model", False), ("vllm_model_for_training", True)])
def test_shipped_configs_load(config_name, training):
    path = Path(__file__).parents[1] / "configs" / f"{config_name}.yaml"
    config = OmegaConf.merge(
        OmegaConf.load(path),
        {"policy_base_url": ["http://a/v1", "http://b/v1"], "policy_api_key": "k", "policy_model_name": "m"},
        {"policy_model": {"responses_api_models": {"vllm_model": {"host": "127.0.0.1", "port": 1}}}},
    )
    loaded = VLLMModel.load_config("policy_model", config)
    assert (loaded.base_url, loaded.api_key, loaded.model) == (["http://a/v1", "http://b/v1"], "k", "m")
    assert loaded.return_token_id_information is training


async def test_chat_body_chat_template_kwargs_merge_over_the_config_and_under_metadata(upstream, connect):
    server = make_server(upstream.url, chat_template_kwargs={"enable_thinking": True, "other": 1, "style": "a"})
    body = {
        "model": "caller-choice",
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"other": 2, "style": "b"},  # NeMo Gym 0.7's callers send them on the body
        "metadata": {"chat_template_kwargs": '{"style": "c"}'},
    }
    answer = await connect(server).post(CHAT, json=body)
    assert answer.status_code == 200, answer.text
    [sent] = upstream.bodies(CHAT)
    assert sent["chat_template_kwargs"] == {"enable_thinking": True, "other": 2, "style": "c"}
