"""Training-token capture (``nemo_gym.token_id_capture``): records, store, lineage, capture context, rebuild,
worker staging, and a real model server capturing the calls made under ``/ng-rollout/<id>/training-token-capture/``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import httpx
import pytest

from nemo_gym.observability.capture import CaptureStore, read_model_call_records
from nemo_gym.server_utils import ServerClient
from nemo_gym.testing import FakeUpstream, serve_in_thread
from nemo_gym.token_id_capture import (
    CaptureContext,
    FileLineageStore,
    InMemoryLineageStore,
    LineageResolver,
    ParentResolutionStatus,
    TokenCaptureSnapshot,
    TokenCaptureStore,
    TokenEntry,
    TokenSink,
    TokenSource,
    capture_tokens,
    commit_entry,
    compute_digest,
    current_capture_context,
    extract_token_fields,
    reset_token_sink,
    resolve_parent,
    set_token_sink,
    trajectories_from_source,
)
from nemo_gym.token_id_capture.adapters.vllm import VLLMCaptureAdapter
from nemo_gym.token_id_capture.config import token_id_capture_config, token_id_capture_enabled_for_agent
from nemo_gym.token_id_capture.external_capture import (
    ExternalCaptureHandler,
    VLLMWorkerCaptureHandler,
    make_external_capture_handler,
)
from nemo_gym.token_id_capture.fingerprint import assistant_fingerprint, conversation_digest
from nemo_gym.token_id_capture.records import UNCOMMITTED_CALL_REASON, UNRESOLVED_PARENT_REASON
from nemo_gym.token_id_capture.sink import NG_CAPTURE_FIELD, NG_COMMIT_COORDS_FIELD
from nemo_gym.token_id_capture.staging import resolve_terminal, select_terminal_call
from nemo_gym.token_id_capture.staging.capture import CaptureError, RolloutTokenCapture
from nemo_gym.token_id_capture.staging.rebuild import ReceiptVerificationError, verify_and_linearize
from nemo_gym.token_id_capture.staging.records import (
    WORKER_MISSING_COMMIT_COORDS_REASON,
    CaptureAdmission,
    RolloutManifest,
    RolloutReceipt,
    StagedCallBaseSnapshot,
    StageResult,
)
from nemo_gym.transport.http_client import close_session
from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

pytestmark = pytest.mark.timeout(120)

USER = {"role": "user", "content": "hi"}


def answer(text: str, prompt: list[int], generated: list[int], response_id: str = "resp-1") -> dict[str, Any]:
    """A Responses answer whose message carries its token ids, as a model server in training mode returns it."""
    item = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
        "prompt_token_ids": prompt,
        "generation_token_ids": generated,
        "generation_log_probs": [-0.5] * len(generated),
    }
    return {"id": response_id, "object": "response", "model": "m", "output": [item]}


async def captured(context: CaptureContext, items: list[dict[str, Any]], served: dict[str, Any] | None) -> None:
    """One call as the capture middleware runs it: parent decided before dispatch, then the answer recorded."""
    token = set_token_sink(context)
    try:
        await resolve_parent(items)
        await capture_tokens(served, request_messages=items)
    finally:
        reset_token_sink(token)


def context(
    store: TokenSink | None, lineage: Any, call_id: str, rollout_id: str = "r1", **extra: Any
) -> CaptureContext:
    return CaptureContext(
        rollout_id=rollout_id, model_call_id=call_id, token_sink=store, lineage_store=lineage, **extra
    )


# -- records and fingerprints ----------------------------------------------------------------------------------------


def test_a_token_entry_refuses_inconsistent_records() -> None:
    base = {"rollout_id": "r", "model_call_id": "c", "prompt_token_ids": [1], "generation_token_ids": [2]}
    assert TokenEntry(**base, generation_log_probs=[-1.0]).cum_len is None
    for bad in (
        {"generation_log_probs": []},
        {"generation_log_probs": [-1.0], "schema_version": 99},
        {"generation_log_probs": [-1.0], "prompt_is_delta": True},
        {"generation_log_probs": [-1.0], "parent_resolution": "resolved"},
        {"generation_log_probs": [-1.0], "parent_resolution": "root", "parent_call_id": "p"},
    ):
        with pytest.raises(ValueError):
            TokenEntry(**base, **bad)
    assert compute_digest([1, 2]) != compute_digest([1, 2, 0]) != compute_digest([])
    with pytest.raises(ValueError):
        compute_digest([-1])


def test_token_fields_are_read_from_responses_items_or_chat_messages_and_half_a_record_is_refused() -> None:
    assert extract_token_fields(answer("a", [1], [2]))["generation_token_ids"] == [2]
    chat = {"choices": [{"message": {"role": "assistant", "prompt_token_ids": [1], "generation_token_ids": [2],
                                     "generation_log_probs": [-0.1]}}]}  # fmt: skip
    assert extract_token_fields(chat)["prompt_token_ids"] == [1]
    assert extract_token_fields({"output": [{"type": "message", "content": []}]}) is None
    with pytest.raises(ValueError, match="lacks generation_log_probs"):
        extract_token_fields({"output": [{"prompt_token_ids": [1], "generation_token_ids": [2]}]})


def test_fingerprints_are_the_same_across_dialects_and_ignore_reasoning() -> None:
    chat = [USER, {"role": "assistant", "content": "x", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}]}]  # fmt: skip
    responses = [
        USER,
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":2,"b":1}'},
    ]
    assert assistant_fingerprint(chat) != ""
    assert assistant_fingerprint(responses) == assistant_fingerprint(
        [USER, {"role": "assistant", "content": "x"}, responses[3]]
    )
    assert assistant_fingerprint([USER]) == ""
    tool_result = {"type": "function_call_output", "call_id": "c1", "output": "cold"}
    assert conversation_digest([USER, tool_result]) != conversation_digest([USER, {**tool_result, "output": "warm"}])


# -- the file store -------------------------------------------------------------------------------------------------


def entry(call_id: str, prompt: list[int], generated: list[int], rollout_id: str = "r1", **extra: Any) -> TokenEntry:
    return TokenEntry(
        rollout_id=rollout_id,
        model_call_id=call_id,
        prompt_token_ids=prompt,
        generation_token_ids=generated,
        generation_log_probs=[-0.5] * len(generated),
        **extra,
    )


def test_the_store_is_idempotent_freezes_and_retires_only_the_consumed_snapshot(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    assert isinstance(store, TokenSink) and isinstance(store, TokenSource)
    first = entry("c1", [1], [2])
    store.append(first)
    store.append(first)  # the same bytes again: a retry, not a second call
    with pytest.raises(ValueError, match="recorded differently"):
        store.append(entry("c1", [1], [3]))
    assert store.is_incomplete("r1")

    snapshot = store.freeze_now("r1")
    assert [e.model_call_id for e in snapshot.entries] == ["c1"] and snapshot.incomplete
    assert store.freeze_now("r1").snapshot_id == snapshot.snapshot_id
    with pytest.raises(RuntimeError, match="frozen"):
        store.append(entry("c2", [1, 2], [3]))
    store.mark_incomplete_now("r1", "late")  # allowed after freeze, and it changes the version
    assert not store.drop_now("r1", snapshot.snapshot_id, snapshot.version)
    latest = store.freeze_now("r1")
    assert store.drop_now("r1", latest.snapshot_id, latest.version)
    with pytest.raises(RuntimeError, match="retired"):
        store.freeze_now("r1")


def test_a_dispatched_call_without_an_entry_masks_the_rollout_and_a_torn_line_is_ignored(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    store.begin_call_now("r2", "c1")
    store.append(entry("c1", [1], [2], rollout_id="r2"))
    assert not store.freeze_now("r2").incomplete
    store.begin_call_now("r3", "lost")
    assert store.freeze_now("r3").incomplete
    store.append(entry("c1", [1], [2], rollout_id="r4"))
    with store.path_for("r4").open("ab") as out:
        out.write(b'{"rollout_id": "r4", "model_')  # a writer died mid-line: never acknowledged
    assert [e.model_call_id for e in store.read_entries("r4")] == ["c1"]
    store.append(entry("c2", [1, 2], [3], rollout_id="r4"))
    assert [e.model_call_id for e in store.read_entries("r4")] == ["c1", "c2"]
    with pytest.raises(ValueError):
        store.path_for("../escape")


# -- parent resolution and the capture context ----------------------------------------------------------------------


async def test_a_continuation_resolves_its_parent_and_delta_records_rebuild_exactly(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    workers = [FileLineageStore(tmp_path), FileLineageStore(tmp_path)]  # two processes on one node
    assert isinstance(workers[0], LineageResolver)
    first_out = answer("hello", [1, 2], [3, 4], "resp-1")
    await captured(context(store, workers[0], "c1", delta_records=True), [USER], first_out)

    assistant = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]}
    follow_up = [USER, assistant, {"role": "user", "content": "more"}]
    second = context(store, workers[1], "c2", delta_records=True)
    await captured(second, follow_up, answer("bye", [1, 2, 3, 4, 5], [6], "resp-2"))
    assert second.parent_resolution is not None
    assert second.parent_resolution.status == ParentResolutionStatus.RESOLVED
    assert second.parent_call_id == "c1" and second.parent_tokens == [1, 2, 3, 4]
    stored = store.read_entries("r1")
    assert stored[1].prompt_is_delta and stored[1].prompt_token_ids == [5]  # only what follows the parent
    assert stored[1].digest == compute_digest([1, 2, 3, 4, 5, 6])

    third = context(store, workers[0], "c3")  # a third turn resolves through the delta chain
    await captured(
        third, [*follow_up, {"role": "assistant", "content": "bye"}], answer("x", [1, 2, 3, 4, 5, 6], [7], "resp-3")
    )
    assert third.parent_tokens == [1, 2, 3, 4, 5, 6]

    rewritten = context(store, workers[0], "c4")  # the context before the call was edited: no parent is proven
    await captured(rewritten, [{"role": "user", "content": "HI"}, assistant], answer("y", [9], [8]))
    assert rewritten.parent_resolution is not None and rewritten.parent_resolution.reason == "no_match"

    built = await trajectories_from_source("r1", store, verified_response=answer("x", [], [], "resp-3"))
    assert built is not None
    output = built["rebuilt_response"]["output"]
    assert [item["prompt_token_ids"] for item in output] == [[1, 2], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6]]
    assert built["metrics"]["chains"] == 2 and built["metrics"]["unresolved_parent_calls"] == 1


async def test_identical_retries_collapse_but_different_siblings_stay_unresolved() -> None:
    lineage = InMemoryLineageStore()
    for call_id in ("a", "b"):
        done = entry(call_id, [1], [2], continuation_fingerprint="", parent_resolution="root")
        await commit_and_index(lineage, done, [USER], "same")
    follow_up = [USER, {"role": "assistant", "content": "same"}, {"role": "user", "content": "next"}]
    resolved = await lineage.resolve("r1", follow_up)
    assert resolved.match is not None and resolved.match.model_call_id == "a"  # same tokens: either is right

    await commit_and_index(lineage, entry("c", [1], [9], parent_resolution="root"), [USER], "same")
    assert (await lineage.resolve("r1", follow_up)).reason == "ambiguous"
    assert (await lineage.resolve("r1", [USER])).status == ParentResolutionStatus.ROOT


async def commit_and_index(lineage: InMemoryLineageStore, done: TokenEntry, items: list[Any], text: str) -> None:
    from nemo_gym.token_id_capture import stamp_continuation, stamp_lineage

    done.output_items = [{"type": "message", "role": "assistant", "content": text}]
    stamp_continuation(done, items)
    stamp_lineage(done, None, parent_resolution=ParentResolutionStatus.ROOT)
    await lineage.put(done)


async def test_capture_failures_mark_the_rollout_instead_of_failing_the_call(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    assert current_capture_context() is None
    await captured(context(store, None, "c1"), [USER], {"id": "x", "output": [{"type": "message", "content": []}]})
    assert store.is_incomplete("r1") and store.read_entries("r1") == []

    wrong = context(store, None, "c2", rollout_id="r2")
    token = set_token_sink(wrong)
    try:
        await commit_entry(entry("other", [1], [2], rollout_id="r2"))
    finally:
        reset_token_sink(token)
    assert store.is_incomplete("r2")

    continuation = context(store, None, "c3", rollout_id="r3")  # a continuation with no resolver
    await captured(continuation, [USER, {"role": "assistant", "content": "a"}], answer("b", [1], [2]))
    [saved] = store.read_entries("r3")
    assert saved.parent_resolution == ParentResolutionStatus.UNRESOLVED
    assert saved.parent_resolution_reason == "resolver_unavailable"


# -- rebuilding a rollout -------------------------------------------------------------------------------------------


async def test_a_retried_final_call_is_masked_unless_the_scored_response_names_it(tmp_path: Path) -> None:
    store, lineage = TokenCaptureStore(tmp_path), FileLineageStore(tmp_path)
    await captured(context(store, lineage, "c1"), [USER], answer("hello", [1], [2], "resp-1"))
    follow_up = [USER, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    await captured(context(store, lineage, "try1"), follow_up, answer("one", [1, 2, 3], [4], "resp-2"))
    await captured(context(store, lineage, "try2"), follow_up, answer("two", [1, 2, 3], [5], "resp-3"))

    unnamed = await trajectories_from_source("r1", store)
    assert unnamed is not None and unnamed["mask_sample"] and unnamed["unresolved_retries"] == ["try1", "try2"]

    scored = answer("two", [], [], "resp-3")
    named = await trajectories_from_source("r1", store, verified_response=scored)
    assert named is not None and not named["mask_sample"]
    assert named["metrics"]["terminal_attribution"]["method"] == "response_id"
    assert named["metrics"]["terminal_attribution"]["chain"] == "delivered"
    assert [item["generation_token_ids"] for item in named["rebuilt_response"]["output"]] == [[2], [5]]

    declared_elsewhere = await trajectories_from_source("r1", store, declared_response_id="resp-404")
    assert declared_elsewhere is not None and declared_elsewhere["mask_sample"]
    snapshot = named["_capture_snapshot"]
    assert await store.drop("r1", snapshot_id=snapshot["snapshot_id"], version=snapshot["version"])


async def test_a_tampered_parent_link_is_quarantined_and_an_empty_capture_is_masked(tmp_path: Path) -> None:
    root = entry("c1", [1], [2], parent_resolution="root")
    root.cum_len, root.digest = 2, compute_digest([1, 2])
    child = entry("c2", [1, 9, 3], [4], parent_resolution="resolved", parent_call_id="c1")
    snapshot = TokenCaptureSnapshot("r1", (root, child), incomplete=False, snapshot_id="s", version=1)
    source = MagicMock(spec=TokenSource)
    source.freeze.return_value = snapshot
    built = await trajectories_from_source("r1", source)
    assert built is not None and built["mask_sample"]
    assert built["metrics"]["parent_link_failures"] == {"parent_digest_mismatch": 1}
    assert built["metrics"]["quarantined_calls"] == 1

    source.freeze.return_value = TokenCaptureSnapshot("r1", (), incomplete=True, snapshot_id="s", version=2)
    empty = await trajectories_from_source("r1", source)
    assert empty is not None and empty["mask_sample"] and empty["metrics"]["capture_incomplete"]


# -- configuration --------------------------------------------------------------------------------------------------


def test_the_config_block_is_checked_and_agents_opt_in(tmp_path: Path) -> None:
    assert not token_id_capture_config(None).enabled
    on = {"token_id_capture": {"enabled": True, "dir": str(tmp_path)}}
    assert token_id_capture_config(on).resolved_dir() == tmp_path
    for bad in (
        {"token_id_capture": {"enabled": True, "dir": "relative"}},
        {"token_id_capture": {"enabled": True}},
        {"token_id_capture": {"enabled": True, "dir": str(tmp_path), "external_staging": True}},
        {"token_id_capture": {"enabled": True, "sink": "nemo_gym.token_id_capture.store:TokenCaptureStore"}},
        {"token_id_capture": {"enabled": True, "dir": str(tmp_path), "typo": 1}},
    ):
        with pytest.raises(ValueError):
            token_id_capture_config(bad)
    agents = {**on, "a": {"responses_api_agents": {"x": {"token_id_capture": True}}}, "b": {"responses_api_agents": {}}}
    assert token_id_capture_enabled_for_agent(agents, "a") and not token_id_capture_enabled_for_agent(agents, "b")
    assert token_id_capture_enabled_for_agent({"token_id_capture": {**on["token_id_capture"], "all_agents": True}}, "b")


# -- worker-owned staging ---------------------------------------------------------------------------------------------


class Worker:
    """A framework inference worker: stages deltas in memory, serves them back by key, tokenises chat messages."""

    def __init__(self) -> None:
        self.records: dict[str, Any] = {}
        self.capture = RolloutTokenCapture(sink=self, weight_version_fn=lambda: 3, adapter=VLLMCaptureAdapter())

    def stage(self, record: Any, *, attachments: Any = None) -> StageResult:
        self.records[record.staging_key] = record
        return StageResult(ok=True, staging_key=record.staging_key)

    def fetch(self, keys: list[str]) -> list[StagedCallBaseSnapshot]:
        return [StagedCallBaseSnapshot.model_validate(self.records[key].model_dump(exclude={"extras"})) for key in keys]

    def complete(
        self, body: dict[str, Any], completion: dict[str, Any], prompt: list[int], generated: list[int]
    ) -> None:
        """Stage an admitted request's tokens and acknowledge them on the completion, as a vLLM worker would."""
        admission = CaptureAdmission.model_validate(body[NG_CAPTURE_FIELD])
        prefix = [token for key in admission.staging_chain for token in self.records[key].token_ids_delta]
        call = self.capture.begin_call(admission, prefix_token_ids=prefix if admission.mode == "token_in" else None)
        completion["choices"][0]["message"].update(
            prompt_token_ids=prompt, generation_token_ids=generated, generation_log_probs=[-0.5] * len(generated)
        )
        coords = self.capture.complete_call_from_response(call, completion)
        completion[NG_COMMIT_COORDS_FIELD] = coords.model_dump(mode="json")


