"""Bases shared by the Responses (`openai_utils`) and Chat Completions (`openai_chat_utils`) schemas.

Kept separate so the two schema modules can both import them without importing each other in a cycle.
"""

import functools
from collections.abc import Iterator, Mapping
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

TOKEN_ID_FIELDS: tuple[str, str, str] = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
"""Fields a training item carries; all three or none."""
REQUIRED_TOKEN_METADATA_FIELDS: frozenset[str] = frozenset(TOKEN_ID_FIELDS)
"""NeMo Gym's name for the token fields a training item must carry together."""
TOKEN_METADATA_FIELDS: frozenset[str] = REQUIRED_TOKEN_METADATA_FIELDS | {"routed_experts"}
"""Every token-level field NeMo Gym knows of: the required three, and a mixture-of-experts engine's optional
``routed_experts``."""

RoutedExperts = str | list[list[list[int]]]
"""Per generated token, the experts each MoE layer routed it to (``[tokens][layers][top_k]``), or a framework's opaque
string encoding of that array: Gym only carries it from the engine to the trainer, so it never decodes the string."""

ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


_MISSING: Any = object()


def get_field(value: Any, key: str) -> Any:
    """Read `key` from a raw dict or a built model: validators and converters see both shapes.

    Runs for every item of every validation and serialization (union discriminators), so models are read from their
    `__dict__` first: `getattr` on a missing field goes through pydantic's `__getattr__`, which raises and catches.
    """
    if isinstance(value, dict):
        return value.get(key)
    if isinstance(value, BaseModel):
        found = value.__dict__.get(key, _MISSING)
        if found is not _MISSING:
            return found
        extra = value.__pydantic_extra__
        if extra and key in extra:
            return extra[key]
        if not _class_has(type(value), key):  # not a property or class attribute either
            return None
    return getattr(value, key, None)


@functools.cache
def _class_has(cls: type, key: str) -> bool:
    # Cached: pydantic's metaclass answers a missing attribute by raising, which costs more than the lookup itself.
    return hasattr(cls, key)


def has_token_id_information(value: Any) -> bool:
    """True if a dict or model carries any (non-null) token field, i.e. it must be a ForTraining variant."""
    if isinstance(value, dict):
        get = value.get
        return (
            get("prompt_token_ids") is not None
            or get("generation_token_ids") is not None
            or get("generation_log_probs") is not None
        )
    return any(get_field(value, key) is not None for key in TOKEN_ID_FIELDS)


def _drop_unknown_null_fields(model: type[BaseModel], data: Any) -> Any:
    """Remove keys the model does not declare whose value is null: they carry no information, and newer `openai`
    SDKs dump every optional field they know as null, so keeping them would break strict models and bloat dumps.

    A model of another class (an `openai` SDK object such as `FunctionTool`, or one of ours of a sibling class) is
    read as its dump first, so request models accept the SDK's own objects as well as plain dicts."""
    if isinstance(data, BaseModel) and not isinstance(data, model):
        data = data.model_dump(exclude_unset=True)
    if not isinstance(data, dict) or None not in data.values():  # the common case, decided in C
        return data
    fields = model.__pydantic_fields__
    if fields.keys() >= data.keys():  # every key declared (a dump of a model, say): nothing to drop, decided in C
        return data
    if any(value is None and key not in fields for key, value in data.items()):
        return {key: value for key, value in data.items() if value is not None or key in fields}
    return data


def is_none(value: object) -> bool:
    """Fields that newer OpenAI APIs added are left out of a dump while unset, so what an environment written for
    NeMo Gym (on openai 2.7) reads and compares has exactly the keys it expects."""
    return value is None


class NeMoGymStrictModel(BaseModel):
    """Base for wire items and request parts: unknown keys are errors, unless their value is null.

    Tolerating exactly the null ones keeps round-trips through any SDK version working, while a real unknown value
    (a typo, a wrong item shape) still fails validation.
    """

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def drop_unknown_null_fields(cls, data: Any) -> Any:
        if type(data) is dict and None not in data.values():  # the common case, without a second call
            return data
        return _drop_unknown_null_fields(cls, data)


class AttributeReadDict(dict[str, Any]):
    """A dict whose keys also read as attributes, with a trailing ``_`` for a key the SDK's model renames.

    The Responses ``text.format`` stays a dict (its ``schema`` key is no name a pydantic field can have, and it is
    forwarded as given), while code written for the SDK's typed config reads ``format.schema_`` or ``format.name``.
    """

    def __getattr__(self, name: str) -> Any:
        for key in (name, name.removesuffix("_")):
            if key in self:
                return self[key]
        raise AttributeError(name)


def as_attribute_read_dict(value: Any) -> Any:
    """``value`` as an :class:`AttributeReadDict` when it is a dict (a validator's last step)."""
    return AttributeReadDict(value) if type(value) is dict else value


