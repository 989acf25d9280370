"""Grading a Python solution against unit tests: code extraction, output comparison and result codes.

Result codes (one per test, and one for the whole submission, which is the first test's code that is not
``passed``):

``passed`` the output matched; ``wrong_answer`` it ran but printed something else; ``runtime_error`` an uncaught
exception, a non-zero exit or a crash; ``syntax_error`` the code does not compile; ``timeout`` the CPU or wall-clock
limit was hit; ``memory_limit`` the memory limit was hit; ``output_limit`` it wrote more than the output limit;
``sandbox_violation`` it tried something the sandbox forbids (processes, sockets, files outside its directory);
``sandbox_error`` the sandbox itself failed (an infrastructure problem, not the model's); ``no_code`` the reply has no
closed Python code block; ``invalid_tests`` the row's tests are unusable.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from nemo_gym.verifiers.code_blocks import last_fenced_block
from resources_servers.code_gen.sandbox import SandboxLimits, SandboxPolicy, run_python

ResultCode = Literal[
    "passed", "wrong_answer", "runtime_error", "syntax_error", "timeout", "memory_limit", "output_limit",
    "sandbox_violation", "sandbox_error", "no_code", "invalid_tests",
]  # fmt: skip

PYTHON_TAGS = ("python", "python3", "py")
_SNIPPET_CHARS = 300
_STDERR_CHARS = 1000


def extract_code(text: str) -> str | None:
    """The last closed ```python block (or untagged block) of the reply; None when there is none or it is blank."""
    code = last_fenced_block(text, PYTHON_TAGS)
    return code if code and code.strip() else None


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines()]


def _tokens_match(actual: str, expected: str) -> bool:
    """Same tokens, where numbers compare by value ("1.50" equals "1.5", "2" equals "2.0")."""
    left, right = actual.split(), expected.split()
    if len(left) != len(right):
        return False
    for a, b in zip(left, right, strict=True):
        if a == b:
            continue
        try:
            if not (Decimal(a).is_finite() and Decimal(a) == Decimal(b)):
                return False
        except InvalidOperation:
            return False
    return True


def outputs_match(actual: str, expected: str) -> bool:
    """Line by line after stripping each line and the whole text; a line matches exactly or token by token."""
    actual_lines, expected_lines = _lines(actual), _lines(expected)
    if len(actual_lines) != len(expected_lines):
        return False
    return all(a == e or _tokens_match(a, e) for a, e in zip(actual_lines, expected_lines, strict=True))


def json_outputs_match(actual: str, expected: str) -> bool:
    """Call-based tests: the printed return value and the expected value are equal as JSON."""
    try:
        return json.loads(actual) == json.loads(expected)
    except (json.JSONDecodeError, TypeError):
        return False


@dataclass
class TestOutcome:
    status: ResultCode
    time_s: float


@dataclass
class Grade:
    result: ResultCode
    tests: list[TestOutcome] = field(default_factory=list)
    failure: dict[str, Any] | None = None
    """The first failing test: its index, code, and the heads of its input, expected and actual output."""
    time_s: float = 0.0

    @property
    def num_passed(self) -> int:
        return sum(test.status == "passed" for test in self.tests)

    def tests_as_dicts(self) -> list[dict[str, Any]]:
        return [asdict(test) for test in self.tests]


def grade_solution(
    code: str,
    inputs: list[str],
    outputs: list[str],
    fn_name: str | None,
    limits: SandboxLimits,
    policy: SandboxPolicy,
    stop_on_first_failure: bool = True,
) -> Grade:
    """Run every test (or up to the first failure) in its own sandboxed process. Blocking: call from a worker."""
    if not inputs or len(inputs) != len(outputs):
        return Grade("invalid_tests", failure={"reason": f"{len(inputs)} inputs for {len(outputs)} outputs"})
    start = time.monotonic()
    grade = Grade("passed")
    for index, (test_input, expected) in enumerate(zip(inputs, outputs, strict=True)):
        run = run_python(code, test_input, limits, policy, fn_name)
        if run.status == "ok":
            matches = json_outputs_match(run.stdout, expected) if fn_name else outputs_match(run.stdout, expected)
            status: ResultCode = "passed" if matches else "wrong_answer"
        else:
            status = run.status
        grade.tests.append(TestOutcome(status, round(run.wall_s, 4)))
        if status != "passed" and grade.failure is None:
            grade.result = status
            grade.failure = {
                "test_index": index,
                "status": status,
                "input": test_input[:_SNIPPET_CHARS],
                "expected_output": expected[:_SNIPPET_CHARS],
                "actual_output": run.stdout[:_SNIPPET_CHARS],
                "stderr": run.stderr[-_STDERR_CHARS:],
            }
            if stop_on_first_failure or status in ("syntax_error", "sandbox_error"):
                break
    grade.time_s = round(time.monotonic() - start, 4)
    return grade
