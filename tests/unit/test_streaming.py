"""The SSE wire format of ``nemo_gym/streaming.py``: live text deltas reconciled with the finished response."""

from __future__ import annotations

from nemo_gym.streaming import ResponseEvents, chat_completion_chunks, response_events, sse_event

MESSAGE = {
    "id": "msg_final", "type": "message", "role": "assistant", "status": "completed",
    "content": [{"type": "output_text", "text": "Hello there.", "annotations": [], "logprobs": []}],
}  # fmt: skip
REASONING = {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]}
CALL = {
    "id": "fc_1",
    "type": "function_call",
    "call_id": "c",
    "name": "f",
    "arguments": '{"a": 1}',
    "status": "completed",
}


def response(*output: dict) -> dict:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "m",
        "status": "completed",
        "output": list(output),
    }


def test_live_deltas_then_the_rest_add_up_to_the_final_text_and_the_message_keeps_its_announced_id() -> None:
    events = ResponseEvents("resp_1", "m", created_at=1)
    sent = events.start() + events.text_delta("Hel") + events.text_delta("lo")
    sent += events.finish(response(REASONING, MESSAGE, CALL))
    deltas = "".join(e["delta"] for e in sent if e["type"] == "response.output_text.delta")
    assert deltas == "Hello there."
    added = [e["item"]["id"] for e in sent if e["type"] == "response.output_item.added"]
    done = [e["item"]["id"] for e in sent if e["type"] == "response.output_item.done"]
    assert added == done == ["msg_resp_1", "rs_1", "fc_1"]  # the streamed message stays first, where it was announced
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    assert [i["id"] for i in sent[-1]["response"]["output"]] == done and sent[-1]["type"] == "response.completed"


def test_a_finished_response_streams_every_item_kind_and_an_incomplete_one_says_so() -> None:
    kinds = [e["type"] for e in response_events(response(REASONING, CALL) | {"status": "incomplete"})]
    assert "response.reasoning_summary_text.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert kinds[-1] == "response.incomplete"
    assert sse_event({"type": "x", "a": 1}) == b'event: x\ndata: {"type":"x","a":1}\n\n'


def test_chat_chunks_carry_the_unsent_content_tool_calls_and_usage() -> None:
    completion = {
        "id": "c", "created": 1, "model": "m", "usage": {"prompt_tokens": 1},
        "choices": [{"message": {"content": "Hi all", "tool_calls": [{"id": "t", "function": {"name": "f", "arguments": "{}"}}]},
                     "finish_reason": "tool_calls"}],
    }  # fmt: skip
    chunks = list(chat_completion_chunks(completion, sent_text="Hi", include_usage=True))
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1]]
    assert deltas[0] == {"content": " all"}
    assert (
        deltas[1]["tool_calls"][0]["function"]["name"] == "f"
        and deltas[2]["tool_calls"][0]["function"]["arguments"] == "{}"
    )
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 1}
