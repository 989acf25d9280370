"""Running materialized rows through agents: a bounded worker pool, streaming output, failures kept apart.

Guarantees:

* at most ``concurrency`` rollouts are in flight, rows are read lazily from disk, so memory stays flat however large
  the input;
* every finished rollout is written (and flushed) as soon as it finishes: ``<stem>.jsonl`` for scored rollouts,
  ``<stem>_failures.jsonl`` for failures (HTTP errors, timeouts, unreachable servers, verifier/judge failures), each
  with ``_ng_failure_class`` and ``_ng_failure_message`` (and the agent's own answer when the agent reported the
  failure). A failure never aborts the run and never counts as a reward;
* ``resume`` skips rollouts already in the output, retries failed ones until ``max_attempts`` is reached (never one
  whose failure the agent marked ``_ng_failure_terminal``), and refuses to continue when the materialized inputs
  differ from the run it continues; a (task, rollout) found twice in the output is kept once (the file rewritten
  atomically), so the metrics count it once. A fresh run replaces the output, failures and metrics files: whether
  it may is decided before, by ``rollouts/claim.py``;
* an agent with replicas (a Ray launch) gets each row on the least busy replica that is up (``rollouts/replicas.py``);
* a failure pointing at a server that cannot be reached is charged only if that server answers a probe; a server
  found down pauses the run (a replica: its rows go to the other replicas instead), and the rollouts it failed run again once it is back (``rollouts/breaker.py``), or the
  run stops with :class:`~nemo_gym.rollouts.breaker.ServersDownError` and leaves them untried for ``--resume``;
* an answer marked ``_ng_no_persist`` (an infrastructure failure such as a killed sandbox) is written nowhere, so
  resume runs it again without counting an attempt;
* with ``capture_dirs`` (model-call capture on), each rollout gets its captured calls and ``ng_trajectory``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from tqdm import tqdm

from nemo_gym.config.datasets import AGENT_REF_KEY
from nemo_gym.failure_kinds import kind_of_class, stage_of_class
from nemo_gym.jsonl import (
    JsonlWriter,
    drop_repeated_rows,
    iter_jsonl,
    iter_jsonl_lines,
    keyed_rows,
    repair_tail,
    write_json_atomic,
)
from nemo_gym.observability.capture import CAPTURE_KEY, OBSERVATIONS_KEY, TRAJECTORY_KEY
from nemo_gym.rollouts.breaker import Breakers, Server
from nemo_gym.rollouts.config import DEFAULT_CONCURRENCY, DEFAULT_SERVER_DOWN_DEADLINE_S
from nemo_gym.rollouts.failure_rules import is_terminal_failure, migrate_invalid_judge_main_rows
from nemo_gym.rollouts.materialize import (
    ATTEMPT_INDEX_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
    Materialized,
    resume_refused,
    rollout_key,
)
from nemo_gym.rollouts.outputs import aggregate_metrics_path, damaged_line_hint
from nemo_gym.rollouts.outputs import failures_path as failures_path  # re-exported: where callers have found it
from nemo_gym.rollouts.outputs import manifest_path as manifest_path
from nemo_gym.rollouts.outputs import recorded_fingerprint as recorded_fingerprint
from nemo_gym.rollouts.pool import run_bounded
from nemo_gym.rollouts.replicas import Router
from nemo_gym.rollouts.routing import Routes
from nemo_gym.row_fields import (
    ENVIRONMENT_SERVER_KEY,
    FAILURE_CLASS_KEY,
    FAILURE_HTTP_STATUS_KEY,
    FAILURE_KIND_KEY,
    FAILURE_MESSAGE_KEY,
    FAILURE_RESPONSE_BODY_KEY,
    FAILURE_STAGE_KEY,
    FAILURE_TERMINAL_KEY,
    NO_PERSIST_KEY,
    ROLLOUT_SECONDS_KEY,
    ROLLOUT_STARTED_AT_KEY,
)
from nemo_gym.transport import http_client
from nemo_gym.transport.http_client import ServerTimeoutError, TransportConfig, TransportError

MAX_ATTEMPTS_ENV_VAR = "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"
DEFAULT_MAX_ATTEMPTS = 3
MAX_RESTART_RERUNS = 3
"""Times one row runs again, uncharged, because a server was restarted under it (``rollouts/breaker.py``); a row
that fails every time a server has just restarted is charged after that."""

RunSender = Callable[[str, dict[str, Any]], Awaitable[tuple[int, bytes]]]
"""Posts a row to the ``/run`` of the agent it names: ``(agent, row) -> (status, body)``. Transport failures raise
:class:`~nemo_gym.transport.http_client.TransportError` (``ServerTimeoutError`` for a deadline)."""


def default_max_attempts() -> int:
    value = os.environ.get(MAX_ATTEMPTS_ENV_VAR, "")
    return int(value) if value.isdigit() and int(value) >= 1 else DEFAULT_MAX_ATTEMPTS


@dataclass
class CollectionOptions:
    output_path: Path
    concurrency: int = DEFAULT_CONCURRENCY
    resume: bool = False
    max_attempts: int = field(default_factory=default_max_attempts)
    rollout_timeout_s: float = 3600.0
    show_progress: bool = True
    """A progress bar on stderr, only when stderr is a terminal (in a log its redraws are noise)."""
    capture_dirs: list[Path] = field(default_factory=list)
    """Where model servers capture model calls (``model_call_capture_dir`` when ``observability_enabled``)."""
    servers: list[Server] = field(default_factory=list)
    """The servers of the run, so a failure's server is named and probed by its config name (``rollouts/breaker.py``);
    a server missing here is still probed, by the address its failure names."""
    retry_terminal_timeouts: bool = False
    """On resume, retry terminal timeouts and repairable environment faults (``failure_rules.is_terminal_failure``)."""
    retry_invalid_judge_responses: bool = False
    """On resume, move rollouts with an unreadable judge answer to the failures file first, so they run again."""
    server_down_deadline_s: float = DEFAULT_SERVER_DOWN_DEADLINE_S
    """How long a down server may stay down before the run stops (``--server-down-deadline``)."""
    routes: Routes | None = None
    """Environment servers in front of agents (``rollouts/routing.py``); None: every row straight to its agent."""
    stop_starting_at: float | None = None
    """``time.monotonic()`` after which no new rollout starts; those in flight finish (a load test's timed step)."""
    stamp_times: bool = False
    """Stamp every result and failure record with when it was sent and how long it took (``row_fields``)."""


@dataclass
class CollectionSummary:
    output_path: Path
    failures_path: Path
    succeeded: int = 0
    failed: int = 0
    skipped_done: int = 0
    skipped_exhausted: int = 0
    failure_classes: Counter = field(default_factory=Counter)
    """Failures by the collector's class (the detail: which hop failed)."""
    failure_kinds: Counter = field(default_factory=Counter)
    """Failures by their kind from ``nemo_gym.failure_kinds``: what the command, the metrics and the viewer count."""
    not_persisted: int = 0
    """Failures the agent marked ``_ng_no_persist``: counted in ``failed``, written nowhere, run again on resume."""
    elapsed_s: float = 0.0
    served_by: Counter = field(default_factory=Counter)
    """Scored rollouts per replica of a replicated agent (``rollouts/replicas.py``); empty without replicas."""

    @property
    def remaining_failures(self) -> int:
        return self.failed


@dataclass
class _ResumeState:
    done: set[tuple[int, int]] = field(default_factory=set)
    attempts: Counter = field(default_factory=Counter)
    terminal: set[tuple[int, int]] = field(default_factory=set)


class RolloutCollector:
    """Runs the rows of a materialized inputs file against agents' ``/run`` (``agent_urls``: name -> base URL).

    ``send`` replaces the direct POST to ``agent_urls`` (the trainers' face passes its ``ServerClient``'s).
    """

    def __init__(
        self,
        materialized: Materialized,
        agent_urls: dict[str, str],
        options: CollectionOptions,
        send: RunSender | None = None,
    ) -> None:
        self.materialized = materialized
        self.agent_urls = agent_urls
        self.options = options
        self._send = send
        self.summary = CollectionSummary(options.output_path, failures_path(options.output_path))
        self._reward_sums: dict[str, list[float]] = {}
        self._transport = TransportConfig(total_timeout_s=options.rollout_timeout_s, max_attempts=1)

    # -- state ---------------------------------------------------------------------------------------------------

    def _prepare_files(self) -> _ResumeState:
        output, failures, manifest = (
            self.options.output_path,
            self.summary.failures_path,
            manifest_path(self.options.output_path),
        )
        state = _ResumeState()
        recorded = recorded_fingerprint(output) if self.options.resume else None
        if recorded is not None:
            if recorded != self.materialized.fingerprint:
                raise resume_refused(output)
            with damaged_line_hint():
                self._read_back(state)
        else:
            for path in (output, failures, aggregate_metrics_path(output)):
                path.unlink(missing_ok=True)
            write_json_atomic(manifest, {"fingerprint": self.materialized.fingerprint, "started_at": time.time()})
        return state

    def _read_back(self, state: _ResumeState) -> None:
        """The earlier results ``--resume`` continues: the rollouts done, and the attempts and terminal failures."""
        output, failures = self.options.output_path, self.summary.failures_path
        for path in (output, failures):
            if repair_tail(path):
                tqdm.write(f"note: dropped a partial last line of {path} (a write was interrupted)")
        if self.options.retry_invalid_judge_responses and (moved := migrate_invalid_judge_main_rows(output)):
            tqdm.write(f"note: {moved} rollout(s) with an invalid judge response moved to {failures} to run again")
        if output.exists():
            state.done, repeated = drop_repeated_rows(output, rollout_key)
            if repeated:
                tqdm.write(
                    f"note: dropped {repeated} duplicate rollout(s) from {output}: the same task and rollout "
                    "were written twice (two runs at once); the first of each is kept"
                )
        if failures.exists():
            for _, _, key, row in keyed_rows(failures, rollout_key):
                state.attempts[key] += 1
                if is_terminal_failure(row, retry_terminal_timeouts=self.options.retry_terminal_timeouts):
                    state.terminal.add(key)

    def _pending(self, state: _ResumeState) -> Iterator[_Pending]:
        keep_row = self._send is not None or bool(self.options.capture_dirs)  # the row is needed whole anyway
        for _, line, row in iter_jsonl_lines(self.materialized.path):
            if self.options.stop_starting_at is not None and time.monotonic() >= self.options.stop_starting_at:
                return
            key = rollout_key(row)
            if key in state.done:
                self.summary.skipped_done += 1
                continue
            if key in state.terminal or state.attempts[key] >= self.options.max_attempts:
                self.summary.skipped_exhausted += 1
                continue
            if state.attempts[key]:
                row[ATTEMPT_INDEX_KEY] = state.attempts[key]
                body = http_client.dumps(row)  # exact-size bytes: a rollout holds its body while in flight
            else:  # the line is the row as /run gets it (materialize wrote it with orjson, as the transport would)
                body = line.rstrip(b"\n")
            yield _Pending(body, {k: row[k] for k in _ROW_KEYS if k in row}, row if keep_row else None)

    # -- running -------------------------------------------------------------------------------------------------

    async def run(self) -> CollectionSummary:
        state = self._prepare_files()
        exhausted = {k for k, n in state.attempts.items() if n >= self.options.max_attempts} | state.terminal
        total = self.materialized.num_rows - len(state.done) - len(exhausted - state.done)
        started = time.monotonic()
        pending = self._pending(state)
        self._bar = tqdm(
            total=total, desc="Collecting rollouts", unit="rollout",
            disable=None if self.options.show_progress else True, dynamic_ncols=True, mininterval=0.5,
        )  # fmt: skip
        self._output = JsonlWriter(self.options.output_path)
        self._failures = JsonlWriter(self.summary.failures_path)
        self._breakers = Breakers(self.options.servers, self.options.server_down_deadline_s, say=self._say)
        self._router = Router(
            self.agent_urls, self.options.servers, self._breakers.known_down, self._breakers.down_nodes
        )
        self.summary.served_by = self._router.served
        try:
            await run_bounded(self._run_one, pending, self.options.concurrency)
        finally:
            await self._breakers.aclose()
            self._output.close()
            self._failures.close()
            self._bar.close()
            self.summary.elapsed_s = time.monotonic() - started
            compact_failures(self.options.output_path)
        return self.summary

    async def _run_one(self, pending: _Pending) -> None:
        """Run one row to its end: scored, or failed and charged. A failure of a server that turns out to be down is
        not charged: the row waits (held by this worker) until the server is back and runs again."""
        row = pending.keys
        agent = row[AGENT_REF_KEY]["name"]
        front = self.options.routes.for_agent(agent) if self.options.routes and self._send is None else None
        if (
            front is None
            and self.agent_urls.get(agent) is None
            and self._send is None
            and not self._router.replicated(agent)
        ):
            self._fail(row, RolloutFailure("unknown_agent", f"agent {agent!r} is not running"))
            return
        restart_reruns, started = 0, time.time()
        while True:
            await self._breakers.wait_until_closed()
            attempt_started = time.time()
            if front is not None:  # through the environment server in front of the agent, as the row is
                result = await judge_rollout(
                    _post_run(front[1], front[0], self._transport, data=pending.body, headers=_JSON_BODY)
                )
                result = _stamped(result, front[0])
            else:
                target, url = self._router.pick(agent)  # a replica that is up, when the agent has replicas
                result = await self._attempt(agent, target, url, pending)
                self._router.release(target, scored=not isinstance(result, RolloutFailure))
            if not isinstance(result, RolloutFailure):
                break
            server = self._breakers.server_of(result.server) if result.server else None
            if server is not None and await self._breakers.is_down(server, since=attempt_started):
                continue
            if restart_reruns < MAX_RESTART_RERUNS and await self._breakers.restarted_since(attempt_started):
                restart_reruns += 1  # a server restarted under it (its session went with the old process)
                continue
            self._fail(row, result, started)
            return
        self._breakers.record_success()
        if self.options.stamp_times:
            result[ROLLOUT_STARTED_AT_KEY], result[ROLLOUT_SECONDS_KEY] = started, time.time() - started
        result[TASK_INDEX_KEY] = row[TASK_INDEX_KEY]
        result[ROLLOUT_INDEX_KEY] = row[ROLLOUT_INDEX_KEY]
        result[AGENT_REF_KEY] = row[AGENT_REF_KEY]
        if ATTEMPT_INDEX_KEY in row:
            result[ATTEMPT_INDEX_KEY] = row[ATTEMPT_INDEX_KEY]
        if self.options.capture_dirs or _has_observations(result):
            add_observations(pending.row(), result, self.options.capture_dirs)
        self._output.write(result)
        self.summary.succeeded += 1
        sums = self._reward_sums.setdefault(agent, [0.0, 0])
        sums[0] += float(result["reward"])
        sums[1] += 1
        self._advance()

    async def _attempt(
        self, agent: str, target: str, url: str | None, pending: _Pending
    ) -> dict[str, Any] | RolloutFailure:
        """One ``/run`` of the row on ``target``: the agent, or the replica of it the router picked."""
        if self.options.capture_dirs:
            from nemo_gym.observability.trajectory import clear_model_call_captures  # the models: only with capture

            clear_model_call_captures([pending.row()], self.options.capture_dirs)
        if self._send is not None:
            return await judge_rollout(self._send(agent, pending.row()))
        assert url is not None
        return await judge_rollout(_post_run(url, target, self._transport, data=pending.body, headers=_JSON_BODY))

    def _say(self, line: str) -> None:
        """One line for the user, on stderr, above the progress bar when there is one."""
        tqdm.write(line, file=sys.stderr)
        sys.stderr.flush()

    def _fail(self, row: dict[str, Any], failure: RolloutFailure, started: float | None = None) -> None:
        if failure.persist:
            record = failure.answer_fields() | {
                TASK_INDEX_KEY: row[TASK_INDEX_KEY],
                ROLLOUT_INDEX_KEY: row[ROLLOUT_INDEX_KEY],
                ATTEMPT_INDEX_KEY: row.get(ATTEMPT_INDEX_KEY, 0),
                AGENT_REF_KEY: row[AGENT_REF_KEY],
                FAILURE_CLASS_KEY: failure.failure_class,
                FAILURE_MESSAGE_KEY: failure.message,
                FAILURE_KIND_KEY: failure.kind,
                **failure.http_fields(),
            }
            if failure.stage is not None:
                record[FAILURE_STAGE_KEY] = failure.stage
            if self.options.stamp_times and started is not None:
                record[ROLLOUT_STARTED_AT_KEY], record[ROLLOUT_SECONDS_KEY] = started, time.time() - started
            self._failures.write(record | ({FAILURE_TERMINAL_KEY: True} if failure.terminal else {}))
        else:
            self.summary.not_persisted += 1
        self.summary.failed += 1
        self.summary.failure_classes[failure.failure_class] += 1
        self.summary.failure_kinds[failure.kind] += 1
        self._advance()

    def _advance(self) -> None:
        self._bar.update(1)
        if self._bar.disable:
            return
        postfix: dict[str, object] = {"failed": self.summary.failed}
        for agent, (total, count) in self._reward_sums.items():
            postfix[f"reward[{agent}]"] = f"{total / count:.3f}"
        self._bar.set_postfix(postfix, refresh=False)


def _stamped(result: dict[str, Any] | RolloutFailure, server: str) -> dict[str, Any] | RolloutFailure:
    """``result`` marked with the environment server it went through."""
    if isinstance(result, RolloutFailure):
        return dataclasses.replace(result, answer=(result.answer or {}) | {ENVIRONMENT_SERVER_KEY: server})
    result[ENVIRONMENT_SERVER_KEY] = server
    return result


_ROW_KEYS = (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY, AGENT_REF_KEY, ATTEMPT_INDEX_KEY)
_JSON_BODY = {"Content-Type": "application/json"}


@dataclass(slots=True)
class _Pending:
    """A rollout waiting for its turn: the row as the JSON bytes ``/run`` gets, and the row's keys the collector
    writes into its results. With thousands in flight, the parsed row (~3 KB) and its body serialised again (orjson
    keeps a 4 KB buffer) were most of the collector's memory."""

    body: bytes
    keys: dict[str, Any]
    parsed: dict[str, Any] | None = None
    """The row itself, kept only where every rollout needs it (model-call capture, a caller's own sender)."""

    def row(self) -> dict[str, Any]:
        """The whole row (parsed again unless kept: for an agent's observations)."""
        if self.parsed is not None:
            return self.parsed
        row: dict[str, Any] = orjson.loads(self.body)
        return row


@dataclass(frozen=True)
class RolloutFailure:
    """Why a rollout has no reward: a short class (``timeout``, ``verify_failed``, ...) and the detail."""

    failure_class: str
    message: str
    terminal: bool = False
    """The agent said retrying cannot help (``_ng_failure_terminal``): resume does not run it again."""
    persist: bool = True
    """False when the agent said ``_ng_no_persist``: the failure is written nowhere and resume runs it again."""
    answer: dict[str, Any] | None = None
    """The agent's own answer when it reported the failure itself (its ``error``, ``response``, ...), kept in the
    failure record as NeMo Gym keeps it."""
    server: str = ""
    """The server the failure points at, as the transport names it (``server 'policy_model' (127.0.0.1:8000)``), when
    it could not be reached or did not answer in time: the agent itself, or the upstream hop of the agent's 502. The
    collector's breakers (``rollouts/breaker.py``) ask that server before charging the rollout an attempt."""
    http_status: int | None = None
    """The status of the agent's answer when it was not a 200 (NeMo Gym 0.7 records it; the message is its body)."""

    @property
    def kind(self) -> str:
        """The failure's kind (``nemo_gym.failure_kinds``): the one its reporter named, else its class's."""
        named = (self.answer or {}).get("failure_kind")
        return named if isinstance(named, str) and named else kind_of_class(self.failure_class)

    @property
    def stage(self) -> str | None:
        """Where in the episode it failed, when its reporter or its class says so."""
        named = (self.answer or {}).get(FAILURE_STAGE_KEY)
        return named if isinstance(named, str) and named else stage_of_class(self.failure_class)

    def http_fields(self) -> dict[str, Any]:
        """The agent's HTTP answer, under NeMo Gym 0.7's keys, when it answered with an error status."""
        if self.http_status is None:
            return {}
        return {FAILURE_HTTP_STATUS_KEY: self.http_status, FAILURE_RESPONSE_BODY_KEY: self.message}

    def answer_fields(self) -> dict[str, Any]:
        """The agent's answer without its routing flags (this failure's own ``terminal`` / ``persist`` say them)."""
        routing = (FAILURE_TERMINAL_KEY, NO_PERSIST_KEY)
        return {k: v for k, v in (self.answer or {}).items() if k not in routing}

    def as_result(self) -> dict[str, Any]:
        result = self.answer_fields() | {FAILURE_CLASS_KEY: self.failure_class, FAILURE_MESSAGE_KEY: self.message}
        result.update(self.http_fields())
        if self.terminal:
            result[FAILURE_TERMINAL_KEY] = True
        if not self.persist:
            result[NO_PERSIST_KEY] = True
        return result


def add_observations(row: dict[str, Any], result: dict[str, Any], capture_dirs: list[Path]) -> None:
    """The rollout's captured model calls (with ``capture_dirs``) and, when there is any evidence, ``ng_trajectory``.

    Without capture and without observations from the agent this is two dictionary lookups.
    """
    from nemo_gym.observability.trajectory import attach_trajectory_record, merge_model_call_capture_into_record

    if capture_dirs:
        merge_model_call_capture_into_record(result, capture_dirs)
    if _has_observations(result):
        attach_trajectory_record(row, result)


def _has_observations(result: dict[str, Any]) -> bool:
    return CAPTURE_KEY in result or OBSERVATIONS_KEY in result or TRAJECTORY_KEY in result


async def run_rollout(
    url: str,
    agent: str,
    row: dict[str, Any],
    transport: TransportConfig | None = None,
    nested: bool = False,
) -> dict[str, Any] | RolloutFailure:
    """Send one row to an agent's ``/run`` (one attempt) and judge the answer: the failure rules of every collector.

    The result is the agent's answer when it is a 200 with a numeric ``reward`` and no ``_ng_failure_class``.
    Anything else is a :class:`RolloutFailure`, never an exception: ``timeout``, ``connection_error``, the class
    :func:`classify_http_failure` gives the status, ``invalid_response``, or the class the agent itself reported
    (a judge that could not be reached is a failure, not a reward of 0), ``terminal`` when it set
    ``_ng_failure_terminal``. An answer with ``_ng_no_persist`` is a failure that is not to be written, whatever
    else it holds (class ``no_persist`` unless it names one).
    """

    return await judge_rollout(_post_run(url, agent, transport, json=row, nested=nested))


async def _post_run(url: str, agent: str, transport: TransportConfig | None, **body: Any) -> tuple[int, bytes]:
    """One ``POST /run`` (``body``: ``json=`` a row, or ``data=`` its JSON bytes with their content type)."""
    response = await http_client.request(
        "POST", f"{url}/run", server_name=agent, url_path="/run", config=transport, retry=False, **body
    )
    return response.status, await response.read()


async def judge_rollout(answer: Awaitable[tuple[int, bytes]]) -> dict[str, Any] | RolloutFailure:
    """Await one ``/run`` answer (``(status, body)``) and judge it by :func:`run_rollout`'s rules."""
    try:
        status, body = await answer
    except ServerTimeoutError as e:
        return RolloutFailure("timeout", str(e), server=e.server)
    except TransportError as e:
        return RolloutFailure("connection_error", str(e), server=str(getattr(e, "server", "")))
    if status != 200:
        message = body[:2000].decode("utf-8", "replace")
        return RolloutFailure(
            classify_http_failure(status, body), message, server=unreachable_upstream(status, body), http_status=status
        )
    try:
        result = orjson.loads(body)
    except orjson.JSONDecodeError:
        return RolloutFailure("invalid_response", "the agent's /run answer is not JSON")
    if isinstance(result, dict) and result.get(NO_PERSIST_KEY):
        failure_class = str(result.get(FAILURE_CLASS_KEY) or "no_persist")
        return RolloutFailure(failure_class, str(result.get(FAILURE_MESSAGE_KEY, "")), persist=False, answer=result)
    if isinstance(result, dict) and result.get(FAILURE_CLASS_KEY):  # with a reward (a judge failure) or without
        terminal = bool(result.get(FAILURE_TERMINAL_KEY))
        message = str(result.get(FAILURE_MESSAGE_KEY, ""))
        return RolloutFailure(str(result[FAILURE_CLASS_KEY]), message, terminal, answer=result)
    if not isinstance(result, dict) or not isinstance(result.get("reward"), (int, float)):
        return RolloutFailure("invalid_response", "the agent's /run answer has no numeric reward")
    return result


def classify_http_failure(status: int, body: bytes) -> str:
    """A short failure class from an agent's error answer: which hop failed, not just the status.

    ``verify_failed``, ``seed_session_failed``, ``model_failed`` (``…_timeout`` when that hop timed out) for a
    failing server behind the agent; ``invalid_row`` for a 422; ``agent_error`` for a crash in the agent itself.
    """
    try:
        detail = orjson.loads(body)
    except orjson.JSONDecodeError:
        detail = {}
    if status == 422:
        return "invalid_row"
    path = detail.get("upstream_path") if isinstance(detail, dict) else None
    if status == 502 and isinstance(path, str):
        hop = "model" if path.startswith("/v1/") else path.strip("/").split("/")[-1] or "upstream"
        return f"{hop}_{'timeout' if detail.get('upstream_timeout') else 'failed'}"
    return "agent_error" if status >= 500 else f"http_{status}"


def unreachable_upstream(status: int, body: bytes) -> str:
    """The upstream server an agent's 502 names when it could not reach it or got no answer in time, else ""."""
    if status != 502:
        return ""
    try:
        detail = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    if not isinstance(detail, dict) or not isinstance(detail.get("upstream_server"), str):
        return ""
    unanswered = detail.get("upstream_status") is None or detail.get("upstream_timeout")
    return detail["upstream_server"] if unanswered else ""


def compact_failures(output_path: Path) -> None:
    """Drop failure records of rollouts that have since succeeded, so the sidecar lists only what is still missing.

    Every failed attempt of an unfinished rollout is kept: resume counts them against the attempt cap.
    """
    failures = failures_path(output_path)
    if not failures.exists():
        return
    if failures.stat().st_size == 0:
        failures.unlink()
        return
    done = {rollout_key(row) for _, row in iter_jsonl(output_path)} if output_path.exists() else set()
    kept = [row for _, row in iter_jsonl(failures) if rollout_key(row) not in done]
    if not kept:
        failures.unlink()
        return
    temporary = failures.with_name(f".{failures.name}.tmp")
    with JsonlWriter(temporary, append=False) as writer:
        for row in kept:
            writer.write(row)
    temporary.replace(failures)
