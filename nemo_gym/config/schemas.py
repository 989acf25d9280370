"""The keys and value types a server implementation accepts, read from its source without importing it.

Every server runs in its own virtualenv, so its ``app.py`` may import what the CLI's environment lacks (llama.cpp,
reasoning-gym, a user's private packages); importing it here would also be slow and could have side effects. So the
config class is read with :mod:`ast` instead:

* the server class is the one whose ``run_webserver()`` the entrypoint calls (else the last class with a ``config:``
  annotation), and its ``config: SomeConfig`` annotation (its own or a base's) names the config class;
* the fields of that class and of its bases are the annotated names of their bodies. A base defined in another file
  is followed into that file (found beside the implementation's root, or in the framework); one from a module that
  is safe to import (``pydantic``, ``typing``, the config models of ``nemo_gym.config``) is used as the real class;
* annotations and ``Field(...)`` constraints are evaluated in a namespace that only holds those safe modules, the
  module's own aliases (``GradingMode = Literal[...]``) and classes read the same way. An annotation that cannot be
  evaluated so is typed ``Any``: its key is still known, only its type goes unchecked.

A schema is *open* (unknown keys are not reported) when a base cannot be followed or a class allows extra keys,
since such a class may legitimately read keys this reading cannot see. Validators are not reproduced: the server
still checks its own config when it starts.
"""

from __future__ import annotations

import ast
import builtins
import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ForwardRef, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, create_model
from pydantic.fields import FieldInfo

import nemo_gym
from nemo_gym.config.roots import candidate_paths

SAFE_MODULES = frozenset(
    {
        "typing", "typing_extensions", "collections.abc", "enum", "pathlib", "datetime", "decimal", "uuid",
        "pydantic", "annotated_types", "nemo_gym.config_types", "nemo_gym.config.server_models",
        "nemo_gym.config.datasets",
    }
)  # fmt: skip
"""Modules whose names are taken as real objects: importing them runs no server code and costs nothing new."""

_FRAMEWORK_ROOT = Path(nemo_gym.__file__).resolve().parent.parent


class _Unresolved(Exception):
    """A name or expression that this static reading cannot evaluate."""


@dataclass(frozen=True)
class FieldSpec:
    """One declared key: its type (``Any`` if unknown), its constraints (``ge=1`` ...) and whether it is required."""

    annotation: Any
    constraints: tuple[Any, ...] = ()
    required: bool = False


@dataclass
class ServerSchema:
    """What one implementation's config class declares."""

    class_name: str
    fields: dict[str, FieldSpec]
    open: bool
    """Unknown keys cannot be judged (a base was not followed, or extra keys are allowed)."""
    _model: type[BaseModel] | None = field(default=None, repr=False)

    def model(self, optional: frozenset[str] = frozenset()) -> type[BaseModel]:
        """A pydantic model that checks the declared types and constraints; ``optional`` keys are never required.

        Defaults are not carried over (only given keys are checked, and a default factory may need the module)."""
        if self._model is None:
            definitions: dict[str, Any] = {}
            for key, spec in self.fields.items():
                typed = Annotated[(spec.annotation, *spec.constraints)] if spec.constraints else spec.annotation
                definitions[key] = (typed, ... if spec.required and key not in optional else None)
            self._model = create_model(
                self.class_name, __config__=ConfigDict(extra="ignore", arbitrary_types_allowed=True), **definitions
            )
        return self._model


def find_server_schema(implementation_dir: Path, entrypoint: str) -> ServerSchema | None:
    """The config schema of the server in ``implementation_dir/entrypoint``, or None when it cannot be read."""
    path = implementation_dir / entrypoint
    if not path.is_file():
        return None
    reader = _Reader(implementation_dir.resolve().parent.parent)
    try:
        module = reader.module_at(path.resolve())
        server_class = _server_class_name(module.tree)
        if server_class is None:
            return None
        found = reader.config_annotation(module, server_class)
        if found is None:
            return None
        config_module, annotation = found
        info = reader.class_info_of(config_module, annotation)
    except (_Unresolved, SyntaxError, OSError, UnicodeDecodeError, RecursionError):
        return None
    except Exception:  # source this reading cannot make sense of: no schema, so nothing is reported for it
        return None
    return ServerSchema(info.name, info.fields, info.open)


