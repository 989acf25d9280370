"""NeMo Gym 0.7 names our faces offer, each tested for what a 0.7 folder does with it (the folder named per test)."""

from __future__ import annotations

import asyncio
import inspect
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from omegaconf import OmegaConf

from nemo_gym.errors import ConfigError

# ---------------------------------------------------------------------------------------------------------------------
# nemo_gym.rollout_collection


def test_environment_server_for_agent_finds_the_one_server_in_front_of_an_agent() -> None:
    """hermes_agent's recipe test: the agent of a config is reached through its environment server."""
    from nemo_gym.rollout_collection import _environment_server_for_agent, _environment_servers_by_agent

    config = OmegaConf.create(
        {
            "env": {"environment_servers": {"single_agent_turn": {"agent_server": {"name": "solver"}}}},
            "solver": {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py"}}},
        }
    )
    assert _environment_server_for_agent("solver", _environment_servers_by_agent(config)) == "env"
    with pytest.raises(ConfigError, match="no environment server"):
        _environment_server_for_agent("lonely", _environment_servers_by_agent(config))
    with pytest.raises(ConfigError, match="several environment servers"):
        _environment_server_for_agent("solver", {"solver": ["a", "b"]})


def test_episode_record_stores_an_environment_servers_result_with_its_task_id() -> None:
    """nemo_user_sim: the typed result is stored as the server gave it, scored by its top-level reward."""
    from nemo_gym.rollout_collection import _episode_record

    task_id = {"taskset": "nemo_user_sim:example", "task_id": "0"}
    record = _episode_record(
        {"episode_id": {"rollout_id": "0-0", "attempt": 0}, "task_id": task_id, "result": {"reward": 0.75, "x": 1}}
    )
    assert record == {"reward": 0.75, "x": 1, "_ng_task_id": task_id}


def test_trajectory_identity_prefers_the_rows_own_task_name() -> None:
    """miniswe_sandboxed_agent: a task name wins over the collector's index."""
    from nemo_gym.rollout_collection import _build_trajectory_record, _trajectory_identity

    row = {"_ng_task_index": 25, "_ng_rollout_index": 0, "task_id": "terminal-bench/x"}
    assert _trajectory_identity(row)[0] == "terminal-bench/x"
    assert _trajectory_identity({"_ng_task_index": 3, "_ng_rollout_index": 1}) == ("3", "3-1")
    record = _build_trajectory_record({"_ng_task_index": 0, "_ng_rollout_index": 0}, {})
    assert {gap.code for gap in record.gaps} >= {"model_calls_unavailable", "turns_unavailable"}


def test_terminal_failures_under_gdpvals_retry_contract() -> None:
    """gdpval: timeouts and repairable environment faults are retried, a skipped sample and a flagged row are not."""
    from nemo_gym.rollout_collection import NG_FAILURE_CLASS_KEY, NG_TERMINAL_KEY, is_terminal_failure

    assert is_terminal_failure({NG_TERMINAL_KEY: True}, retry_terminal_timeouts=True) is True
    for failure_class in ("timeout_exceeded", "reference_missing", "eval_missing", "transport_ineligible"):
        row = {NG_FAILURE_CLASS_KEY: failure_class, NG_TERMINAL_KEY: True}
        assert is_terminal_failure(row, retry_terminal_timeouts=True) is False
        assert is_terminal_failure(row) is True  # without the opt-in, the flag decides
    assert is_terminal_failure({NG_FAILURE_CLASS_KEY: "skipped"}, retry_terminal_timeouts=True) is True
    assert is_terminal_failure({NG_FAILURE_CLASS_KEY: "transient"}) is False


def test_observed_elapsed_and_the_attempt_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    from nemo_gym.rollout_collection import get_max_rollout_attempts, observed_elapsed

    assert observed_elapsed({"elapsed_seconds": "12.5"}) == 12.5
    assert observed_elapsed({"elapsed_seconds": 0, "response": {"metadata": {"elapsed_seconds": 7}}}) == 7.0
    assert observed_elapsed({"elapsed_seconds": "soon", "response": None}) is None
    monkeypatch.setenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "5")
    assert get_max_rollout_attempts() == 5
    monkeypatch.setenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "0")
    assert get_max_rollout_attempts() == 3


