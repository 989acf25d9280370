"""NeMo Gym's ``openai_utils`` names: SDK objects accepted by request models, usage accumulation, the token-field
sets, and ``NeMoGymAsyncOpenAI`` against a real local endpoint (no SDK, no httpx)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from openai.types.responses import EasyInputMessage, FunctionTool

from nemo_gym.openai_utils import (
    RATE_LIMIT_ERROR_CODES,
    REQUIRED_TOKEN_METADATA_FIELDS,
    RETRY_ERROR_CODES,
    TOKEN_METADATA_FIELDS,
    NeMoGymAsyncOpenAI,
    NeMoGymChatCompletionContentPartTextParam,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymChatCompletionMessage,
    NeMoGymChatCompletionMessageToolCall,
    NeMoGymChatCompletionUserMessageParam,
    NeMoGymEasyInputMessage,
    NeMoGymFunction,
    NeMoGymFunctionTool,
    NeMoGymFunctionToolParam,
    NeMoGymMessage,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseInputTokensDetails,
    NeMoGymResponseOutputTokensDetails,
    NeMoGymResponseUsage,
    accumulate_response_usage,
)
from nemo_gym.transport import http_client
from nemo_gym.transport.http_client import ServerRequestError

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]


def test_request_models_accept_the_sdks_own_objects() -> None:
    tool = FunctionTool(type="function", name="lookup", parameters={"type": "object"}, strict=True)
    message = EasyInputMessage(role="user", content="hi")
    params = NeMoGymResponseCreateParamsNonStreaming(input=[message], tools=[tool])
    assert isinstance(params.tools[0], NeMoGymFunctionTool) and params.tools[0].name == "lookup"
    assert isinstance(params.input[0], NeMoGymEasyInputMessage) and params.input[0].content == "hi"
    assert params.model_dump(exclude_unset=True)["tools"][0] == {
        "type": "function",
        "name": "lookup",
        "parameters": {"type": "object"},
        "strict": True,
    }


def test_function_tool_params_and_functions_as_nemo_gym_writes_them() -> None:
    tool: NeMoGymFunctionToolParam = {"type": "function", "name": "f", "parameters": None, "strict": None}
    assert NeMoGymResponseCreateParamsNonStreaming(input="x", tools=[tool]).tools[0].name == "f"
    call = NeMoGymChatCompletionMessageToolCall(
        id="c1", type="function", function=NeMoGymFunction(name="f", arguments="{}")
    )
    message = NeMoGymChatCompletionMessage(role="assistant", content=None, tool_calls=[call])
    assert message.model_dump()["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}


def _usage(inputs: int, outputs: int, cached: int, reasoning: int) -> NeMoGymResponseUsage:
    return NeMoGymResponseUsage(
        input_tokens=inputs,
        input_tokens_details=NeMoGymResponseInputTokensDetails(cached_tokens=cached),
        output_tokens=outputs,
        output_tokens_details=NeMoGymResponseOutputTokensDetails(reasoning_tokens=reasoning),
        total_tokens=inputs + outputs,
    )


def test_accumulate_response_usage_adds_counts_and_details_without_touching_the_total() -> None:
    first, second = _usage(10, 5, 2, 1), _usage(7, 3, 4, 2)
    assert accumulate_response_usage(None, None) is None
    copied = accumulate_response_usage(None, first)
    assert copied == first and copied is not first
    total = accumulate_response_usage(first, second)
    assert total == _usage(17, 8, 6, 3)
    assert first == _usage(10, 5, 2, 1)  # the running total given in is not modified
    assert accumulate_response_usage(first, None) is first


def test_token_field_sets_and_retry_codes() -> None:
    assert REQUIRED_TOKEN_METADATA_FIELDS == {"prompt_token_ids", "generation_token_ids", "generation_log_probs"}
    assert TOKEN_METADATA_FIELDS == REQUIRED_TOKEN_METADATA_FIELDS | {"routed_experts"}
    assert 429 in RATE_LIMIT_ERROR_CODES and set(RETRY_ERROR_CODES) == {*RATE_LIMIT_ERROR_CODES, 404, 408, 500}


def test_importing_openai_utils_loads_no_sdk_and_no_http_client() -> None:
    probe = (
        "import sys, nemo_gym.openai_utils as u\n"
        "u.NeMoGymAsyncOpenAI(base_url='http://x/v1', api_key='k')\n"
        "print([m for m in ('openai', 'httpx', 'aiohttp') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------------------------------
# NeMoGymAsyncOpenAI


@pytest.fixture(autouse=True)
async def _close_pooled_session() -> AsyncIterator[None]:
    yield
    await http_client.close_session()


@contextlib.asynccontextmanager
async def endpoint(statuses: list[int]) -> AsyncIterator[tuple[str, list[dict]]]:
    """An OpenAI-like endpoint answering with ``statuses`` in turn (then 200), recording each request."""
    seen: list[dict] = []

    async def handle(req: web.Request) -> web.Response:
        body = orjson.loads(await req.read()) if req.can_read_body else None
        seen.append(
            {"path": req.path, "auth": req.headers.get("Authorization"), "x": req.headers.get("X"), "body": body}
        )
        status = statuses.pop(0) if statuses else 200
        if status != 200:
            return web.Response(status=status, text=f"status {status}", headers={"Retry-After": "0"})
        return web.json_response({"path": req.path, "echo": body})

    app = web.Application()
    app.add_routes([web.route("*", "/{tail:.*}", handle)])
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()


async def test_client_posts_json_with_the_key_and_returns_the_answer() -> None:
    async with endpoint([]) as (url, seen):
        client = NeMoGymAsyncOpenAI(base_url=f"{url}/v1", api_key="sk-1", default_headers={"X": "y"})
        answer = await client.create_chat_completion(model="m", messages=[{"role": "user", "content": "hi"}])
        assert answer == {
            "path": "/v1/chat/completions",
            "echo": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        }
        assert (await client.create_response(input="x"))["path"] == "/v1/responses"
        assert (await client.create_models())["path"] == "/v1/models"
        assert (await client.create_tokenize(prompt="x"))["path"] == "/tokenize"
        assert seen[0]["auth"] == "Bearer sk-1" and seen[0]["x"] == "y"


async def test_client_retries_rate_limits_then_succeeds() -> None:
    async with endpoint([429, 503, 502]) as (url, seen):
        client = NeMoGymAsyncOpenAI(base_url=url, api_key="k")
        assert (await client.create_completion(prompt="p"))["echo"] == {"prompt": "p"}
        assert len(seen) == 4


async def test_client_gives_up_on_repeated_server_errors_with_the_body_in_the_error() -> None:
    async with endpoint([500, 500, 500, 500]) as (url, seen):
        client = NeMoGymAsyncOpenAI(base_url=url, api_key="k")
        with pytest.raises(ServerRequestError, match="HTTP 500.*status 500"):
            await client.create_chat_completion(messages=[])
        assert len(seen) == 3


# ---------------------------------------------------------------------------------------------------------------------
# responses_converter names


def test_usage_detail_reads_the_nested_count_then_the_provider_aliases() -> None:
    from nemo_gym.openai_utils import NeMoGymCompletionUsage
    from nemo_gym.responses_converter import VLLMConverterResponsesToChatCompletionsState, _usage_detail

    nested = {"prompt_tokens_details": {"cached_tokens": 4}, "cache_read_input_tokens": 9}
    assert _usage_detail(nested, "prompt_tokens_details", "cached_tokens", "cache_read_input_tokens") == 4
    aliased = {"prompt_tokens_details": None, "cache_read_input_tokens": 9}
    assert _usage_detail(aliased, "prompt_tokens_details", "cached_tokens", "cache_read_input_tokens") == 9
    assert _usage_detail({"reasoning_output_tokens": True}, "x", "y", "reasoning_output_tokens") is None
    model = NeMoGymCompletionUsage(prompt_tokens=1, completion_tokens=2, total_tokens=3, reasoning_output_tokens=5)
    assert _usage_detail(model, "completion_tokens_details", "reasoning_tokens", "reasoning_output_tokens") == 5
    assert VLLMConverterResponsesToChatCompletionsState().has_items is False


def test_dumps_have_the_keys_nemo_gym_environments_compare_against() -> None:
    """Environments written for NeMo Gym compare whole dumps: fields newer APIs added are left out while unset, a
    reasoning item's status is never sent on (OpenAI refuses it when replayed), and the response has the top-level
    fields of NeMo Gym's (conversation, prompt_cache_key, safety_identifier)."""
    from nemo_gym.openai_utils import (
        NeMoGymEasyInputMessage,
        NeMoGymResponse,
        NeMoGymResponseOutputMessage,
        NeMoGymResponseOutputText,
        NeMoGymResponseReasoningItem,
        NeMoGymSummary,
    )

    assert NeMoGymEasyInputMessage(role="user", content="hi").model_dump() == {
        "role": "user",
        "content": "hi",
        "type": "message",
    }
    said = NeMoGymEasyInputMessage(role="assistant", content="ok", phase="final_answer").model_dump()
    assert said["phase"] == "final_answer"  # a phase that was given is kept
    message = NeMoGymResponseOutputMessage(id="m", content=[NeMoGymResponseOutputText(text="x", annotations=[])])
    assert "phase" not in message.model_dump()
    thought = NeMoGymResponseReasoningItem(id="r", summary=[NeMoGymSummary(text="t")], status="completed")
    assert "status" not in thought.model_dump() and thought == NeMoGymResponseReasoningItem(
        id="r", summary=[{"text": "t"}]
    )
    response = NeMoGymResponse(id="resp", created_at=0, model="m", output=[message, thought])
    dumped = response.model_dump()
    assert {"conversation", "prompt_cache_key", "safety_identifier"} <= dumped.keys()
    assert NeMoGymResponse.model_validate(dumped).model_dump() == dumped