def implementation_dir(server_type: str, implementation: str) -> Path | None:
    """``<root>/<server_type>/<implementation>`` in the first search root that has it (as the launcher finds it)."""
    for candidate in candidate_paths(Path(server_type) / implementation):
        if candidate.is_dir():
            return candidate.resolve()
    return None


def _server_class_name(tree: ast.Module) -> str | None:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "run_webserver"
            and isinstance(node.func.value, ast.Name)
        ):
            return node.func.value.id
    with_config = [
        node.name for node in tree.body if isinstance(node, ast.ClassDef) and _config_annotation_in(node) is not None
    ]
    return with_config[-1] if with_config else None


def _config_annotation_in(node: ast.ClassDef) -> ast.expr | None:
    for statement in node.body:
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and statement.target.id == "config"
        ):
            return statement.annotation
    return None


@dataclass
class _ClassInfo:
    name: str
    fields: dict[str, FieldSpec]
    open: bool
    model: type[BaseModel]


class _Module:
    """One source file: its classes, module-level assignments and imports, and the values evaluated so far."""

    def __init__(self, path: Path, package: str) -> None:
        self.path = path
        self.package = package
        self.tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        self.classes: dict[str, ast.ClassDef] = {}
        self.assigns: dict[str, ast.expr] = {}
        self.imports: dict[str, tuple[str, str | None]] = {}
        """Local name -> (absolute module, attribute or None for ``import module``)."""
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.assigns[node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self.assigns[node.target.id] = node.value
            elif isinstance(node, ast.ImportFrom):
                base = self._absolute(node.module or "", node.level)
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (base, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.imports[alias.asname] = (alias.name, None)
                    else:
                        top = alias.name.split(".")[0]
                        self.imports[top] = (top, None)
        self.values: dict[str, Any] = {}

    def _absolute(self, module: str, level: int) -> str:
        if level == 0:
            return module
        parts = self.package.split(".") if self.package else []
        parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
        return ".".join([*parts, module] if module else parts)


class _Namespace(Mapping[str, Any]):
    """The names an expression of ``module`` sees, each resolved on first use."""

    def __init__(self, reader: _Reader, module: _Module) -> None:
        self.reader = reader
        self.module = module

    def __getitem__(self, name: str) -> Any:
        try:
            return self.reader.value(self.module, name)
        except _Unresolved:
            raise KeyError(name) from None

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


class _Reader:
    """Reads modules on demand from the implementation's root and the framework, each file once."""

    def __init__(self, root: Path) -> None:
        self.roots = [root] if root == _FRAMEWORK_ROOT else [root, _FRAMEWORK_ROOT]
        self._modules: dict[Path, _Module] = {}
        self._classes: dict[tuple[Path, str], _ClassInfo | None] = {}

    def module_at(self, path: Path) -> _Module:
        module = self._modules.get(path)
        if module is None:
            package = ""
            for root in self.roots:
                if path.is_relative_to(root):
                    package = ".".join(path.parent.relative_to(root).parts)
                    break
            module = self._modules[path] = _Module(path, package)
        return module

    def module_named(self, name: str) -> _Module:
        relative = Path(*name.split("."))
        # The framework's own modules are read from the package actually imported: a tree holding another copy of
        # ``nemo_gym`` beside its servers (an unpacked release) would otherwise lend that copy's fields.
        roots = [_FRAMEWORK_ROOT] if name.split(".")[0] == nemo_gym.__name__ else self.roots
        for root in roots:
            for candidate in (root / relative.with_suffix(".py"), root / relative / "__init__.py"):
                if candidate.is_file():
                    return self.module_at(candidate.resolve())
        raise _Unresolved(name)

    # -- names and expressions -----------------------------------------------------------------------------------

    def value(self, module: _Module, name: str) -> Any:
        if name in module.values:
            if module.values[name] is _Unresolved:  # a name that refers to itself, directly or not
                raise _Unresolved(name)
            return module.values[name]
        module.values[name] = _Unresolved
        try:
            result = self._compute(module, name)
        except _Unresolved:
            del module.values[name]
            raise
        module.values[name] = result
        return result

    def _compute(self, module: _Module, name: str) -> Any:
        if name in module.classes:
            members = _enum_values(module.classes[name])
            if members is not None:  # an enum field takes its members' values, as pydantic validates it
                return Literal[members]
            info = self.class_info(module, name)
            return info.model
        if name in module.assigns:
            return self.evaluate(module, module.assigns[name])
        if name in module.imports:
            source, attribute = module.imports[name]
            if source in SAFE_MODULES:
                imported = importlib.import_module(source)
                return imported if attribute is None else getattr(imported, attribute)
            if attribute is None:
                raise _Unresolved(name)
            return self.value(self.module_named(source), attribute)
        if hasattr(builtins, name) and isinstance(getattr(builtins, name), type):
            return getattr(builtins, name)
        if name in ("None", "True", "False", "Ellipsis"):
            return {"None": None, "True": True, "False": False, "Ellipsis": ...}[name]
        raise _Unresolved(name)

    def evaluate(self, module: _Module, expression: ast.expr) -> Any:
        if isinstance(expression, ast.Constant) and isinstance(expression.value, str):
            text = expression.value
            try:  # a string annotation: "Foo | None"
                expression = ast.parse(text, mode="eval").body
            except SyntaxError:
                raise _Unresolved(text) from None
        if any(isinstance(node, (ast.Lambda, ast.NamedExpr, ast.Await)) for node in ast.walk(expression)):
            raise _Unresolved("expression with code")
        code = compile(ast.Expression(expression), str(module.path), "eval")
        try:
            # Only names of the safe modules and of source read statically are visible; no builtins.
            return eval(code, {"__builtins__": {}}, _Namespace(self, module))
        except Exception as e:
            raise _Unresolved(ast.unparse(expression)) from e

    # -- classes -------------------------------------------------------------------------------------------------

    def config_annotation(self, module: _Module, class_name: str, depth: int = 0) -> tuple[_Module, ast.expr] | None:
        """The ``config:`` annotation of a server class or of the nearest base that has one."""
        node = module.classes.get(class_name)
        if node is None or depth > 20:
            return None
        annotation = _config_annotation_in(node)
        if annotation is not None:
            return module, annotation
        for base in node.bases:
            located = self._locate_class(module, base)
            if located is not None:
                found = self.config_annotation(*located, depth + 1)
                if found is not None:
                    return found
        return None

    def _locate_class(self, module: _Module, expression: ast.expr) -> tuple[_Module, str] | None:
        """The module and name of a class written as ``Name`` (or ``"Name"``) in ``module``, following imports into
        source files."""
        if isinstance(expression, ast.Constant) and isinstance(expression.value, str):
            expression = ast.Name(id=expression.value.strip())
        if not isinstance(expression, ast.Name):
            return None
        name = expression.id
        for _ in range(20):
            if name in module.classes:
                return module, name
            if name not in module.imports or module.imports[name][0] in SAFE_MODULES:
                return None
            source, attribute = module.imports[name]
            if attribute is None:
                return None
            try:
                module = self.module_named(source)
            except _Unresolved:
                return None
            name = attribute
        return None

    def class_info_of(self, module: _Module, annotation: ast.expr) -> _ClassInfo:
        located = self._locate_class(module, annotation)
        if located is not None:
            return self.class_info(*located)
        real = self.evaluate(module, annotation)
        if isinstance(real, type) and issubclass(real, BaseModel):
            return _real_class_info(real)
        raise _Unresolved(ast.unparse(annotation))

    def class_info(self, module: _Module, name: str) -> _ClassInfo:
        key = (module.path, name)
        if key in self._classes:
            cached = self._classes[key]
            if cached is None:
                raise _Unresolved(f"{name} (inherits from itself)")
            return cached
        self._classes[key] = None
        try:
            info = self._read_class(module, module.classes[name])
        except _Unresolved:
            del self._classes[key]
            raise
        self._classes[key] = info
        return info

    def _read_class(self, module: _Module, node: ast.ClassDef) -> _ClassInfo:
        fields: dict[str, FieldSpec] = {}
        is_open = False
        is_model = False
        for base in node.bases:
            located = self._locate_class(module, base)
            if located is not None:
                try:
                    inherited = self.class_info(*located)
                except _Unresolved:
                    is_open = True
                    continue
            else:
                try:
                    real = self.evaluate(module, base)
                except _Unresolved:
                    is_open = True
                    continue
                if not (isinstance(real, type) and issubclass(real, BaseModel)):
                    is_open = True
                    continue
                inherited = _real_class_info(real)
            is_model = True
            fields.update(inherited.fields)
            is_open = is_open or inherited.open
        if not is_model and not is_open:
            raise _Unresolved(f"{node.name} is not a pydantic model")
        for statement in node.body:
            if _allows_extra(statement):
                is_open = True
            if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
                continue
            key = statement.target.id
            if key.startswith("_") or _is_class_var(statement.annotation):
                continue
            fields[key] = self._field(module, statement.annotation, statement.value)
        try:
            model = ServerSchema(node.name, fields, is_open).model()
        except Exception as e:  # a field type pydantic cannot build here
            raise _Unresolved(node.name) from e
        return _ClassInfo(node.name, fields, is_open, model)

    def _field(self, module: _Module, annotation: ast.expr, value: ast.expr | None) -> FieldSpec:
        """A field's type, its ``Field(...)`` constraints, and whether it is required (no default in the source)."""
        try:
            typed = self.evaluate(module, annotation)
        except _Unresolved:
            typed = Any
        if _has_forward_ref(typed):
            typed = Any  # a name left as a string pydantic would have to resolve in the real module
        if value is None:
            return FieldSpec(typed, required=True)
        if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "Field"):
            return FieldSpec(typed)
        given = bool(value.args) and not (isinstance(value.args[0], ast.Constant) and value.args[0].value is ...)
        has_default = given or any(k.arg in ("default", "default_factory") for k in value.keywords)
        # Only the constraints are evaluated: a default (factory) may need names this reading cannot resolve.
        constraints = ast.Call(
            func=value.func,
            args=[],
            keywords=[k for k in value.keywords if k.arg not in ("default", "default_factory", "description")],
        )
        ast.fix_missing_locations(ast.copy_location(constraints, value))
        try:
            info = self.evaluate(module, constraints)
        except _Unresolved:
            info = None
        metadata = tuple(info.metadata) if isinstance(info, FieldInfo) else ()
        return FieldSpec(typed, metadata, required=not has_default)


def _real_class_info(cls: type[BaseModel]) -> _ClassInfo:
    fields = {
        key: FieldSpec(info.annotation, tuple(info.metadata), info.is_required())
        for key, info in cls.model_fields.items()
    }
    return _ClassInfo(cls.__name__, fields, cls.model_config.get("extra") == "allow", cls)


def _has_forward_ref(annotation: Any, depth: int = 0) -> bool:
    if isinstance(annotation, (str, ForwardRef)):
        return True
    if get_origin(annotation) is Literal:  # its arguments are values, not names
        return False
    return depth < 10 and any(_has_forward_ref(arg, depth + 1) for arg in get_args(annotation))


def _enum_values(node: ast.ClassDef) -> tuple[Any, ...] | None:
    """The member values of a class deriving from ``Enum`` (``StrEnum``, ``IntEnum``, ...), None for any other class."""
    base_names = {base.id if isinstance(base, ast.Name) else getattr(base, "attr", "") for base in node.bases}
    if not base_names & {"Enum", "StrEnum", "IntEnum"}:
        return None
    return tuple(
        statement.value.value
        for statement in node.body
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant)
    )


def _is_class_var(annotation: ast.expr) -> bool:
    target = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    if isinstance(target, ast.Attribute):
        return target.attr == "ClassVar"
    if isinstance(target, ast.Name):
        return target.id == "ClassVar"
    return isinstance(annotation, ast.Constant) and str(annotation.value).startswith("ClassVar")


def _allows_extra(statement: ast.stmt) -> bool:
    """``model_config = ConfigDict(extra="allow")`` (or a dict literal saying the same)."""
    if not (
        isinstance(statement, (ast.Assign, ast.AnnAssign))
        and any(
            isinstance(t, ast.Name) and t.id == "model_config"
            for t in (statement.targets if isinstance(statement, ast.Assign) else [statement.target])
        )
    ):
        return False
    value = statement.value
    if isinstance(value, ast.Call):
        return any(
            k.arg == "extra" and isinstance(k.value, ast.Constant) and k.value.value == "allow" for k in value.keywords
        )
    if isinstance(value, ast.Dict):
        return any(
            isinstance(k, ast.Constant) and k.value == "extra" and isinstance(v, ast.Constant) and v.value == "allow"
            for k, v in zip(value.keys, value.values, strict=False)
        )
    return True  # something this reading cannot judge: assume it may allow extra keys