def completion(text: str, completion_id: str = "chatcmpl-1") -> dict[str, Any]:
    choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
    return {"id": completion_id, "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]}


async def test_worker_staging_commits_a_token_free_ledger_that_verifies_and_linearizes() -> None:
    ledger, worker = InMemoryLineageStore(), Worker()
    handler = make_external_capture_handler("vllm_worker")
    assert isinstance(handler, VLLMWorkerCaptureHandler) and isinstance(handler, ExternalCaptureHandler)

    async def turn(
        call_id: str, items: list[Any], text: str, prompt: list[int], generated: list[int]
    ) -> CaptureContext:
        active = context(None, ledger, call_id, external_staging=True)
        token = set_token_sink(active)
        try:
            await resolve_parent(items)
            body = handler.prepare_request({"messages": items})
            served = completion(text, f"chatcmpl-{call_id}")
            if NG_CAPTURE_FIELD in body:
                worker.complete(body, served, prompt, generated)
            handler.prepare_response(served)
            assert NG_COMMIT_COORDS_FIELD not in served and "prompt_token_ids" not in served["choices"][0]["message"]
            await handler.finalize_response(served)
        finally:
            reset_token_sink(token)
        return active

    first = await turn("c1", [USER], "hello", [1, 2], [3])
    assert first.capture_admission is not None and first.capture_admission.mode == "text" and first.committed
    follow_up = [USER, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    second = await turn("c2", follow_up, "bye", [1, 2, 3, 4], [5, 6])
    assert second.capture_admission is not None and second.capture_admission.mode == "token_in"
    assert second.capture_admission.staging_chain == ["r1/c1"]

    stray = await turn("c3", [USER, {"role": "assistant", "content": "never said"}], "?", [], [])
    assert stray.capture_admission is None  # an unproven continuation of a rollout with rows is poisoned, not a root
    manifest = RolloutManifest.model_validate(await ledger.manifest("r1"))
    assert [(f.model_call_id, f.reason) for f in manifest.failures] == [("c3", UNRESOLVED_PARENT_REASON)]

    selection = select_terminal_call(manifest.records)
    assert selection.terminal_model_call_id == "c2"
    receipt = RolloutReceipt(
        rollout_id="r1", terminal_model_call_id="c2", manifest=manifest.records, terminal_selection="heuristic"
    )
    snapshots = worker.fetch([row.staging_key for row in manifest.records])
    row = verify_and_linearize(receipt, snapshots)
    assert row.token_ids == [1, 2, 3, 4, 5, 6] and row.prompt_len == 2
    assert row.token_mask == [0.0, 0.0, 1.0, 0.0, 1.0, 1.0] and row.model_call_ids == ["c1", "c2"]
    assert resolve_terminal(manifest.records, {"id": "chatcmpl-c2", "output": []}).model_call_id == "c2"

    tampered = snapshots[1].model_copy(update={"weight_version": 4})
    with pytest.raises(ReceiptVerificationError) as error:
        verify_and_linearize(receipt, [snapshots[0], tampered])
    assert error.value.code == "wrong_weight_version"


async def test_a_worker_answer_without_coordinates_poisons_the_call() -> None:
    ledger = InMemoryLineageStore()
    handler = VLLMWorkerCaptureHandler()
    active = context(None, ledger, "c1", external_staging=True)
    token = set_token_sink(active)
    try:
        await resolve_parent([USER])
        assert NG_CAPTURE_FIELD in handler.prepare_request({"messages": [USER]})
        served = completion("hi")
        handler.prepare_response(served)
        await handler.finalize_response(served)
    finally:
        reset_token_sink(token)
    manifest = RolloutManifest.model_validate(await ledger.manifest("r1"))
    assert [f.reason for f in manifest.failures] == [WORKER_MISSING_COMMIT_COORDS_REASON]


def test_the_worker_capture_refuses_lifecycle_misuse_and_reports_sink_failures() -> None:
    failing = MagicMock()
    failing.stage.side_effect = OSError("disk full")
    capture = RolloutTokenCapture(sink=failing, weight_version_fn=lambda: 0)
    call = capture.begin_call(CaptureAdmission(rollout_id="r", model_call_id="c", mode="text"))
    coords = capture.complete_call(call, prompt_token_ids=[1], generated_token_ids=[2], generated_logprobs=[-0.1])
    assert coords.disposition == "capture_failed" and coords.delta_len == 0
    with pytest.raises(CaptureError, match="already completed"):
        capture.fail_call(call, reason="again")
    with pytest.raises(CaptureError):
        capture.begin_call(CaptureAdmission(rollout_id="r", model_call_id="c", mode="text"), prefix_token_ids=[1])


# -- a real model server --------------------------------------------------------------------------------------------

ASSISTANT_MARK, END = 2, 3
ROLE_IDS = {"system": 4, "user": 5, "assistant": ASSISTANT_MARK, "tool": 6}


def encode(text: str) -> list[int]:
    return [100 + ord(char) for char in text]


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def engine_prompt(messages: list[dict[str, Any]]) -> list[int]:
    """A toy chat template: an assistant turn renders exactly as the tokens it was generated as."""
    ids: list[int] = []
    for message in messages:
        ids += [ROLE_IDS[message["role"]], *encode(text_of(message.get("content"))), END]
    return [*ids, ASSISTANT_MARK]


class Engine:
    """vLLM's Chat Completions as far as training needs it: prompt ids, token-id log-probs, or worker staging."""

    def __init__(self) -> None:
        self.calls = 0
        self.worker = Worker()

    def __call__(self, path: str, body: Any) -> tuple[int, Any]:
        self.calls += 1
        text = f"answer {self.calls}"
        generated = [*encode(text), END]
        prompt = engine_prompt(body["messages"])
        reply = completion(text, f"chatcmpl-{self.calls}")
        if NG_CAPTURE_FIELD in body:
            self.worker.complete(body, reply, prompt, generated)
        elif body.get("logprobs"):
            reply["prompt_token_ids"] = prompt
            reply["choices"][0]["logprobs"] = {
                "content": [{"token": f"token_id:{token}", "logprob": -0.25} for token in generated]
            }
        return 200, reply


@pytest.fixture
def engine() -> Any:
    fake = Engine()
    upstream = FakeUpstream(fake).start()
    fake.url = upstream.url
    yield fake
    upstream.stop()


def model_server(engine_url: str, global_config: dict[str, Any]) -> VLLMModel:
    settings = {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py", "name": "policy_model"}
    config = VLLMModelConfig(**settings, base_url=engine_url, model="policy", uses_reasoning_parser=False)
    client = MagicMock(spec=ServerClient)
    client.global_config_dict = global_config
    return VLLMModel(config=config, server_client=client)


def test_calls_through_the_training_capture_path_of_a_running_model_server_are_captured(engine, tmp_path) -> None:
    server = model_server(engine.url, {"token_id_capture": {"enabled": True, "dir": str(tmp_path)}})
    prefix = "/ng-rollout/task-7/training-token-capture"
    with serve_in_thread(server.setup_webserver()) as url, httpx.Client(base_url=url, timeout=60) as client:
        first = client.post(f"{prefix}/v1/responses", json={"input": "hi"})
        assert first.status_code == 200, first.text
        follow_up = [USER, *first.json()["output"], {"role": "user", "content": "again"}]
        second = client.post(f"{prefix}/v1/responses", json={"input": follow_up})
        assert second.status_code == 200, second.text
        assert client.post("/v1/responses", json={"input": "not captured"}).status_code == 200

    store = TokenCaptureStore(tmp_path)
    entries = store.read_entries("task-7")
    assert [e.response_id for e in entries] == [first.json()["id"], second.json()["id"]]
    assert entries[0].prompt_token_ids == engine_prompt([USER])
    assert entries[0].generation_token_ids == [*encode("answer 1"), END]
    assert entries[1].parent_call_id == entries[0].model_call_id
    assert sorted(path.name for path in tmp_path.glob("*.jsonl")) == ["task-7.tokens.jsonl"]

    built = asyncio.run(trajectories_from_source("task-7", store, verified_response=second.json()))
    assert built is not None and not built["mask_sample"], built
    [one, two] = built["rebuilt_response"]["output"]
    assert (
        two["prompt_token_ids"][: len(one["prompt_token_ids"]) + 9]
        == one["prompt_token_ids"] + one["generation_token_ids"]
    )
    assert built["metrics"]["roots"] == 1 and built["metrics"]["delivered_fraction"] == 1.0


async def test_evaluation_and_training_capture_share_the_call_id(engine, tmp_path) -> None:
    settings = {"observability_enabled": True, "model_call_capture_dir": str(tmp_path / "eval")}
    server = model_server(engine.url, {**settings, "token_id_capture": {"enabled": True, "dir": str(tmp_path)}})
    transport = httpx.ASGITransport(app=server.setup_webserver())
    async with httpx.AsyncClient(transport=transport, base_url="http://model", timeout=60) as client:
        reply = await client.post(
            "/ng-rollout/r9/training-token-capture/v1/chat/completions", json={"messages": [USER]}
        )
        assert reply.status_code == 200, reply.text
    await close_session()
    [record] = read_model_call_records(CaptureStore(tmp_path / "eval"), "r9")
    [saved] = TokenCaptureStore(tmp_path).read_entries("r9")
    assert record.model_call_id == saved.model_call_id and saved.response_id == "chatcmpl-1"


async def test_external_staging_through_the_model_server_leaves_a_verifiable_ledger(
    engine, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("NEMO_GYM_TOKEN_CAPTURE_CONTROL_TOKEN", "framework-secret")
    block = {
        "enabled": True,
        "external_staging": True,
        "rebuild_response": False,
        "lineage_store": "nemo_gym.token_id_capture.lineage:FileLineageStore",
        "lineage_store_kwargs": {"root": str(tmp_path)},
    }
    server = model_server(engine.url, {"token_id_capture": block})
    transport = httpx.ASGITransport(app=server.setup_webserver())
    prefix = "/ng-rollout/r5/training-token-capture"
    async with httpx.AsyncClient(transport=transport, base_url="http://model", timeout=60) as client:
        first = await client.post(f"{prefix}/v1/responses", json={"input": "hi"})
        assert first.status_code == 200, first.text
        assert "prompt_token_ids" not in first.text and NG_COMMIT_COORDS_FIELD not in first.text
        follow_up = [USER, *first.json()["output"], {"role": "user", "content": "again"}]
        second = await client.post(f"{prefix}/v1/responses", json={"input": follow_up})
        assert second.status_code == 200, second.text
        control = "/training-token-capture/control/rollouts/r5/manifest"
        assert (await client.get(control)).status_code == 401
        wrong = await client.get(control, headers={"Authorization": "Bearer guessed"})
        assert wrong.status_code == 401
        served_manifest = await client.get(control, headers={"Authorization": "Bearer framework-secret"})
        assert [row["response_id"] for row in served_manifest.json()["records"]] == [
            first.json()["id"],
            second.json()["id"],
        ]
    await close_session()

    manifest = RolloutManifest.model_validate(await FileLineageStore(tmp_path).manifest("r5"))
    assert manifest.failures == [] and [row.response_id for row in manifest.records] == [
        first.json()["id"],
        second.json()["id"],
    ]
    terminal = resolve_terminal(manifest.records, second.json())
    assert terminal.model_call_id == manifest.records[1].model_call_id
    receipt = RolloutReceipt(
        rollout_id="r5", terminal_model_call_id=terminal.model_call_id, manifest=manifest.records,
        terminal_selection="response_id",
    )  # fmt: skip
    row = verify_and_linearize(receipt, engine.worker.fetch([record.staging_key for record in manifest.records]))
    assert row.token_ids[-9:] == [*encode("answer 2"), END] and UNCOMMITTED_CALL_REASON not in str(manifest)
