"""The base of every command's config model: the command's keys, validated from the composed config.

A command (``gym eval run``, ``gym dataset upload``, ...) reads its settings as a pydantic model of the composed
config; ``+h`` / ``--help`` print the model's fields instead of running it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, model_validator


class BaseNeMoGymCLIConfig(BaseModel):
    """Base for the pydantic config of a CLI command, validated against the merged global config."""

    @model_validator(mode="before")
    @classmethod
    def pre_process(cls, data: Any) -> Any:
        """Print this command's help and exit when ``+h``/``+help`` is set or ``-h``/``--help`` is on the command line."""
        # a dict or an OmegaConf DictConfig (a Mapping: omegaconf is not imported for the check)
        wants_help = isinstance(data, Mapping) and (data.get("h") or data.get("help"))
        if wants_help or any(arg in ("-h", "--help") for arg in sys.argv[1:]):
            print(cls.help_text())
            raise SystemExit(0)
        return data

    @classmethod
    def help_text(cls) -> str:
        lines = [(cls.__doc__ or cls.__name__).strip(), "", "Fields:"]
        for name, field in cls.model_fields.items():
            default = "required" if field.is_required() else f"default: {field.default!r}"
            description = f"  {field.description}" if field.description else ""
            lines.append(f"  {name:<24} {default}{description}")
        return "\n".join(lines)