class KeyAccessMixin:
    """Lets a request-side model be read like the SDK's TypedDict it stands for: ``message["role"]``,
    ``message.get("tool_calls")``, ``"name" in message``, ``{**message}``, ``message["content"] = ...``.

    NeMo Gym's Chat request types are TypedDicts, so code written for it indexes messages and tool calls; ours stay
    validated models and answer the same reads. A key is present when it was given or holds a value: an optional
    field left unset is absent, as it would be from the dict. They also count as a ``Mapping`` (``isinstance`` checks
    code makes before reading a dict pass) and iterate over their keys, as the dict would."""

    def _present_keys(self) -> list[str]:
        model: Any = self
        given = model.model_fields_set
        keys = [name for name in type(model).model_fields if name in given or getattr(model, name) is not None]
        return keys + list(model.__pydantic_extra__ or ())

    def keys(self) -> list[str]:
        return self._present_keys()

    def __getitem__(self, key: str) -> Any:
        if key not in self._present_keys():
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)

    def __contains__(self, key: object) -> bool:
        return key in self._present_keys()

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self._present_keys() else default

    def __iter__(self) -> Iterator[str]:  # a dict's iteration (keys), not BaseModel's (name, value) pairs
        return iter(self._present_keys())

    def __len__(self) -> int:
        return len(self._present_keys())

    def items(self) -> list[tuple[str, Any]]:
        return [(key, getattr(self, key)) for key in self._present_keys()]

    def values(self) -> list[Any]:
        return [getattr(self, key) for key in self._present_keys()]

    def __eq__(self, other: object) -> bool:
        """Equal to the dict it stands for, as NeMo Gym's TypedDict would be (its tests compare the two)."""
        if isinstance(other, dict):
            return _as_dict_reads(self) == other
        return super().__eq__(other)  # NotImplemented (for a str, say) must reach Python as it is, not as True

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dict it stands for


Mapping.register(KeyAccessMixin)


class NeMoGymKeyedModel(KeyAccessMixin, NeMoGymStrictModel):  # type: ignore[misc]  # __iter__: the dict's
    """A strict model shared by a request (where the SDK has a TypedDict: reasoning, tools, text) and a response (where it
    has a model): it reads like the dict and equals it, while its dumps keep every field, as the response's would."""


class NeMoGymRequestPart(NeMoGymKeyedModel):
    """A strict request-side model that stands for one of the SDK's TypedDicts: it reads like that dict, equals it,
    and dumps to it: only the keys that were given or hold a value (an unset ``name`` is absent, not ``null``)."""

    @model_serializer(mode="wrap")
    def _dump_present_keys(self, handler: SerializerFunctionWrapHandler) -> Any:
        dumped = handler(self)
        if not isinstance(dumped, dict):
            return dumped
        present = self._present_keys()
        return {key: value for key, value in dumped.items() if key in present}


def _as_dict_reads(value: Any) -> Any:
    """``value`` as its dict reads give it: present keys only, nested request models and lists likewise."""
    if isinstance(value, KeyAccessMixin):
        return {key: _as_dict_reads(value[key]) for key in value.keys()}
    if isinstance(value, list):
        return [_as_dict_reads(item) for item in value]
    return value


class NeMoGymLenientModel(BaseModel):
    """Base for response envelopes: like the SDK, keep unknown keys (provider additions must survive a pass-through),
    but drop unknown null ones so an SDK round-trip does not grow the object."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def drop_unknown_null_fields(cls, data: Any) -> Any:
        if type(data) is dict and None not in data.values():  # the common case, without a second call
            return data
        return _drop_unknown_null_fields(cls, data)


class TokenIDLogProbMixin(BaseModel):
    """Token-level record of one generation, needed by RL trainers to compute policy gradients.

    Mix in *before* the item class so these fields dump last. A partial record is useless to a trainer (and usually a
    bug upstream), so the three fields are all-or-nothing; ``routed_experts`` (mixture-of-experts engines only) may
    come with them, and is left out of dumps when absent.
    """

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    routed_experts: RoutedExperts | None = Field(default=None, exclude_if=is_none)

    @model_validator(mode="before")
    @classmethod
    def require_all_token_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            missing = [key for key in TOKEN_ID_FIELDS if data.get(key) is None]
            if missing and len(missing) < len(TOKEN_ID_FIELDS):
                raise ValueError(
                    f"{', '.join(TOKEN_ID_FIELDS)} must be given together (all or none); missing: {', '.join(missing)}"
                )
        return data

    @model_validator(mode="after")
    def check_generation_lengths(self) -> Self:
        if len(self.generation_token_ids) != len(self.generation_log_probs):
            raise ValueError(
                f"generation_token_ids ({len(self.generation_token_ids)}) and generation_log_probs "
                f"({len(self.generation_log_probs)}) must have the same length"
            )
        return self
