"""The common override shapes read without Hydra give exactly what Hydra gives, and anything else goes to Hydra."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.errors import HydraException

from nemo_gym.config.override_literals import parse_common
from nemo_gym.config.overrides import parse_overrides
from nemo_gym.errors import ConfigError

HYDRA = OverridesParser.create()
KINDS = {
    OverrideType.CHANGE: "change",
    OverrideType.ADD: "add",
    OverrideType.FORCE_ADD: "force",
    OverrideType.DEL: "delete",
}


def same(a: Any, b: Any) -> bool:
    """Equal values of equal types all the way down (1 == 1.0 == True would hide a wrong type)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def assert_agrees_with_hydra(token: str) -> bool:
    """True when the token was read without Hydra (and then Hydra reads the same)."""
    common = parse_common(token)
    if common is None:
        return False
    try:
        hydra = HYDRA.parse_override(token)
    except HydraException as e:  # pragma: no cover - a failure shows the token
        raise AssertionError(f"{token!r}: read as {common}, but Hydra rejects it: {e}") from e
    assert not hydra.is_sweep_override() and hydra.package is None, token
    value = None if hydra.type == OverrideType.DEL else hydra.value()
    assert (KINDS[hydra.type], hydra.key_or_group) == common[:2], token
    assert same(common[2], value), f"{token!r}: {common[2]!r} ({type(common[2]).__name__}) vs Hydra {value!r}"
    return True


COMMON = [
    "+head_server={host: 127.0.0.1, port: 11000}",
    "+results_dir=/tmp/run-1/results",
    "++limit=5",
    "num_repeats=3",
    "~policy_model",
    "+config_paths=[a.yaml,resources_servers/x/configs/x.yaml]",
    "+x={a: [1, 2.5, {b: null}], c: 'quoted, text', d: \"it's\"}",
    "+t=True",
    "+f=1e-3",
    "+f2=1.",
    "+inf=-inf",
    "+s=1.2.3",
    "+u=1_000",
    "+url=http://127.0.0.1:8000/v1",
    "+e=[]",
    "+d={}",
    "a.0.b=x",
    "+k= spaced",
    "+n=007",
]


@pytest.mark.parametrize("token", COMMON)
def test_common_shapes_are_read_without_hydra_and_agree(token: str) -> None:
    assert assert_agrees_with_hydra(token)


@pytest.mark.parametrize(
    "token",
    ["a=1,2", "a=${b}", "a='x\\'y'", "a=choice(1,2)", "group/opt=x", "a@pkg=1", "a=x y", "a=", "~a=1", "a=b=c",
     "+a={true: 1}", "+a=[1,]", "a", "+a=1 "],
)  # fmt: skip
def test_other_shapes_go_to_hydra(token: str) -> None:
    assert parse_common(token) is None


def test_generated_tokens_agree_with_hydra() -> None:
    rng = random.Random(17)
    alphabet = "0123456789._-+eEaxnfiINulTrsF/:"
    words = ["0", "1", "12", "1_0", "0.5", ".5", "5.", "1e3", "1.5e-2", "inf", "NaN", "null", "true", "False", "x",
             "a-b", "a_b", "/p/q.jsonl", "-", "+", ".", "1.2.3", "127.0.0.1", "e5", "0x10", "-7", "+3.0"]  # fmt: skip

    def element(depth: int) -> str:
        roll = rng.random()
        if depth < 2 and roll < 0.15:
            return "[" + ", ".join(element(depth + 1) for _ in range(rng.randrange(3))) + "]"
        if depth < 2 and roll < 0.3:
            keys = rng.sample(["a", "b_c", "d-e", "port", "x1"], rng.randrange(3))
            return "{" + ", ".join(f"{k}: {element(depth + 1)}" for k in keys) + "}"
        if roll < 0.35:
            return repr(rng.choice(words))
        if roll < 0.7:
            return rng.choice(words)
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 6)))

    read = 0
    for _ in range(1500):
        token = rng.choice(["", "+", "++"]) + rng.choice(["a", "a.b", "x_1.0.y"]) + "=" + element(0)
        read += assert_agrees_with_hydra(token)
    assert read > 1000  # the generator mostly makes common shapes


def test_parse_overrides_mixes_both_paths_in_order() -> None:
    parsed = parse_overrides(["+a=1", "b=${a}", "~c"])
    assert [(o.kind, o.key, o.value) for o in parsed] == [
        ("add", "a", 1),
        ("change", "b", "${a}"),
        ("delete", "c", None),
    ]
    with pytest.raises(ConfigError, match="looks like a sweep"):
        parse_overrides(["+a=1", "b=1,2"])
