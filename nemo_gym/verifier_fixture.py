"""Known trajectories and the reward a verifier must give them (NeMo Gym 0.7's ``nemo_gym.verifier_fixture``).

A resources server keeps a JSONL file of cases next to its tests, one object a line::

    {"name": "called the tool", "kind": "full_reward", "request": {...verify body...}, "expected_reward": 1.0}
    {"name": "no tool call", "kind": "zero_reward", "request": {...}, "expected_reward": 0.0}
    {"name": "no response", "kind": "malformed", "request": {...}, "expected_error": "response"}

and declares a :class:`VerifierFixture` (how to make a fresh verifier, the request model). Its test calls
:func:`exercise_verifier_fixture`, which scores every case on a fresh server, in process, with no HTTP: a full-reward
case must reach the best end of the declared range, a zero-reward case the worst, a malformed one must raise, and a
``seeded`` verifier must score its determinism cases the same twice. A change in a verifier's scoring then fails its
own tests; ``update_expected=True`` rewrites the expected rewards after an intended change.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "VerifierFixture",
    "VerifierFixtureCase",
    "VerifierFixtureError",
    "VerifierFixtureResult",
    "exercise_verifier_fixture",
    "load_verifier_fixture",
]

CaseKind = Literal["full_reward", "zero_reward", "malformed", "determinism"]
Adapter = Callable[[Any, BaseModel], Any]
"""``(server, request)`` -> the verify result (or an awaitable of it); also the shape of ``reseed``."""


class VerifierFixtureError(ValueError):
    """The fixture file is invalid, or the verifier does not behave as its cases say."""


@dataclass(frozen=True)
class VerifierFixture:
    """How to exercise one verifier: a factory for a fresh server, the model a case's request is parsed into, the
    cases file, and optionally how to call it (default ``server.verify(request)``) and how to reseed it before a
    determinism case."""

    server_factory: Callable[[], Any]
    request_model: type[BaseModel]
    cases_path: str | Path
    invoke: Adapter | None = None
    reseed: Adapter | None = None


class VerifierFixtureCase(BaseModel):
    """One line of a fixture file."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    name: str = Field(min_length=1)
    kind: CaseKind
    request: dict[str, Any]
    expected_reward: Annotated[float, Field(strict=True, allow_inf_nan=False)] | None = None
    expected_error: str | None = None

    @model_validator(mode="after")
    def _one_expectation(self) -> VerifierFixtureCase:
        if self.kind == "malformed":
            valid = bool(self.expected_error) and self.expected_reward is None
            rule = "a malformed case gives expected_error (a text its error contains) and no expected_reward"
        else:
            valid = self.expected_reward is not None and self.expected_error is None
            rule = f"a {self.kind} case gives expected_reward and no expected_error"
        if not valid:
            raise ValueError(rule)
        return self


@dataclass(frozen=True)
class VerifierFixtureResult:
    """A case that passed, with the rewards it got (none for a malformed case; two for a determinism case)."""

    name: str
    kind: CaseKind
    observed_rewards: tuple[float, ...] = ()


def load_verifier_fixture(path: str | Path) -> list[VerifierFixtureCase]:
    """The cases of a fixture file; a :class:`VerifierFixtureError` names the file and line of the first bad one."""
    source = path if isinstance(path, Path) else Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as error:
        raise VerifierFixtureError(f"cannot read verifier fixture {source}: {error}") from error
    numbered = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    cases = [_parsed_case(source, number, line) for number, line in numbered]
    if not cases:
        raise VerifierFixtureError(f"verifier fixture {source} has no cases")
    return cases


def _parsed_case(source: Path, number: int, line: str) -> VerifierFixtureCase:
    """One non-blank line as a case; the error names where it is and the first thing wrong with it."""
    try:
        return VerifierFixtureCase.model_validate_json(line)
    except ValidationError as error:
        first = error.errors(include_url=False, include_input=False, include_context=False)[0]
        raise VerifierFixtureError(f"{source}:{number}: {first['msg']}") from error


async def _settle(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _reward_of(result: Any, case: VerifierFixtureCase) -> float:
    reward = result.get("reward") if isinstance(result, dict) else getattr(result, "reward", result)
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise VerifierFixtureError(f"case {case.name!r}: the verifier returned {reward!r}, not a finite reward")
    return float(reward)


async def _score(fixture: VerifierFixture, case: VerifierFixtureCase, *, reseed: bool) -> float:
    """Score one case on a fresh server. Errors propagate as they are: a malformed case expects one."""
    server = fixture.server_factory()
    request = fixture.request_model.model_validate(case.request)
    if reseed:
        if fixture.reseed is None:
            raise VerifierFixtureError(f"case {case.name!r}: a seeded determinism case needs the fixture's reseed")
        await _settle(fixture.reseed(server, request))
    if fixture.invoke is not None:
        result = await _settle(fixture.invoke(server, request))
    else:
        verify = getattr(server, "verify", None)
        if not callable(verify):
            raise VerifierFixtureError("server_factory made an object without a verify method; give invoke")
        result = await _settle(verify(request))
    return _reward_of(result, case)


async def _observe(fixture: VerifierFixture, case: VerifierFixtureCase, *, reseed: bool = False) -> float:
    try:
        return await _score(fixture, case, reseed=reseed)
    except VerifierFixtureError:
        raise
    except Exception as error:
        raise VerifierFixtureError(f"case {case.name!r} failed: {type(error).__name__}: {error}") from error


async def _expect_failure(fixture: VerifierFixture, case: VerifierFixtureCase) -> None:
    try:
        await _score(fixture, case, reseed=False)
    except VerifierFixtureError:
        raise
    except Exception as error:
        if case.expected_error and case.expected_error not in str(error):
            raise VerifierFixtureError(
                f"malformed case {case.name!r} failed, but its error does not mention {case.expected_error!r}: {error}"
            ) from error
        return
    raise VerifierFixtureError(f"malformed case {case.name!r} was scored instead of failing")


def _checked_range(reward_range: Sequence[float]) -> tuple[float, float]:
    if len(reward_range) != 2:
        raise VerifierFixtureError("reward_range is (lowest, highest)")
    low, high = reward_range
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high))
    if not numbers or low > high:
        raise VerifierFixtureError(f"reward_range {tuple(reward_range)!r} must be two finite numbers, lowest first")
    return float(low), float(high)