def test_invalid_judge_rows_move_to_the_sidecar_once(tmp_path: Path) -> None:
    """gdpval's resume: a legacy scored-zero judge failure becomes a retryable sidecar row, exactly once."""
    from nemo_gym.rollout_collection import migrate_invalid_judge_main_rows

    work = tmp_path / "work"
    work.mkdir()
    (work / "report.md").write_text("done")
    output = tmp_path / "rollouts.jsonl"
    rows = [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0},
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0, "invalid_judge_response": True,
         "_ng_failure_terminal": True, "deliverables_dir": str(work)},
    ]  # fmt: skip
    output.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    os.chmod(output, 0o640)
    assert migrate_invalid_judge_main_rows(output) == 1
    assert [orjson.loads(line) for line in output.read_bytes().splitlines()] == rows[:1]
    assert output.stat().st_mode & 0o777 == 0o640
    sidecar = tmp_path / "rollouts_failures.jsonl"
    (moved,) = [orjson.loads(line) for line in sidecar.read_bytes().splitlines()]
    assert moved["_ng_failure_class"] == "judge_invalid" and "_ng_failure_terminal" not in moved
    assert moved["reuse_cached_deliverable"] is True and moved["_ng_migrated_invalid_judge_response"] is True
    output.write_bytes(output.read_bytes() + orjson.dumps(rows[1]) + b"\n")  # a crash before the rewrite
    assert migrate_invalid_judge_main_rows(output) == 1
    assert len(sidecar.read_bytes().splitlines()) == 1
    assert migrate_invalid_judge_main_rows(tmp_path / "absent.jsonl") == 0


def test_shared_config_checks_completion() -> None:
    """gdpval: a submitted run fails when any planned rollout did not succeed."""
    from nemo_gym.rollout_collection import SharedRolloutCollectionConfig

    results = [{"_ng_task_index": i, "_ng_rollout_index": 0} for i in range(3)]
    results.append({"_ng_task_index": 3, "_ng_rollout_index": 0, "_ng_failure_class": "timeout"})
    config = SharedRolloutCollectionConfig(output_jsonl_fpath="rollouts.jsonl", require_complete=True)
    config.check_completion(expected=3, results=results)
    with pytest.raises(RuntimeError, match="3/4 samples completed"):
        config.check_completion(expected=4, results=results)
    SharedRolloutCollectionConfig(output_jsonl_fpath="r.jsonl").check_completion(expected=9, results=[])


def test_dispatch_latency_tracker() -> None:
    """gdpval's dispatcher: quantiles of finished rollouts, and the margin a new one needs."""
    from nemo_gym.rollout_collection import DispatchLatencyTracker

    tracker = DispatchLatencyTracker()
    assert tracker.quantile(0.5) is None and tracker.drain_margin(None) is None
    for seconds in (40.0, 10.0, 30.0, 20.0, 0.0):
        tracker.record(seconds)
    assert tracker.quantile(0.5) == 25.0 and tracker.drain_margin(None) is None  # four samples: too few
    tracker.record(50.0)
    assert tracker.drain_margin(None) == 40.0 and tracker.drain_margin(5.0) == 5.0
    tracker.record_drained()
    assert tracker.drained == 1
    assert "median 0.5 min" in tracker.summary() and "Drained" in tracker.summary()


