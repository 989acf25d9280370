"""Masking secrets before a config, a log line or an error message is printed or served.

The rule, in one place. A config value is a *secret* when it is a non-empty string and

1. it sits under a secret-like key: the key's name contains ``key``, ``token``, ``secret``, ``password``,
   ``passwd``, ``credential`` or ``auth`` (``policy_api_key``, ``hf_token``, ``custom_auth_header``), once the
   benign words ``tokenizer``, ``tokens``, ``token_ids``, ``key_metrics``, ``_delete_key`` and ``author…`` are
   taken out (so ``max_output_tokens``, ``tokenizer``, ``authoring`` are not). Numbers, booleans and null are never
   secrets, whatever their key: ``max_tokens: 100`` stays as it is;
2. it is the userinfo of a URL (``http://user:password@host``), found in any string: it is always masked, and the
   password (or a user with no password) is also searched for elsewhere, as below;
3. it is the credential after ``Bearer`` in any string (``custom_header: Bearer sk-...``);
4. it came from ``env.yaml`` (the local secrets file), unless it is public by nature: a framework setting
   (``default_host``, ``results_dir``, ... the keys of :data:`RESERVED_TOP_LEVEL_KEYS`), a ``host``, a model name
   (``policy_model_name``, ``model_name``, ``model``), a URL (only its userinfo is secret, rule 2), a path (starting
   with ``/``, ``~`` or ``.``), or shorter than :data:`MIN_SECRET_CHARS`.

A value of rule 1 is masked where it sits whatever its length. Every secret of at least :data:`MIN_SECRET_CHARS`
characters is also replaced wherever else it appears, inside longer strings too: a copy made by an interpolation
(``x: ${policy_api_key}``), ``Bearer <key>``, a URL. A shorter one is not searched for elsewhere, so that a short
value (``api_key: EMPTY``) cannot garble every string that happens to contain it. ``???`` (unset) is never masked.

Masking is for what is *shown*: ``gym env resolve``, the head server's ``/global_config_dict_yaml``, the launcher's
server logs and error messages. Servers started by the launcher read the real values from the run's config file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from nemo_gym.config.keys import MISSING, RESERVED_TOP_LEVEL_KEYS

SECRET_KEY_MARKERS = ("key", "token", "secret", "password", "passwd", "credential", "auth")
MASK = "****"
MIN_SECRET_CHARS = 8
"""Secrets at least this long are masked wherever they appear; real credentials are far longer."""
_BENIGN = re.compile(r"tokenizer|tokens|token_ids|_delete_key|key_metrics|author(?!iz)")
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)([^\s/?#]+)@")
_BEARER = re.compile(r"(\bbearer\s+)([A-Za-z0-9._~+/=\-]+)", re.IGNORECASE)
_PUBLIC_ENV_KEYS = frozenset(RESERVED_TOP_LEVEL_KEYS) | {"host", "policy_model_name", "model_name", "model"}


def is_secret_key(key: str) -> bool:
    """True for keys such as ``policy_api_key``, ``hf_token``, ``client_secret``; not ``max_tokens``/``tokenizer``."""
    lowered = _BENIGN.sub("", str(key).lower())
    return any(marker in lowered for marker in SECRET_KEY_MARKERS)


def env_yaml_secrets(env_yaml: dict[str, Any], resolved: dict[str, Any]) -> frozenset[str]:
    """Rule 4: the resolved values of the keys env.yaml sets (an ``${oc.env:...}`` there counts by its value)."""
    found = set()
    for path, _ in _leaves(env_yaml):
        if path and (path[0] in _PUBLIC_ENV_KEYS or path[-1] in _PUBLIC_ENV_KEYS):
            continue
        for _, value in _leaves(_get(resolved, path)):
            if (
                isinstance(value, str)
                and len(value) >= MIN_SECRET_CHARS
                and "://" not in value
                and not value.startswith(("/", "~", "."))
            ):
                found.add(value)
    return frozenset(found)


def secret_values(value: Any, extra: Iterable[str] = ()) -> list[str]:
    """Every secret of ``value`` (rules 1 and 2) and ``extra`` that is masked wherever it appears, longest first."""
    found = set(extra)
    for path, leaf in _leaves(value):
        if not isinstance(leaf, str):
            continue
        if path and is_secret_key(path[-1]):
            found.add(leaf)
        found.update(_url_credentials(leaf))
    return sorted((s for s in found if len(s) >= MIN_SECRET_CHARS and s != MISSING), key=len, reverse=True)


def mask_text(text: str, secrets: Sequence[str] = ()) -> str:
    """``text`` with every known secret (:func:`secret_values`), URL userinfo and bearer credential masked."""
    for secret in secrets:
        text = text.replace(secret, MASK)
    text = _URL_USERINFO.sub(rf"\1{MASK}@", text)
    return _BEARER.sub(rf"\1{MASK}", text)


def mask_secrets(value: Any, extra: Iterable[str] = ()) -> Any:
    """A copy of a config tree with every secret masked (see the module docstring); ``extra``: more secret values,
    such as the env.yaml ones (``ComposedConfig.secrets``)."""
    return _mask(value, "", secret_values(value, extra))


def mask_value(key: str, value: Any) -> Any:
    """``value`` as it may be shown next to ``key`` (in an error message that names the key)."""
    return _mask(value, key, secret_values({key: value}))


def _mask(value: Any, key: str, secrets: list[str]) -> Any:
    if isinstance(value, dict):
        return {k: _mask(v, str(k), secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, key, secrets) for v in value]
    if not isinstance(value, str) or not value or value == MISSING:
        return value  # an unset value is shown as such: it hides nothing
    if key and is_secret_key(key):
        return MASK
    return mask_text(value, secrets)


def _url_credentials(text: str) -> Iterator[str]:
    """The password of each URL with userinfo in ``text`` (the user, when there is no password)."""
    for match in _URL_USERINFO.finditer(text):
        user, _, password = match.group(2).partition(":")
        yield password or user


def _leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """``(key path, value)`` of every leaf; a list's items carry the list's key path."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _leaves(child, (*path, str(key)))
    elif isinstance(value, list):
        for child in value:
            yield from _leaves(child, path)
    else:
        yield path, value


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree
