"""Prompt rendering: turn raw rows (``{"question": ..., ...}``) into agent rows with ``responses_create_params.input``.

A prompt config is a YAML mapping with a required ``user`` template and an optional ``system`` one::

    system: You are a careful mathematician.
    user: |
      Solve the problem and put the answer in \\boxed{{}}.
      {problem}

``{field}`` is replaced by the row's top-level field (``{a.b}`` reaches into nested mappings); ``{{`` and ``}}`` are
literal braces; format specs work as in Python (``{score:.2f}``). Mappings and lists are inserted as JSON (NeMo Gym's
``nemo_gym.prompt.fill_prompt`` inserts their ``str()``, and uses this same code with ``json_values=False``). A row
that lacks a field is an error naming the fields it does have. A row that already has ``responses_create_params.input``
is an error too: rendering over an existing prompt would silently discard it.

Rendered rows keep every other field, keep their other create params, and record ``prompt_config_used``.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import ConfigDict, Field

from nemo_gym.config.command_config import BaseNeMoGymCLIConfig
from nemo_gym.config.roots import find_path
from nemo_gym.datasets.validation import CREATE_PARAMS_KEY, iter_checked_lines
from nemo_gym.errors import ConfigError, ConfigPathNotFoundError
from nemo_gym.jsonl import JsonlWriter

PROMPT_CONFIG_USED_KEY = "prompt_config_used"
TEMPLATE_ROLES = ("system", "user")


class RenderConfig(BaseNeMoGymCLIConfig):
    """Apply a prompt template to raw JSONL rows, producing rows with ``responses_create_params.input``.

    Examples:

        gym dataset render --input data/raw.jsonl --prompt-config prompts/math.yaml --output data/train.jsonl
    """

    model_config = ConfigDict(extra="ignore")

    input_jsonl_fpath: str = Field(description="Raw rows to render (--input).")
    prompt_config: str = Field(description="Prompt YAML with `user` and optional `system` templates (--prompt-config).")
    output_jsonl_fpath: str = Field(description="Where the rendered rows go (--output).")


class PromptRenderError(ConfigError, ValueError):
    """A row cannot be rendered with a prompt template (a missing field, or a prompt already present)."""


class PromptFieldMissingError(PromptRenderError, KeyError):
    """The template names a field the row does not have; a ``KeyError`` too, as ``str.format_map`` would raise."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""  # KeyError would quote the message