def test_ng_perf_sums_the_calls_the_invocations_own() -> None:
    """gdpval's driver attaches ng_perf to every result when observability is on, and only then."""
    from nemo_gym.rollout_collection import _attach_ng_perf

    ref = {"type": "responses_api_models", "name": "policy_model"}
    trajectory = {
        "task_id": "0",
        "rollout_id": "0-0",
        "invocations": [{"invocation_id": "root", "model_calls": [{"model_call_id": "a"}, {"model_ref": ref,
                         "response_id": "r2"}, {"model_call_id": "missing"}]}],
        "model_calls": [
            {"model_call_id": "a", "token_stats": {"prompt_tokens": 10, "completion_tokens": 2}},
            {"model_call_id": "b", "response_metadata": {"model_ref": ref, "response_id": "r2"},
             "token_stats": {"prompt_tokens": 5, "cached_tokens": 4}},
            {"model_call_id": "c", "token_stats": {"prompt_tokens": 100}},
        ],
        "tool_calls": [{"invocation_id": "root", "tool_call_id": "t1"}, {"invocation_id": "other", "tool_call_id": "t2"}],
    }  # fmt: skip
    result: dict[str, Any] = {"ng_trajectory": trajectory}
    _attach_ng_perf(result, observability_enabled=False)
    assert "ng_perf" not in result
    _attach_ng_perf(result, observability_enabled=True, rollout_latency_ms=1234.0)
    assert result["ng_perf"] == {
        "num_turns": 2, "num_tool_calls": 1, "token_observability_coverage": 1.0, "prompt_tokens": 15,
        "cached_prompt_tokens": 4, "completion_tokens": 2, "total_latency_ms": 1234.0,
    }  # fmt: skip
    broken: dict[str, Any] = {"ng_trajectory": {"task_id": 1}}
    _attach_ng_perf(broken, observability_enabled=True)
    assert "ng_perf" not in broken


# ---------------------------------------------------------------------------------------------------------------------
# nemo_gym.reward_profile


class _Scorer:
    """Hooks shaped like a 0.7 server's: tiers as key metrics, a metric per repeat."""

    def compute_metrics(self, tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        rows = [row for task in tasks for row in task]
        return {"solved_share": sum(row["reward"] >= 1 for row in rows) / len(rows)}

    def compute_repeat_metrics(self, tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        return self.compute_metrics(tasks)

    def get_key_metrics(self, agent_metrics: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in agent_metrics.items() if k.startswith("solved_share")}


def test_compute_aggregate_metrics_runs_a_servers_hooks() -> None:
    """fukuyamabench and scicode_agent: the hooks shape the key metrics the way /aggregate_metrics would."""
    from nemo_gym.reward_profile import compute_aggregate_metrics

    scorer = _Scorer()
    rows = [
        {"_ng_task_index": t, "_ng_rollout_index": r, "reward": float((t + r) % 2 == 0)}
        for t in range(2)
        for r in range(2)
    ]
    result = compute_aggregate_metrics(
        rows, scorer.compute_metrics, scorer.get_key_metrics, scorer.compute_repeat_metrics
    )
    assert result.agent_metrics["mean/reward"] == 0.5
    assert result.key_metrics == {"solved_share": 0.5}
    assert result.agent_metrics["mean_across_repeats/solved_share"] == 0.5
    assert result.agent_metrics["std_across_repeats/solved_share"] == 0.0
    assert compute_aggregate_metrics([]).agent_metrics == {}


def test_masked_samples_are_counted_not_scored() -> None:
    from nemo_gym.reward_profile import compute_aggregate_metrics

    rows = [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0},
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0, "mask_sample": True},
    ]
    result = compute_aggregate_metrics(rows)
    assert result.agent_metrics["mean/reward"] == 1.0 and "mean/mask_sample" not in result.agent_metrics
    assert (
        result.key_metrics["coverage/masked_rollouts"] == 1 and result.key_metrics["coverage/fully_masked_tasks"] == 1
    )
    all_masked = compute_aggregate_metrics(rows[1:])
    assert all_masked.agent_metrics == all_masked.key_metrics == {
        "coverage/measured_rollouts": 0, "coverage/masked_rollouts": 1, "coverage/measured_tasks": 0,
        "coverage/fully_masked_tasks": 1,
    }  # fmt: skip


def test_the_mixin_hooks_have_the_signatures_servers_override() -> None:
    """vibench checks its overrides against the mixin's parameter names; harbor_agent inherits the defaults."""
    from nemo_gym.reward_profile import AggregateMetricsMixin

    for name, params in (("compute_metrics", ["tasks"]), ("compute_repeat_metrics", ["tasks"]),
                         ("get_key_metrics", ["agent_metrics"])):  # fmt: skip
        assert list(inspect.signature(getattr(AggregateMetricsMixin, name)).parameters) == ["self", *params]
    mixin = AggregateMetricsMixin()
    metrics = mixin._aggregate_with_hooks([{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}])
    assert metrics.key_metrics["mean/reward"] == 1.0


