"""Prompt templates (a YAML ``user`` template and an optional ``system`` one), under NeMo Gym's name ``nemo_gym.prompt``.

Environments use these to build judge prompts (``fill_prompt``) and data scripts to build rows
(``apply_prompt_to_row``). The templating itself is :class:`nemo_gym.datasets.render.PromptTemplate`, the code
behind ``gym dataset render``, so a template fills in the same way everywhere. As in NeMo Gym, a mapping or list
value is inserted as its ``str()`` here (``gym dataset render`` inserts JSON), and a field the row lacks raises a
``KeyError`` (:class:`~nemo_gym.datasets.render.PromptFieldMissingError`) that lists the fields the row has.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel

from nemo_gym.datasets.render import PromptTemplate as _PromptTemplate
from nemo_gym.datasets.validation import CREATE_PARAMS_KEY as _CREATE_PARAMS_KEY

__all__ = ["PromptConfig", "apply_prompt_to_row", "fill_prompt", "load_prompt_config"]


class PromptConfig(BaseModel):
    """A prompt config: ``user`` (required) and ``system`` templates with ``{field}`` placeholders."""

    user: str
    system: str | None = None


@functools.lru_cache(maxsize=64)
def load_prompt_config(path: str) -> PromptConfig:
    """Read and check a prompt YAML, once per path (the result is cached: do not mutate it).

    A relative path is looked up in the search roots, like ``config_paths`` (``nemo_gym/config/roots.py``): from
    inside a server folder of a NeMo Gym checkout, ``resources_servers/x/prompts/judge.yaml`` names that checkout's
    file. A missing file, bad YAML, a missing ``user``, an unknown key or a lone brace is a
    :class:`~nemo_gym.errors.ConfigError` naming the file.
    """
    template = _PromptTemplate.load(path)
    return PromptConfig(user=template.user, system=template.system)


def fill_prompt(prompt_config: PromptConfig, row: dict[str, Any]) -> list[dict[str, str]]:
    """The ``system`` (if any) and ``user`` messages with ``{field}`` placeholders filled from ``row``.

    ``{{`` and ``}}`` are literal braces; ``{a.b}`` reaches into a nested mapping.
    """
    return _template(prompt_config).messages(row)


def apply_prompt_to_row(row: dict[str, Any], prompt_config: PromptConfig) -> dict[str, Any]:
    """A copy of ``row`` whose ``responses_create_params.input`` is the filled prompt.

    Other create params (tools, temperature, ...) are kept; an existing ``input`` is replaced, and a
    ``responses_create_params`` that is not a mapping is replaced by one. ``row`` itself is not changed.
    """
    params = row.get(_CREATE_PARAMS_KEY)
    rendered = dict(row)
    rendered[_CREATE_PARAMS_KEY] = {
        **(params if isinstance(params, dict) else {}),
        "input": fill_prompt(prompt_config, row),
    }
    return rendered


def _template(prompt_config: PromptConfig) -> _PromptTemplate:
    return _PromptTemplate(user=prompt_config.user, system=prompt_config.system, json_values=False)