def test_a_usage_dump_has_the_keys_of_the_installed_sdks_usage(monkeypatch: pytest.MonkeyPatch) -> None:
    """openai 2.7 (NeMo Gym's pin) has no ``cache_write_tokens``; its environments compare usage dicts without it.
    Newer SDKs require it. The dump follows whichever SDK is installed."""
    import nemo_gym.openai_usage as wire

    usage = wire.NeMoGymResponseUsage(input_tokens=5, output_tokens=2, total_tokens=7)
    monkeypatch.setattr(wire, "_SDK_COUNTS_CACHE_WRITES", False)
    assert usage.model_dump()["input_tokens_details"] == {"cached_tokens": 0}
    monkeypatch.setattr(wire, "_SDK_COUNTS_CACHE_WRITES", True)
    assert usage.model_dump()["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}


def test_a_status_on_an_easy_message_or_a_reasoning_item_is_dropped_as_nemo_gym_ignores_it() -> None:
    """NeMo Gym's easy message and reasoning item ignore a ``status``; its environments build both with one."""
    easy = NeMoGymEasyInputMessage(role="assistant", content="ok", status="completed")
    assert easy == NeMoGymEasyInputMessage(role="assistant", content="ok") and "status" not in easy.model_dump()
    request = NeMoGymResponseCreateParamsNonStreaming.model_validate(
        {
            "input": [
                {"role": "user", "content": "a string content takes no full form", "status": "completed"},
                {"role": "user", "content": [{"type": "input_text", "text": "x"}], "status": "completed"},
            ]
        }
    )
    first, second = request.input
    assert type(first) is NeMoGymEasyInputMessage  # the status is dropped: no full form takes a string content
    assert type(second) is NeMoGymMessage and second.status == "completed"  # a full form keeps it


def test_a_chat_request_part_equals_the_dict_nemo_gyms_typeddict_would_be() -> None:
    """NeMo Gym's Chat request types are TypedDicts: its tests compare them with plain dicts."""
    message = NeMoGymChatCompletionUserMessageParam(
        role="user", content=[NeMoGymChatCompletionContentPartTextParam(type="text", text="hi")]
    )
    assert message == {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    assert [{"role": "user", "content": [{"type": "text", "text": "hi"}]}] == [message]
    assert message != {"role": "user", "content": "hi"}
    assert message == NeMoGymChatCompletionUserMessageParam(role="user", content=[{"type": "text", "text": "hi"}])


def test_a_chat_request_dumps_to_what_nemo_gyms_model_and_typeddicts_dump_to() -> None:
    """NeMo Gym's round-trip tests compare whole dumps: messages hold only the keys given (TypedDicts), the request has
    NeMo Gym's fields and defaults, and fields newer than its `openai` pin are absent while unset."""
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    params = NeMoGymChatCompletionCreateParamsNonStreaming(
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    )
    dumped = params.model_dump()
    assert dumped["messages"] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    assert dumped["parallel_tool_calls"] is True
    assert {"audio", "prediction", "stream_options", "web_search_options"} <= dumped.keys()
    assert not {"verbosity", "prompt_cache_key", "safety_identifier"} & dumped.keys()
    assert params.model_dump(exclude_unset=True) == {"messages": dumped["messages"]}  # the body to send is unchanged
    assert not {"thinking", "output_config"} & dumped.keys()  # Anthropic's reasoning settings too, while unset
    assert not {"moderation", "prompt_cache_retention"} & dumped.keys()


def test_a_chat_request_takes_the_sdks_moderation_and_cache_retention_settings() -> None:
    """Newer SDK fields a NeMo Gym 0.7 client sends: kept as given, and a bad value is still refused."""
    body = {"messages": [{"role": "user", "content": "q"}], "moderation": {"model": "omni-moderation-latest"}}
    params = NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(body | {"prompt_cache_retention": "24h"})
    sent = params.model_dump(exclude_unset=True)
    assert sent["moderation"] == {"model": "omni-moderation-latest"} and sent["prompt_cache_retention"] == "24h"
    with pytest.raises(ValueError, match="prompt_cache_retention"):
        NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(body | {"prompt_cache_retention": "1y"})
    with pytest.raises(ValueError, match="moderation"):
        NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(body | {"moderation": {"modle": "x"}})


def test_a_chat_request_carries_anthropic_reasoning_settings_to_the_model_server() -> None:
    """NeMo Gym 0.7's GDPVal judges send Claude's `thinking` / `output_config` through an OpenAI-compatible gateway."""
    body = {"messages": [{"role": "user", "content": "q"}], "thinking": {"type": "adaptive"}}
    params = NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(body | {"output_config": {"effort": "high"}})
    sent = params.model_dump(exclude_unset=True)
    assert sent["thinking"] == {"type": "adaptive"} and sent["output_config"] == {"effort": "high"}
    with pytest.raises(ValueError, match="thinkng"):
        NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(body | {"thinkng": {}})  # a typo is still refused