def test_reward_profiler_rollout_info_leaves_bookkeeping_out() -> None:
    """genrm_compare: a result's _ng_* fields (other than its indices) are not metrics."""
    from nemo_gym.reward_profile import RewardProfiler

    body = {"_ng_task_index": 0, "_ng_rollout_index": 2, "_ng_group_attempt": 1, "reward": 3.0, "ok": True,
            "name": "x", "response": {"usage": {"input_tokens": 7}}}  # fmt: skip
    assert RewardProfiler().rollout_info_from_result(body) == {
        "rollout_id": "0:2", "_ng_task_index": 0, "_ng_rollout_index": 2, "reward": 3.0, "input_tokens": 7, "ok": 1,
    }  # fmt: skip
    profiler = RewardProfiler()
    rows = [{"_ng_task_index": 0, "_ng_rollout_index": r, "agent_ref": {"name": "a"}} for r in range(2)]
    assert profiler.profile_completion_summary(rows, body_only := [rows[0]])["partial_input_rows"] == 1
    assert profiler.align_rows_and_results(rows, body_only, allow_partial_rollouts=True) == [(rows[0], rows[0])]
    with pytest.raises(ValueError, match="no rollout result"):
        profiler.align_rows_and_results(rows, body_only)


# ---------------------------------------------------------------------------------------------------------------------
# nemo_gym.openai_utils


