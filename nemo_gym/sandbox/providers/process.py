"""What the built-in providers share: running one process with a deadline, config sections, the readiness probe.

``run_process`` sends output to anonymous temporary files, not pipes, and waits only for the process itself: a
command that leaves a background job holding its stdout (``server &``, ``apptainer instance start``) would otherwise
keep a pipe open and the call waiting until that job ends. On a deadline the whole process group is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from nemo_gym.sandbox.providers.base import SandboxCreateVerificationError, SandboxExecResult

__all__ = [
    "EXEC_LIMITS",
    "ProbeConfig",
    "ProcessOutput",
    "check_limits",
    "coerce_config",
    "kill_group",
    "run_process",
    "wait_until_ready",
]

C = TypeVar("C")

DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024 * 1024
"""How much of each stream is kept; the rest is dropped with a note, so one runaway command cannot fill memory."""


@dataclass(frozen=True)
class ProcessOutput:
    """One finished process: its exit status (``-N`` when signal ``N`` ended it) and its decoded output."""

    return_code: int
    stdout: str
    stderr: str
    pid: int


def kill_group(pgid: int) -> None:
    """SIGKILL a process group that may already be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _read(stream: IO[bytes], limit: int) -> str:
    stream.seek(0)
    data = stream.read(limit + 1)
    text = data[:limit].decode(errors="replace")
    return text + "\n[output truncated]\n" if len(data) > limit else text


async def run_process(
    argv: list[str],
    *,
    timeout_s: float | None,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    on_start: Callable[[int], None] | None = None,
) -> ProcessOutput:
    """Run ``argv`` in a new session; raise ``TimeoutError`` (the group killed) when ``timeout_s`` passes.

    ``on_start`` receives the process id (also its group id) as soon as it exists, for callers that must be able to
    kill what the command leaves behind later.
    """
    with (
        tempfile.TemporaryFile() as stdin_file,
        tempfile.TemporaryFile() as stdout_file,
        tempfile.TemporaryFile() as stderr_file,
    ):
        if stdin is not None:
            stdin_file.write(stdin)
            stdin_file.seek(0)
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=stdin_file if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=stdout_file,
            stderr=stderr_file,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
        if on_start is not None:
            on_start(process.pid)
        try:
            await asyncio.wait_for(process.wait(), timeout=timeout_s)
        except (TimeoutError, asyncio.CancelledError) as stop:
            kill_group(process.pid)
            with contextlib.suppress(Exception):
                await asyncio.shield(process.wait())
            if isinstance(stop, asyncio.CancelledError):
                raise
            raise TimeoutError(f"{os.path.basename(argv[0])} timed out after {timeout_s:g}s") from None
        return ProcessOutput(
            return_code=process.returncode if process.returncode is not None else -1,
            stdout=_read(stdout_file, max_output_bytes),
            stderr=_read(stderr_file, max_output_bytes),
            pid=process.pid,
        )


def coerce_config(value: C | Mapping[str, Any] | None, config_class: type[C]) -> C:
    """A config section from YAML (a mapping), an instance, or nothing (the defaults)."""
    if isinstance(value, config_class):
        return value
    options = {} if value is None else value
    if not isinstance(options, Mapping):
        raise TypeError(
            f"{config_class.__name__}: expected a mapping of options (or an instance), got {type(options).__name__}"
        )
    return config_class(**options)


_BOUNDS: dict[str, Callable[[float], bool]] = {
    "> 0": lambda value: value > 0,
    ">= 0": lambda value: value >= 0,
    ">= 1": lambda value: value >= 1,
}


def check_limits(section: str, config: object, rules: Mapping[str, str]) -> None:
    """Refuse the first field of ``config`` outside its bound (``rules`` maps field name to a ``_BOUNDS`` key);
    ``None`` means "not set" and always passes."""
    for name, bound in rules.items():
        value = getattr(config, name)
        if value is not None and not _BOUNDS[bound](value):
            raise ValueError(f"sandbox config {section}.{name} is {value!r}; set it {bound}")


EXEC_LIMITS = {"default_timeout_s": "> 0", "concurrency": ">= 1"}
"""The ``exec:`` bounds every container provider shares."""


@dataclass(frozen=True)
class ProbeConfig:
    """The check run right after create: ``command`` must exit 0 (and print ``expected_stdout``) ``stable_count``
    times in a row. Without ``deadline_s`` one failure is final; with it, failures are retried until the deadline.
    ``command: null`` skips the check."""

    command: str | None = "printf sandbox-ready"
    expected_stdout: str | None = "sandbox-ready"
    timeout_s: int = 30
    deadline_s: float | None = None
    stable_count: int = 1
    stable_delay_s: float = 0.0

    def __post_init__(self) -> None:
        rules = {"deadline_s": "> 0", "stable_count": ">= 1", "stable_delay_s": ">= 0"}
        if self.command is not None:  # without a command nothing runs, so its timeout does not matter
            rules = {"timeout_s": "> 0", **rules}
        check_limits("probe", self, rules)


async def wait_until_ready(
    probe: ProbeConfig,
    run: Callable[[str, float], Awaitable[SandboxExecResult]],
    sandbox_id: str,
    error_class: type[SandboxCreateVerificationError] = SandboxCreateVerificationError,
) -> None:
    """Run ``probe`` through ``run(command, timeout_s)`` until it passes; raise ``error_class`` when it will not."""
    if probe.command is None:
        return
    loop = asyncio.get_running_loop()
    deadline = None if probe.deadline_s is None else loop.time() + probe.deadline_s
    passes = 0
    while True:
        result = await run(probe.command, probe.timeout_s)
        if result.return_code == 0 and (
            probe.expected_stdout is None or probe.expected_stdout in (result.stdout or "")
        ):
            passes += 1
            if passes >= probe.stable_count:
                return
        else:
            passes = 0
            detail = f"return_code={result.return_code}, stderr={(result.stderr or '').strip()!r}"
            if deadline is None:
                raise error_class(f"sandbox {sandbox_id!r} failed its readiness probe: {detail}")
            if loop.time() >= deadline:
                raise error_class(
                    f"sandbox {sandbox_id!r} did not pass its readiness probe within {probe.deadline_s:g}s: {detail}"
                )
        if probe.stable_delay_s > 0:
            await asyncio.sleep(probe.stable_delay_s)
