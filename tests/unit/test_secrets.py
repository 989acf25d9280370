"""The secrets rule (nemo_gym/config/secrets.py): what is masked, where, and what is left alone.

Each test pins one clause of the rule in the module docstring; the launcher and the commands that show a config are
covered in tests/launcher/test_secrets.py and tests/e2e/test_secrets.py.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
import yaml

from nemo_gym.cli.main import main
from nemo_gym.config.compose import ComposeOptions, compose
from nemo_gym.config.secrets import MASK, is_secret_key, mask_secrets, mask_text, secret_values
from nemo_gym.global_config import masked_config_yaml
from nemo_gym.transport import http_client
from nemo_gym.transport.http_client import TransportError
from tests.helpers import write

KEY = "sk-live-0123456789abcdef"
URL_PASSWORD = "sk-url-9876543210"
HEADER_TOKEN = "sk-header-5555555555"


def masked(config: dict) -> dict:
    return mask_secrets(config)


# --- rule 1: secret-like keys -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["policy_api_key", "hf_token", "client_secret", "db_password", "custom_auth_header", "Authorization"]
)
def test_secret_like_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key", ["max_tokens", "max_output_tokens", "tokenizer", "key_metrics", "_delete_key", "author", "authoring"]
)
def test_keys_that_only_look_secret(key):
    assert not is_secret_key(key)


def test_numbers_booleans_and_empty_strings_are_never_secrets_whatever_their_key():
    config = {"max_output_tokens": 1, "num_key_value_heads": 8, "use_auth": True, "hf_token": "", "n": "1", "t": None}
    assert masked(config) == config
    assert secret_values(config) == []


def test_a_short_value_under_a_secret_key_is_masked_where_it_sits_but_not_searched_for_elsewhere():
    config = {"api_key": "EMPTY", "note": "EMPTY means no key", "max_tokens": 100}
    assert masked(config) == {"api_key": MASK, "note": "EMPTY means no key", "max_tokens": 100}


def test_a_long_secret_is_masked_wherever_it_appears_inside_other_strings():
    config = {"policy_api_key": KEY, "headers": {"X-Custom": f"Bearer-ish {KEY}"}, "cmd": f"curl -H 'key: {KEY}'"}
    shown = masked(config)
    assert KEY not in str(shown)
    assert shown["headers"]["X-Custom"] == f"Bearer-ish {MASK}" and shown["cmd"] == f"curl -H 'key: {MASK}'"


def test_unset_values_are_shown_as_unset():
    assert masked({"policy_api_key": "???"}) == {"policy_api_key": "???"}


# --- rules 2 and 3: URL userinfo and bearer credentials, in any string ---------------------------------------------


def test_url_userinfo_is_always_masked_and_a_long_password_everywhere_else():
    config = {
        "policy_base_url": f"http://u:{URL_PASSWORD}@127.0.0.1:8000/v1",
        "short": "postgres://me:pw@db:5432/x",
        "copy": f"password is {URL_PASSWORD}",
        "plain": "https://api.openai.com/v1",
        "email": "https://example.com/?to=a@b.c",
    }
    shown = masked(config)
    assert shown["policy_base_url"] == f"http://{MASK}@127.0.0.1:8000/v1"
    assert shown["short"] == f"postgres://{MASK}@db:5432/x"
    assert shown["copy"] == f"password is {MASK}"
    assert shown["plain"] == config["plain"] and shown["email"] == config["email"]


def test_a_bearer_credential_under_any_key_is_masked():
    shown = masked({"custom_header": f"Bearer {HEADER_TOKEN}", "list": [f"bearer {HEADER_TOKEN}"]})
    assert shown == {"custom_header": f"Bearer {MASK}", "list": [f"bearer {MASK}"]}


def test_mask_text_masks_known_values_userinfo_and_bearer_in_free_text():
    text = f"GET http://u:{URL_PASSWORD}@h/v1 with Authorization: Bearer {HEADER_TOKEN} and {KEY}"
    assert mask_text(text, [KEY]) == f"GET http://{MASK}@h/v1 with Authorization: Bearer {MASK} and {MASK}"


# --- rule 4: values from env.yaml -----------------------------------------------------------------------------------


@pytest.fixture
def env_yaml(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = write(
        workdir / "env.yaml",
        f"team_credential_blob: {HEADER_TOKEN}\n"  # an unusual key: masked because env.yaml set it
        "from_environment: ${oc.env:MY_SECRET_FROM_ENV}\n"  # judged by its resolved value
        "policy_model_name: gpt-4.1-mini-2025\n"  # a model name: shown
        "default_host: 127.0.0.1\n"  # a framework setting: shown (clients need it)
        "results_dir: ./results\n"
        "my_data: /data/shared/train.jsonl\n"  # a path: shown
        f"policy_base_url: http://u:{URL_PASSWORD}@127.0.0.1:9/v1\n"  # a URL: only its userinfo
        "server:\n  resources_servers:\n    impl:\n      host: node-17.cluster.internal\n",
    )
    monkeypatch.setenv("NEMO_GYM_ENV_YAML", str(path))
    monkeypatch.setenv("MY_SECRET_FROM_ENV", "env-var-secret-42")
    return path


def test_env_yaml_values_are_masked_unless_public_by_nature(env_yaml, workdir):
    write(workdir / "c.yaml", "copied: x-${team_credential_blob}-y\nenv_copy: ${from_environment}\n")
    composed = compose(ComposeOptions(overrides=[f"+config_paths=[{workdir / 'c.yaml'}]"]))
    assert composed.secrets == {HEADER_TOKEN, "env-var-secret-42"}
    shown = yaml.safe_load(masked_config_yaml(composed.config, composed.secrets))
    assert shown["team_credential_blob"] == MASK and shown["copied"] == f"x-{MASK}-y"
    assert shown["from_environment"] == MASK and shown["env_copy"] == MASK
    assert shown["policy_model_name"] == "gpt-4.1-mini-2025" and shown["default_host"] == "127.0.0.1"
    assert shown["my_data"] == "/data/shared/train.jsonl" and shown["results_dir"] == str(workdir / "results")
    assert shown["policy_base_url"] == f"http://{MASK}@127.0.0.1:9/v1"
    assert shown["server"]["resources_servers"]["impl"]["host"] == "node-17.cluster.internal"


def test_resolve_masks_env_yaml_values_urls_and_headers(env_yaml, workdir, capsys):
    write(workdir / "c.yaml", "custom_auth_header: Bearer ${policy_api_key}\nupstream: ${policy_base_url}/responses\n")
    code = main(["env", "resolve", "--config", str(workdir / "c.yaml"), f"+policy_api_key={KEY}"])
    out, err = capsys.readouterr()
    assert code == 0, err
    for secret in (KEY, URL_PASSWORD, HEADER_TOKEN, "env-var-secret-42"):
        assert secret not in out + err
    assert f"upstream: http://{MASK}@127.0.0.1:9/v1/responses" in out


# --- error messages --------------------------------------------------------------------------------------------------


def test_errors_that_echo_a_config_value_mask_its_secrets(workdir, capsys):
    write(
        workdir / "c.yaml",
        f"my_api_key: {KEY}-${{nope}}\nbase: http://u:{URL_PASSWORD}@h/${{nope}}\nauth: Bearer {HEADER_TOKEN}${{x}}\n",
    )
    assert main(["env", "validate", "--config", str(workdir / "c.yaml")]) == 1
    err = capsys.readouterr().err
    assert "cannot be resolved" in err and "my_api_key" in err
    for secret in (KEY, URL_PASSWORD, HEADER_TOKEN):
        assert secret not in err


def test_a_wrong_type_under_a_secret_key_is_not_echoed(workdir, capsys):
    write(workdir / "impl" / "resources_servers" / "typed" / "app.py", TYPED_APP)
    write(
        workdir / "c.yaml",
        f"typed:\n  resources_servers:\n    typed:\n      entrypoint: app.py\n      domain: other\n"
        f"      upstream_api_key: [{KEY}]\n",
    )
    code = main(["env", "validate", "--search-dir", str(workdir / "impl"), "--config", str(workdir / "c.yaml")])
    err = capsys.readouterr().err
    assert code == 1 and "upstream_api_key" in err and "expected a string" in err, err
    assert KEY not in err


TYPED_APP = """
from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer


class TypedConfig(BaseResourcesServerConfig):
    upstream_api_key: str


class Typed(SimpleResourcesServer):
    config: TypedConfig
"""


def test_transport_errors_name_a_url_without_its_credentials():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: the connection is refused at once
        url = f"http://u:{URL_PASSWORD}@127.0.0.1:{sock.getsockname()[1]}/v1/responses"

        async def call() -> str:
            try:
                await http_client.request("POST", url, json={}, url_path=url, retry=False)
            except TransportError as e:
                return str(e)
            finally:
                await http_client.close_session()
            raise AssertionError("the request should have failed")

        message = asyncio.run(call())
    assert URL_PASSWORD not in message and "/v1/responses" in message