def test_openai_utils_07_names() -> None:
    from nemo_gym.openai_utils import (
        CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS,
        MAX_NUM_TRIES,
        RESPONSES_TO_TRAIN,
        NeMoGymChatCompletionCreateParamsNonStreaming,
        NeMoGymResponse,
        NeMoGymResponseFunctionCallOutput,
        NeMoGymResponseFunctionToolCall,
        NeMoGymResponseMcpCall,
    )

    assert MAX_NUM_TRIES == 3  # openai_model's default max_http_attempts
    assert {"chat_template_kwargs", "thinking", "output_config"} == CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS
    params = NeMoGymChatCompletionCreateParamsNonStreaming(messages=[{"role": "user", "content": "hi"}])
    assert "messages" in params.model_dump(exclude=set(CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS))
    # nemo_fabric_agent builds tool results with it; langchain_deepagents puts a hosted mcp_call in a response
    output = NeMoGymResponseFunctionCallOutput(id="fco_1", call_id="c", output="ok", status="completed",
                                               type="function_call_output")  # fmt: skip
    call = NeMoGymResponseMcpCall(name="roll_dice", arguments="{}")
    response = NeMoGymResponse(id="r", created_at=0, model="m", object="response", output=[output, call],
                               parallel_tool_calls=False, tools=[], tool_choice="auto")  # fmt: skip
    assert [item.type for item in response.output] == ["function_call_output", "mcp_call"]
    assert response.output[1] is call
    # haystack_agent: the last item of a sampled turn becomes its training variant
    item = NeMoGymResponseFunctionToolCall(call_id="c", name="f", arguments="{}")
    tokens = {"prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [-0.1]}
    trained = RESPONSES_TO_TRAIN[type(item)](**item.model_dump(), **tokens)
    assert trained.generation_token_ids == [2] and RESPONSES_TO_TRAIN.get(type(output)) is None


# ---------------------------------------------------------------------------------------------------------------------
# nemo_gym.base_responses_api_model, nemo_gym.responses_streaming / chat_streaming, nemo_gym.anthropic_converter


def test_model_server_helpers() -> None:
    from nemo_gym.base_responses_api_model import (
        _orjson_dispatch_response,
        observability_enabled_from_config,
        start_model_execution,
    )
    from nemo_gym.openai_utils import NeMoGymChatCompletionMessage

    sent = _orjson_dispatch_response(NeMoGymChatCompletionMessage(role="assistant", content="x"))
    assert sent.media_type == "application/json" and orjson.loads(sent.body)["content"] == "x"
    assert _orjson_dispatch_response(sent) is sent
    assert observability_enabled_from_config({"observability_enabled": False}) is False
    assert observability_enabled_from_config({"observability_enabled": True, "model_call_capture_dir": "/tmp/c"})
    request = SimpleNamespace(state=SimpleNamespace())
    outcome = start_model_execution(request, upstream_attempted=False)  # vllm_model fills it in as it goes
    outcome.update(response_source="local", local_response_reason="empty_assistant")
    assert request.state.nemo_gym_model_execution["local_response_reason"] == "empty_assistant"


def _body(parts: list[Any]) -> bytes:
    return b"".join(part if isinstance(part, bytes) else part.encode() for part in parts)


def test_streamed_answers_read_back_in_each_dialect() -> None:
    """vllm_model's capture tests rebuild what a client was streamed, in all three dialects."""
    from nemo_gym import chat_streaming, responses_streaming
    from nemo_gym.anthropic_converter import AnthropicConverter
    from nemo_gym.base_responses_api_model import _reconstruct_streamed_response
    from nemo_gym.streaming import response_events

    completion = {"id": "c1", "object": "chat.completion", "created": 0, "model": "m", "choices": [{"index": 0,
                  "finish_reason": "tool_calls", "message": {"role": "assistant", "content": "hi", "refusal": None,
                  "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]}}],
                  "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}  # fmt: skip
    raw = _body(
        [chat_streaming._sse_data(c) for c in chat_streaming.chat_completion_chunks(completion, include_usage=True)]
    )
    chat = _reconstruct_streamed_response(raw, "chat_completions")
    assert chat is not None and chat["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == '{"a":1}'
    assert chat["choices"][0]["message"]["content"] == "hi" and chat["usage"]["total_tokens"] == 3

    response = {"id": "r1", "object": "response", "created_at": 0, "model": "m", "status": "completed", "output": [
        {"type": "message", "id": "m1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "hello", "annotations": []}]}], "usage": None}  # fmt: skip
    raw = _body([responses_streaming._sse_event(e) for e in response_events(response)])
    assert _reconstruct_streamed_response(raw, "responses")["output"][0]["content"][0]["text"] == "hello"

    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "tool_use",
               "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 4},
               "content": [{"type": "text", "text": "ok"}, {"type": "tool_use", "id": "tu", "name": "f",
                                                             "input": {"x": 1}}]}  # fmt: skip
    raw = _body(list(AnthropicConverter().anthropic_response_to_sse(message)))
    rebuilt = _reconstruct_streamed_response(raw, "messages")
    assert rebuilt is not None and rebuilt["content"] == message["content"]
    assert rebuilt["stop_reason"] == "tool_use" and rebuilt["usage"]["output_tokens"] == 4
    assert _reconstruct_streamed_response(b"", "messages") is None


def test_streaming_bodies_are_sanitized_and_namespaces_restored() -> None:
    """vllm_model_with_compaction: a Codex-style body becomes valid params, and the client gets its names back."""
    from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming
    from nemo_gym.responses_streaming import restore_namespace_tool_calls, sanitize_streaming_responses_body

    function = {"type": "function", "name": "read", "parameters": {"type": "object", "properties": {}}, "strict": False}
    body = {
        "stream": True, "stream_options": {"include_usage": True}, "client_metadata": {"x": 1},
        "instructions": "Be brief.",
        "tools": [{"type": "namespace", "name": "fs", "tools": [function]}, {"type": "web_search"}],
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
            {"type": "additional_tools", "tools": [function | {"name": "write"}, {"type": "custom", "name": "exec"}]},
            {"type": "function_call", "call_id": "c", "namespace": "fs", "name": "read", "arguments": "{}"},
            {"type": "no_such_item"},
            {"role": "user", "content": "go"},
        ],
    }  # fmt: skip
    cleaned, names = sanitize_streaming_responses_body(body)
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate(cleaned)
    assert [tool.name for tool in params.tools] == ["fs__read", "write"]
    assert params.instructions == "Be brief.\n\nUse tools."
    assert [item.type for item in params.input] == ["function_call", "message"]  # type: ignore[union-attr]
    assert params.input[0].name == "fs__read"  # type: ignore[union-attr,index]
    assert body["stream"] is True  # the caller's body is left as it was
    restored = restore_namespace_tool_calls([{"type": "function_call", "name": "fs__read"}], names)
    assert restored == [{"type": "function_call", "name": "read", "namespace": "fs"}]


def test_anthropic_converter_both_directions(monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm_model's tests make the Messages side of a model server fail through the converter's own methods."""
    from nemo_gym.anthropic_converter import AnthropicConverter
    from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming

    converter = AnthropicConverter()
    params = converter.anthropic_request_to_responses(
        {"model": "m", "max_tokens": 9, "system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert params.instructions == "Be brief." and params.max_output_tokens == 9
    response = NeMoGymResponse.model_validate(
        {"id": "r1", "created_at": 0, "model": "m", "object": "response", "parallel_tool_calls": True, "tools": [],
         "tool_choice": "auto", "output": [{"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                                            "content": [{"type": "output_text", "text": "hello", "annotations": []}]}]}
    )  # fmt: skip
    message = converter.responses_to_anthropic_response(response, "served")
    assert message["model"] == "served" and message["content"] == [{"type": "text", "text": "hello"}]

    request = converter.responses_to_anthropic(
        NeMoGymResponseCreateParamsNonStreaming(input="hi"), "claude", 100, None, 64, {"top_k": 5}
    )
    assert request["max_tokens"] == 100 and request["top_k"] == 5
    assert request["thinking"] == {"type": "enabled", "budget_tokens": 64}
    answer = {"id": "msg", "model": "x", "stop_reason": "end_turn", "content": [{"type": "text", "text": "yo"}],
              "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip
    back = converter.anthropic_to_responses(answer, NeMoGymResponseCreateParamsNonStreaming(input="hi"), "claude")
    assert back.model == "claude" and back.output_text == "yo"

    def refuse(self: AnthropicConverter, event_type: str, data: dict[str, Any]) -> str:
        raise ValueError(f"injected failure at {event_type}")

    monkeypatch.setattr(AnthropicConverter, "_sse_event", refuse)
    with pytest.raises(ValueError, match="message_start"):
        list(converter.anthropic_response_to_sse(message))


# ---------------------------------------------------------------------------------------------------------------------
# nemo_gym.mcp_auto_exposure, nemo_gym.telemetry, nemo_gym.rollout_observability


def test_mcp_token_header_is_the_one_seed_session_hands_out() -> None:
    """interactive_browser and hermes_agent read the token from the seed answer's headers under this name."""
    from nemo_gym.mcp_auto_exposure import NEMO_GYM_MCP_SESSION_TOKEN_HEADER, TOKEN_HEADER
    from nemo_gym.mcp_exposure import mcp_metadata

    assert TOKEN_HEADER == NEMO_GYM_MCP_SESSION_TOKEN_HEADER == "X-NeMo-Gym-Session-Token"
    assert mcp_metadata("server", "0" * 32)["headers"][TOKEN_HEADER] == "0" * 32


def test_connection_pool_destination_label() -> None:
    """remote_agent: the label is "external" unless a call set its own, and is restored after it."""
    from nemo_gym.telemetry import connection_pool

    assert connection_pool._SERVER_NAME.get() == "external"

    async def labelled() -> str:
        with connection_pool.destination("remote_agent_service"):
            await asyncio.sleep(0)
            return connection_pool._SERVER_NAME.get()

    assert asyncio.run(labelled()) == "remote_agent_service"
    assert connection_pool.current_server_name() == "external"


def test_join_model_call_observations() -> None:
    """opencode_agent: references resolve to the captured call, and what cannot be joined is said as a gap."""
    from nemo_gym.base_responses_api_model import ModelCallRecord
    from nemo_gym.rollout_observability import AgentObservationBundle, join_model_call_observations

    ref = {"type": "responses_api_models", "name": "policy_model"}
    calls = [ModelCallRecord(call_index=0, model_call_id="a", model_ref=ref, response_id="r1"),
             ModelCallRecord(call_index=1, model_call_id="b")]  # fmt: skip
    bundle = AgentObservationBundle.model_validate(
        {
            "source": "t",
            "records": [
                {
                    "kind": "agent_invocation",
                    "invocation_id": "root",
                    "model_calls": [{"model_ref": ref, "response_id": "r1"}, {"model_call_id": "zzz"}],
                },
                {"kind": "agent_invocation", "invocation_id": "sub", "model_calls": [{"model_call_id": "a"}]},
            ],
        }  # fmt: skip
    )
    joined = join_model_call_observations(bundle, calls)
    root, sub = joined.records
    assert root.model_calls[0].model_call_id == "a" and root.model_calls[0].response_id == "r1"
    codes = {(gap.code, gap.invocation_id, gap.detail) for gap in joined.gaps}
    assert codes == {
        ("model_call_reference_unmatched", "root", "zzz"),
        ("model_call_reference_conflict", "sub", "a"),
        ("model_call_ownership_unavailable", None, "capture:b:call_index=1"),
    }
    assert bundle.records[0].model_calls[0].model_call_id is None  # the input bundle is left as it was
    assert join_model_call_observations(joined, calls).gaps == joined.gaps


# ---------------------------------------------------------------------------------------------------------------------
# nemo_gym.config.parser_face (nemo_gym.global_config's GlobalConfigDictParser)


def test_global_config_dict_parser_composes_a_fixture_config(tmp_path: Path) -> None:
    """aegis_v4_safety / finance_agent_v2 fixtures: NO_MODEL + config_paths, no command line, no env.yaml."""
    from nemo_gym.config.parser_face import GlobalConfigDictParser, GlobalConfigDictParserConfig

    base = tmp_path / "base.yaml"
    base.write_text("shared:\n  judge_prompt: ask\n  temperature: 0.1\n")
    config_file = tmp_path / "bench.yaml"
    config_file.write_text(
        f"config_paths: [{base}]\n"
        "bench_settings:\n  _inherit_from: shared\n  temperature: 0.5\n  model: ${policy_model_name}\n"
    )
    initial = OmegaConf.merge(
        GlobalConfigDictParserConfig.NO_MODEL_GLOBAL_CONFIG_DICT, {"config_paths": [str(config_file)]}
    )
    parser = GlobalConfigDictParser()
    resolved = parser.parse(
        GlobalConfigDictParserConfig(
            initial_global_config_dict=initial, skip_load_from_cli=True, skip_load_from_dotenv=True, offline=True
        )
    )
    assert OmegaConf.to_container(resolved.bench_settings, resolve=True) == {
        "judge_prompt": "ask", "temperature": 0.5, "model": "",
    }  # fmt: skip
    assert str(config_file) in resolved.config_paths
    assert parser.parse_no_environment(initial_global_config_dict=initial).bench_settings.temperature == 0.5

    paths, configs = parser.load_extra_config_paths([str(config_file)])
    assert paths == [str(base), str(config_file)]
    merged = OmegaConf.merge(*configs, {"policy_model_name": "served"})
    parser._recursively_swap_keys(merged)
    assert "shared" not in merged and merged.bench_settings.judge_prompt == "ask"
    assert merged.bench_settings.model == "served"


def test_repeat_level_metrics_summarize_each_repeat_when_there_are_several() -> None:
    """NeMo Gym 0.7's per-repeat rows (gdpval passes them on): coverage counts and statistics of each repeat."""
    from nemo_gym.reward_profile import compute_aggregate_metrics

    rows = [{"_ng_task_index": t, "_ng_rollout_index": r, "reward": float(t == r)} for t in range(3) for r in range(2)]
    rows.pop()  # repeat 1 misses task 2
    result = compute_aggregate_metrics(rows)
    first, second = result.repeat_level_metrics
    assert (first["_ng_rollout_index"], first["sample_count"], first["missing_count"]) == (0, 3, 0)
    assert (second["_ng_rollout_index"], second["sample_count"], second["missing_count"]) == (1, 2, 1)
    assert first["mean/reward"] == 1 / 3 and second["mean/reward"] == 0.5
    assert compute_aggregate_metrics(rows[:3:2]).repeat_level_metrics == []  # one repeat: nothing to compare
