"""SessionCookieMiddleware reads its session id from a Cookie header by one rule, whatever else the header holds."""

from __future__ import annotations

import random

from nemo_gym.server_utils import SessionCookieMiddleware

NAME = "MyServer___my.server"
GOOD = "0123456789abcdef" * 2


def _by_the_rule(value: bytes) -> str | None:
    """The rule, spelled out: the first ``;``-separated part that is ``<name>=<32 lowercase hex>`` once stripped."""
    prefix = f"{NAME}=".encode()
    for part in value.split(b";"):
        part = part.strip()
        candidate = part[len(prefix) :].decode("latin-1") if part.startswith(prefix) else ""
        if len(candidate) == 32 and all(c in "0123456789abcdef" for c in candidate):
            return candidate
    return None


def test_the_session_id_is_read_by_the_rule_from_any_cookie_header() -> None:
    middleware = SessionCookieMiddleware(app=None, cookie_name=NAME)
    pieces = [
        f"{NAME}={GOOD}",
        f" {NAME}={GOOD[::-1]}\t",
        f"{NAME}={GOOD.upper()}",
        f"{NAME}={GOOD}0",
        f"{NAME}={GOOD[:31]}",
        f"x{NAME}={GOOD}",
        f"{NAME}x={GOOD}",
        f"{NAME}= {GOOD}",
        "Other___a=" + GOOD,
        "plain=1",
        "",
        " ",
        "MyServerXXXmy.server=" + GOOD,
    ]
    rng = random.Random(17)
    for _ in range(3000):
        header = ";".join(rng.choice(pieces) for _ in range(rng.randint(1, 4))).encode()
        scope = {"headers": [(b"host", b"x"), (b"cookie", header)]}
        assert middleware._read_cookie(scope) == _by_the_rule(header), header
    assert middleware._read_cookie({"headers": [(b"cookie", b"a=1"), (b"cookie", f"{NAME}={GOOD}".encode())]}) == GOOD
    assert middleware._read_cookie({"headers": []}) is None