@dataclass(frozen=True)
class PromptTemplate:
    """A loaded prompt config: its templates, and the path recorded in rendered rows."""

    user: str
    system: str | None = None
    source: str = "<inline>"
    json_values: bool = True
    """Insert mappings and lists as JSON; False inserts their ``str()``, as NeMo Gym's ``fill_prompt`` does."""

    @classmethod
    def load(cls, path: str | Path) -> PromptTemplate:
        """Read a prompt config YAML (relative paths are also looked up in the search roots)."""
        found = Path(path) if Path(path).is_file() else find_path(path)
        if found is None or not found.is_file():
            raise ConfigPathNotFoundError(f"prompt config {path} does not exist")
        try:
            data = yaml.safe_load(found.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise ConfigError(f"prompt config {path} is not valid YAML: {e}") from e
        if not isinstance(data, dict):
            raise ConfigError(
                f"prompt config {path} must be a mapping with a `user` template (and optionally `system`)"
            )
        unknown = sorted(set(data) - set(TEMPLATE_ROLES))
        if unknown:
            raise ConfigError(f"prompt config {path}: unknown key(s) {', '.join(unknown)}; allowed: system, user")
        if not isinstance(data.get("user"), str):
            raise ConfigError(f"prompt config {path} needs a `user` template (a string)")
        if data.get("system") is not None and not isinstance(data["system"], str):
            raise ConfigError(f"prompt config {path}: `system` must be a string")
        template = cls(user=data["user"], system=data.get("system"), source=str(path))
        template.check()
        return template

    def check(self) -> None:
        """Fail early on templates Python's format syntax cannot parse (a lone ``{`` or ``}``)."""
        for role in TEMPLATE_ROLES:
            text = getattr(self, role)
            if text is None:
                continue
            try:
                fields = [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
            except ValueError as e:
                raise ConfigError(
                    f"prompt config {self.source}: `{role}` template: {e} (write {{{{ and }}}} for literal braces)"
                ) from e
            if "" in fields or any(name.isdigit() for name in fields):
                raise ConfigError(f"prompt config {self.source}: `{role}` template has a positional {{}}; name a field")

    @property
    def fields(self) -> list[str]:
        """The row fields the templates refer to, in order of first use."""
        names: list[str] = []
        for role in TEMPLATE_ROLES:
            text = getattr(self, role)
            for _, name, _, _ in string.Formatter().parse(text or ""):
                if name is not None and name not in names:
                    names.append(name)
        return names

    def fill(self, text: str, row: dict[str, Any]) -> str:
        parts: list[str] = []
        for literal, name, spec, conversion in string.Formatter().parse(text):
            parts.append(literal)
            if name is None:
                continue
            value = _lookup(row, name)
            if conversion == "r":
                value = repr(value)
            elif conversion == "a":
                value = ascii(value)
            elif conversion == "s":
                value = str(value)
            elif isinstance(value, dict | list) and self.json_values:
                value = _as_text(value)
            try:
                parts.append(format(value, spec or ""))
            except (TypeError, ValueError) as e:
                raise PromptRenderError(f"prompt field {{{name}:{spec}}}: {e}") from e
        return "".join(parts)

    def messages(self, row: dict[str, Any]) -> list[dict[str, str]]:
        """The filled-in ``system`` (if any) and ``user`` messages for one row."""
        messages = []
        if self.system is not None:
            messages.append({"role": "system", "content": self.fill(self.system, row)})
        messages.append({"role": "user", "content": self.fill(self.user, row)})
        return messages

    def apply(self, row: dict[str, Any]) -> dict[str, Any]:
        """The rendered row; raises :class:`PromptRenderError` with the reason when the row does not fit."""
        params = row.get(CREATE_PARAMS_KEY)
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise PromptRenderError(f"{CREATE_PARAMS_KEY} must be a mapping, got {type(params).__name__}")
        if "input" in params:
            raise PromptRenderError(
                f"the row already has {CREATE_PARAMS_KEY}.input; render raw rows only (remove the input or the prompt)"
            )
        rendered = dict(row)
        rendered[CREATE_PARAMS_KEY] = {**params, "input": self.messages(row)}
        rendered[PROMPT_CONFIG_USED_KEY] = self.source
        return rendered


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _lookup(row: dict[str, Any], name: str) -> Any:
    """``name`` (``a`` or ``a.b.c``) in the row, or a PromptRenderError listing what is there."""
    if "[" in name:
        raise PromptRenderError(f"prompt field {{{name}}}: indexing is not supported; use a dotted path (a.b)")
    node: Any = row
    walked: list[str] = []
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            scope = f" in {'.'.join(walked)}" if walked else ""
            available = ", ".join(sorted(str(k) for k in node)) if isinstance(node, dict) else "none"
            raise PromptFieldMissingError(
                f"prompt field {{{name}}} is missing: the row has no {part!r}{scope} (available: {available})"
            )
        node = node[part]
        walked.append(part)
    return node


@dataclass
class RenderResult:
    output_path: Path
    rows: int


def render_file(input_path: Path, prompt_config: str | Path, output_path: Path) -> RenderResult:
    """Render every row of ``input_path`` into ``output_path``; all problems are reported, nothing partial is left."""
    template = PromptTemplate.load(prompt_config)
    if input_path.resolve() == output_path.resolve():
        raise ConfigError(f"--output must differ from --input ({input_path})")
    problems: list[str] = []
    temporary = output_path.with_name(f".{output_path.name}.tmp")
    count = 0
    with JsonlWriter(temporary, append=False) as writer:
        for line in iter_checked_lines(input_path):
            where = f"{input_path}:{line.number}"
            if line.row is None:
                problems.append(f"{where}: {line.problem}")
                continue
            try:
                writer.write(template.apply(line.row))
            except PromptRenderError as e:
                problems.append(f"{where}: {e}")
                continue
            count += 1
    if problems:
        temporary.unlink(missing_ok=True)
        raise PromptRenderError(f"{len(problems)} row(s) of {input_path} cannot be rendered:\n" + "\n".join(problems))
    temporary.replace(output_path)
    return RenderResult(output_path, count)
