"""tool_call_match: single-step function calling, scored by comparing the model's calls with the row's expected calls.

Trains choosing the right function(s) and filling their arguments from a request, without running anything: the
agent makes one model call and never executes the calls (``simple_agent`` with ``execute_tools: false``), so any
tool schema can be used without implementing it.

A predicted call matches an expected one when the names are equal and the arguments match
(:func:`nemo_gym.verifiers.tool_calls.arguments_match`: numbers within ``float_tolerance``, a quoted number equals the
number, strings compared exactly or with whitespace/case normalised per ``string_match``, lists in order, nested
objects key by key, null-valued keys treated as absent, extra top-level arguments only with ``allow_extra_args``).
Calls are paired one to one: by position when ``ordered`` (config, or the row's ``ordered``), else by a maximum
matching, so the order of parallel calls does not matter.

Reward (``reward_mode``): ``all_or_nothing`` = 1 iff every expected call is matched and there are no other calls
(unless ``allow_extra_calls``); ``fraction`` = matched / max(expected, predicted) (extra calls dilute it unless
allowed). A row with no expected calls wants a plain answer: reward 1 iff the model made no call. Partial credit is
reported as ``name_match`` (share of expected calls paired with a same-name call) and ``args_match`` (share fully
matched).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.verifiers.tool_calls import (
    ArgumentMatchOptions,
    ParsedCall,
    arguments_match,
    function_calls,
    maximum_matching,
    parse_call,
)


class ToolCallMatchResourcesServerConfig(BaseResourcesServerConfig):
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.STATELESS

    string_match: Literal["exact", "normalized"] = "normalized"
    """``normalized``: strings compare with whitespace collapsed and case folded."""
    float_tolerance: float = Field(default=1e-6, ge=0)
    ordered: bool = False
    """Default for rows without ``ordered``: pair calls by position instead of as a set."""
    allow_extra_args: bool = False
    allow_extra_calls: bool = False
    reward_mode: Literal["all_or_nothing", "fraction"] = "all_or_nothing"


class ExpectedCall(BaseModel):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    """An object, or the JSON text of one (as models emit it)."""

    @model_validator(mode="after")
    def _arguments_are_an_object(self) -> ExpectedCall:
        if parse_call(self.model_dump()).arguments is None:
            raise ValueError(f"expected call {self.name!r}: arguments must be a JSON object")
        return self


class ToolCallMatchVerifyRequest(BaseVerifyRequest):
    expected_calls: list[ExpectedCall]
    """Empty: the model should answer without calling a function."""
    ordered: bool | None = None
    """Overrides the server's ``ordered`` for this row (e.g. calls that must happen in sequence)."""


class ToolCallMatchVerifyResponse(ToolCallMatchVerifyRequest):
    reward: float
    name_match: float
    args_match: float
    num_expected: int
    num_predicted: int
    num_matched: int
    num_malformed: int
    """Predicted calls whose arguments were not a JSON object."""
    predicted_calls: list[dict[str, Any]]


def pair_calls(
    expected: list[ParsedCall],
    predicted: list[ParsedCall],
    ordered: bool,
    same: Callable[[ParsedCall, ParsedCall], bool],
) -> list[tuple[int, int]]:
    """Pairs (expected index, predicted index) for which ``same(expected_call, predicted_call)`` holds."""
    if ordered:
        return [(i, i) for i in range(min(len(expected), len(predicted))) if same(expected[i], predicted[i])]
    return maximum_matching(len(expected), len(predicted), lambda i, j: same(expected[i], predicted[j]))


class ToolCallMatchResourcesServer(SimpleResourcesServer):
    config: ToolCallMatchResourcesServerConfig

    async def verify(self, body: ToolCallMatchVerifyRequest) -> ToolCallMatchVerifyResponse:
        config = self.config
        options = ArgumentMatchOptions(
            normalize_strings=config.string_match == "normalized",
            float_tolerance=config.float_tolerance,
            allow_extra_args=config.allow_extra_args,
        )
        ordered = config.ordered if body.ordered is None else body.ordered
        expected = [parse_call(call.model_dump()) for call in body.expected_calls]
        predicted = function_calls(body.response)

        by_name = pair_calls(expected, predicted, ordered, lambda e, p: e.name == p.name)
        full = pair_calls(
            expected,
            predicted,
            ordered,
            # Expected arguments are never None: ExpectedCall rejects a row whose arguments are not an object.
            lambda e, p: (
                e.name == p.name and e.arguments is not None and arguments_match(e.arguments, p.arguments, options)
            ),
        )
        extra = len(predicted) - len(full)
        if not expected:
            name_match = args_match = 1.0 if not predicted else 0.0
            reward = 1.0 if not predicted or config.allow_extra_calls else 0.0
        else:
            name_match, args_match = len(by_name) / len(expected), len(full) / len(expected)
            if config.reward_mode == "all_or_nothing":
                complete = len(full) == len(expected) and (extra == 0 or config.allow_extra_calls)
                reward = 1.0 if complete else 0.0
            else:
                denominator = len(expected) if config.allow_extra_calls else max(len(expected), len(predicted))
                reward = len(full) / denominator
        return ToolCallMatchVerifyResponse(
            **body.model_dump(),
            reward=reward,
            name_match=name_match,
            args_match=args_match,
            num_expected=len(expected),
            num_predicted=len(predicted),
            num_matched=len(full),
            num_malformed=sum(call.arguments is None for call in predicted),
            predicted_calls=[call.to_dict() for call in predicted],
        )


if __name__ == "__main__":
    ToolCallMatchResourcesServer.run_webserver()