def _rewrite(path: Path, cases: list[VerifierFixtureCase]) -> None:
    """Replace the fixture file atomically, keeping its permissions; a symlink or special file is refused."""
    if path.is_symlink() or not path.is_file():
        raise VerifierFixtureError(f"{path} is not a regular file; not rewriting it")
    lines = [json.dumps(case.model_dump(mode="json", exclude_none=True), sort_keys=True) for case in cases]
    leftover: Path | None = None  # the temporary file, until it has replaced the fixture
    try:
        permissions = path.stat().st_mode & 0o777
        with tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
        ) as out:
            leftover = Path(out.name)
            out.writelines(line + "\n" for line in lines)
            out.flush()
            os.fsync(out.fileno())
        leftover.chmod(permissions)
        leftover.replace(path)
        leftover = None
    except OSError as error:
        raise VerifierFixtureError(f"could not rewrite {path}: {error}") from error
    finally:
        if leftover is not None:
            leftover.unlink(missing_ok=True)


async def exercise_verifier_fixture(
    fixture: VerifierFixture,
    *,
    reward_range: Sequence[float],
    higher_is_better: bool = True,
    determinism: str | Enum,
    update_expected: bool = False,
) -> tuple[VerifierFixtureResult, ...]:
    """Score every case of ``fixture`` and check it; the passed cases in file order, or a
    :class:`VerifierFixtureError` at the first that fails.

    ``determinism`` is the verifier's own claim: ``seeded`` (its determinism cases are scored twice, each on a fresh
    reseeded server, and must agree), ``stochastic`` or ``unknown`` (determinism cases are skipped).
    """
    low, high = _checked_range(reward_range)
    path = Path(fixture.cases_path)
    cases = load_verifier_fixture(path)
    if not isinstance(higher_is_better, bool):
        raise VerifierFixtureError("higher_is_better is True or False")
    best, worst = (high, low) if higher_is_better else (low, high)
    claim = str(determinism.value if isinstance(determinism, Enum) else determinism)
    if claim not in ("seeded", "stochastic", "unknown"):
        raise VerifierFixtureError(f"determinism is seeded, stochastic or unknown, not {claim!r}")
    needed = {"full_reward", "zero_reward", "malformed"} | ({"determinism"} if claim == "seeded" else set())
    missing = sorted(needed - {case.kind for case in cases})
    if missing:
        raise VerifierFixtureError(f"{path} lacks cases of kind: {', '.join(missing)}")

    passed: list[VerifierFixtureResult] = []
    observed_by_index: dict[int, float] = {}
    for index, case in enumerate(cases):
        if case.kind == "malformed":
            await _expect_failure(fixture, case)
            passed.append(VerifierFixtureResult(case.name, case.kind))
            continue
        if case.kind == "determinism" and claim != "seeded":
            continue
        rewards = [await _observe(fixture, case, reseed=case.kind == "determinism")]
        reward = rewards[0]
        if not low <= reward <= high:
            raise VerifierFixtureError(f"case {case.name!r}: reward {reward} is outside [{low}, {high}]")
        pinned = {"full_reward": best, "zero_reward": worst}.get(case.kind)
        if pinned is not None and reward != pinned:
            end = "best" if case.kind == "full_reward" else "worst"
            raise VerifierFixtureError(f"{case.kind} case {case.name!r} scored {reward}, not the {end} reward {pinned}")
        if case.kind == "determinism":
            rewards.append(await _observe(fixture, case, reseed=True))
            if rewards[1] != reward:
                raise VerifierFixtureError(f"determinism case {case.name!r} scored {reward}, then {rewards[1]}")
        if update_expected:
            observed_by_index[index] = reward
        elif reward != case.expected_reward:
            raise VerifierFixtureError(
                f"case {case.name!r} scored {reward}; the fixture expects {case.expected_reward}"
            )
        passed.append(VerifierFixtureResult(case.name, case.kind, tuple(rewards)))

    updated = list(cases)
    for index, reward in observed_by_index.items():  # filled only with update_expected
        updated[index] = cases[index].model_copy(update={"expected_reward": reward})
    if updated != cases:
        _rewrite(path, updated)
    return tuple(passed)
