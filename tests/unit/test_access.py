"""The access checks one request at a time (ASGI calls, no server): the end-to-end proof is tests/e2e/test_access.py."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nemo_gym.errors import ConfigError
from nemo_gym.transport import access
from nemo_gym.transport.admission import origin_of

TOKEN = "t" * 43


async def _echo_length(scope: dict, receive: Any, send: Any) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(len(body)).encode()})


def call(
    headers: dict[str, str], chunks: list[bytes], *, method: str = "POST", accept_bearer: bool = False, **kw: Any
) -> tuple[int, bytes]:
    app = access.AccessMiddleware(_echo_length, token=kw.get("token", TOKEN), max_body=kw.get("limit", 100),
                                  accept_bearer=accept_bearer)  # fmt: skip
    scope = {"type": "http", "method": method, "path": kw.get("path", "/run"),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}  # fmt: skip
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


JSON = {"content-type": "application/json", access.TOKEN_HEADER: TOKEN}


def test_the_token_is_required_and_compared_whole() -> None:
    assert call({"content-type": "application/json"}, [b"{}"])[0] == 401
    assert call({**JSON, access.TOKEN_HEADER: TOKEN[:-1]}, [b"{}"])[0] == 401
    assert call(JSON, [b"{}"]) == (200, b"2")
    assert call({"content-type": "application/json"}, [b"{}"], token=None) == (200, b"2")  # no run: no token


def test_bearer_counts_only_where_accepted() -> None:
    bearer = {"content-type": "application/json", "authorization": f"Bearer {TOKEN}"}
    assert call(bearer, [b"{}"])[0] == 401
    assert call(bearer, [b"{}"], accept_bearer=True)[0] == 200
    assert call({**bearer, "authorization": "Bearer sk-other"}, [b"{}"], accept_bearer=True)[0] == 401


def test_x_api_key_counts_only_where_bearer_is_accepted() -> None:
    """The ``anthropic`` SDK sends its ``api_key`` as ``x-api-key``: a model server takes the run token there too."""
    api_key = {"content-type": "application/json", "x-api-key": TOKEN}
    assert call(api_key, [b"{}"])[0] == 401
    assert call(api_key, [b"{}"], accept_bearer=True)[0] == 200
    assert call({**api_key, "x-api-key": TOKEN[:-1]}, [b"{}"], accept_bearer=True)[0] == 401


def _error(headers: dict[str, str], accept_bearer: bool = False) -> str:
    status, body = call({"content-type": "application/json", **headers}, [b"{}"], accept_bearer=accept_bearer)
    assert status == 401
    return str(json.loads(body)["error"])


def test_the_401_is_about_the_credential_the_caller_sent() -> None:
    wrong_bearer = _error({"authorization": "Bearer sk-other"}, accept_bearer=True)
    assert wrong_bearer.startswith("wrong Authorization: Bearer token: ") and access.TOKEN_HEADER not in wrong_bearer
    assert _error({"x-api-key": "sk-other"}, accept_bearer=True).startswith("wrong x-api-key: ")
    elsewhere = _error({"authorization": f"Bearer {TOKEN}"})  # an agent or resources server takes only our header
    assert elsewhere == (
        f"this server does not take Authorization: Bearer: send the run's token as the {access.TOKEN_HEADER} header"
    )
    assert _error({access.TOKEN_HEADER: "x"}, accept_bearer=True).startswith(f"wrong {access.TOKEN_HEADER} header: ")
    assert _error({}).startswith(f"missing {access.TOKEN_HEADER} header: ")
    assert _error({}, accept_bearer=True).startswith(f"missing {access.TOKEN_HEADER} or Authorization: Bearer: ")
    assert all("token file" in _error(h) for h in ({}, {"authorization": "Basic x"}, {access.TOKEN_HEADER: "x"}))


@pytest.mark.parametrize(
    ("content_type", "status"),
    [("text/plain", 415), ("application/x-www-form-urlencoded", 415), ("multipart/form-data; boundary=x", 415),
     ("application/octet-stream", 415), ("application/json; charset=utf-8", 200), ("application/merge-patch+json", 200),
     ("APPLICATION/JSON", 200)],
)  # fmt: skip
def test_only_json_bodies(content_type: str, status: int) -> None:
    assert call({**JSON, "content-type": content_type}, [b"{}"])[0] == status


def test_no_content_type_is_fine_only_without_a_body() -> None:
    token = {access.TOKEN_HEADER: TOKEN}
    assert call({**token, "content-length": "0"}, [b""])[0] == 200
    assert call({**token, "content-length": "2"}, [b"{}"])[0] == 415
    assert call({**token, "transfer-encoding": "chunked"}, [b"{}"])[0] == 415
    assert call(token, [b""], method="GET")[0] == 200


def test_a_declared_or_chunked_body_over_the_limit_is_a_413() -> None:
    assert call({**JSON, "content-length": "101"}, [b"x" * 101])[0] == 413
    assert call({**JSON, "content-length": "100"}, [b"x" * 100]) == (200, b"100")
    chunked = {**JSON, "transfer-encoding": "chunked"}
    status, body = call(chunked, [b"x" * 60, b"x" * 60])
    assert status == 413 and b"server_max_body_bytes" in body
    assert call(chunked, [b"x" * 60, b"x" * 40]) == (200, b"100")  # handed to the app whole
    assert call(chunked, [b"x" * 200], path="/aggregate_metrics") == (200, b"200")  # a whole run, by design


def test_short_echo_keeps_a_prefix_and_the_size() -> None:
    assert access.short_echo("abc") == "abc" and access.short_echo(7) == 7 and access.short_echo(None) is None
    echoed = access.short_echo("é" * 10_000)
    assert echoed.startswith("é" * 200) and echoed.endswith("... (20000 bytes)") and len(echoed) < 250
    assert access.short_echo({"a": "x" * 1000}).endswith("bytes)")


@pytest.fixture
def fresh_registry() -> Iterator[None]:
    saved = dict(access._tokens)
    access._tokens.clear()
    yield
    access._tokens.clear()
    access._tokens.update(saved)


def test_the_token_goes_only_to_registered_servers(fresh_registry: None) -> None:
    assert access.headers_for("http://127.0.0.1:9", None) is None
    access.register(TOKEN, ["http://0.0.0.0:8000", "http://127.0.0.1:9001"])
    assert access.headers_for(origin_of("http://127.0.0.1:8000/run"), None) == {access.TOKEN_HEADER: TOKEN}
    assert access.headers_for(origin_of("http://127.0.0.1:9001/v1"), {"a": "b"}) == {
        "a": "b",
        access.TOKEN_HEADER: TOKEN,
    }
    outside = {"Authorization": "Bearer sk"}
    assert access.headers_for(origin_of("https://api.openai.com/v1/responses"), outside) is outside
    access.forget(["http://127.0.0.1:9001"])
    assert access.registered_token("http://127.0.0.1:9001/") is None


def test_token_files_are_private_and_found_by_address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(access.TOKEN_DIR_ENV_VAR, str(tmp_path / "tokens"))
    monkeypatch.delenv(access.TOKEN_ENV_VAR, raising=False)
    path = access.token_file("127.0.0.1", 11000)
    access.write_token_file(path, TOKEN)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert access.read_token_file("0.0.0.0", 11000) == TOKEN
    monkeypatch.setenv(access.TOKEN_ENV_VAR, "explicit")
    assert access.read_token_file("127.0.0.1", 11000) == "explicit"
    access.remove_token_file(path, "another run's")
    assert path.exists()
    access.remove_token_file(path, TOKEN)
    assert not path.exists()


def test_a_planted_link_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "tokens")
    monkeypatch.setenv(access.TOKEN_DIR_ENV_VAR, str(tmp_path / "tokens"))
    with pytest.raises(ConfigError, match="not a directory of yours"):
        access.write_token_file(access.token_file("127.0.0.1", 1), TOKEN)


def test_max_body_bytes_setting() -> None:
    assert access.max_body_bytes({}) == access.DEFAULT_MAX_BODY_BYTES
    assert access.max_body_bytes({access.MAX_BODY_KEY: 0}) is None
    assert access.max_body_bytes({access.MAX_BODY_KEY: 5}) == 5
    with pytest.raises(ConfigError, match=access.MAX_BODY_KEY):
        access.max_body_bytes({access.MAX_BODY_KEY: "big"})
