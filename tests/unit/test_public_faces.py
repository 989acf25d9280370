"""The public faces export exactly the names listed in tests/public_api/faces.txt, and every listed name imports.

A face is a module that keeps one of NeMo Gym's import paths (``nemo_gym.config_types``, ``nemo_gym.server_utils``,
...). Its ``__all__`` is its API: removing a name breaks code written against NeMo Gym, and a name that is importable
but missing from ``__all__`` is an API nobody decided on. Three checks, per face:

* ``__all__`` equals the listed names exactly;
* every listed name can be imported from the face;
* nothing public is left out of ``__all__``: a name without a leading underscore that the face defines (class,
  function, assignment) or imports from a ``nemo_gym`` module. Modules, loggers and third-party imports
  (``BaseModel``, ``Any``, ...) are not counted. A face that needs an internal helper it does not mean to export
  imports it under an ``_underscore`` alias.

After a deliberate change, regenerate the list with ``.venv/bin/python tests/unit/test_public_faces.py`` and review
the diff: a removed line is an API break.
"""

from __future__ import annotations

import ast
import functools
import importlib
import logging
import sys
import types
from pathlib import Path

import pytest

PUBLIC_API_DIR = Path(__file__).resolve().parents[1] / "public_api"
FACES_FILE = PUBLIC_API_DIR / "faces.txt"

FACES = (
    "nemo_gym.base_gymnasium_server",
    "nemo_gym.base_resources_server",
    "nemo_gym.base_responses_api_agent",
    "nemo_gym.base_responses_api_model",
    "nemo_gym.config_types",
    "nemo_gym.global_config",
    "nemo_gym.judge",
    "nemo_gym.mcp_auto_exposure",
    "nemo_gym.metrics",
    "nemo_gym.openai_utils",
    "nemo_gym.path_utils",
    "nemo_gym.profiling",
    "nemo_gym.prompt",
    "nemo_gym.registry",
    "nemo_gym.reward_profile",
    "nemo_gym.rollout_collection",
    "nemo_gym.rollout_correlation",
    "nemo_gym.rollout_observability",
    "nemo_gym.server_utils",
    "nemo_gym.skills",
)

HEADER = """\
# The names each public face of nemo_gym exports (its __all__), one `module: name` per line, sorted.
# Checked by tests/unit/test_public_faces.py: each face's __all__ must equal its lines, and every name must import.
# A removed line is an API break. After a deliberate change run `.venv/bin/python tests/unit/test_public_faces.py`
# to rewrite this file, and review the diff. Other lists in this folder use the same format.
"""


def read_name_list(path: Path) -> dict[str, set[str]]:
    """``module -> names`` from a list in the ``module: name`` format (``#`` comments and blank lines skipped)."""
    names: dict[str, set[str]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        module, sep, name = (part.strip() for part in line.partition(":"))
        assert sep and module and name.isidentifier(), f"{path.name}:{number}: expected `module: name`, got {line!r}"
        names.setdefault(module, set()).add(name)
    return names


def _top_level_statements(tree: ast.Module) -> list[ast.stmt]:
    """The module body, with the bodies of top-level ``if`` / ``try`` blocks (``if TYPE_CHECKING:``) flattened in."""
    statements: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.If):
            statements += [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            statements += [*node.body, *node.orelse, *node.finalbody]
            for handler in node.handlers:
                statements += handler.body
        else:
            statements.append(node)
    return statements


def _bound_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [target.id for target in node.targets if isinstance(target, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "nemo_gym":
        return [alias.asname or alias.name for alias in node.names]
    return []


def public_names(module_name: str) -> set[str]:
    """What a face offers: names it defines or imports from ``nemo_gym``, minus private names, modules and loggers."""
    module = importlib.import_module(module_name)
    tree = ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8"))
    names = {name for node in _top_level_statements(tree) for name in _bound_names(node)}
    names = {name for name in names if not name.startswith("_")}
    return {name for name in names if not isinstance(getattr(module, name, None), (types.ModuleType, logging.Logger))}


@functools.cache
def listed() -> dict[str, set[str]]:
    return read_name_list(FACES_FILE)


def test_the_list_names_every_face_and_nothing_else() -> None:
    assert sorted(listed()) == sorted(FACES)


def test_the_list_is_sorted_and_has_no_duplicates() -> None:
    lines = [line for line in FACES_FILE.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    assert lines == sorted(set(lines))


@pytest.mark.parametrize("face", FACES)
def test_all_equals_the_listed_names(face: str) -> None:
    exported = importlib.import_module(face).__all__
    assert len(exported) == len(set(exported)), f"{face}.__all__ lists a name twice"
    assert sorted(exported) == sorted(listed().get(face, ())), (
        f"{face}.__all__ differs from {FACES_FILE.name}; if the change is deliberate, regenerate the list "
        "(see this test's docstring) and review the diff"
    )


@pytest.mark.parametrize("face", FACES)
def test_every_listed_name_imports(face: str) -> None:
    module = importlib.import_module(face)
    missing = []
    for name in sorted(listed().get(face, ())):
        try:
            exec(f"from {face} import {name}", {})
        except ImportError:
            missing.append(name)
    assert missing == [], f"{face} lists names that do not import"
    assert all(hasattr(module, name) for name in module.__all__)


@pytest.mark.parametrize("face", FACES)
def test_nothing_public_is_left_out_of_all(face: str) -> None:
    left_out = sorted(public_names(face) - set(importlib.import_module(face).__all__))
    assert left_out == [], (
        f"{face} offers names that are not in __all__: add them (and to {FACES_FILE.name}), "
        "or import them under an _underscore alias if they are not API"
    )


def test_a_star_import_gives_exactly_the_listed_names() -> None:
    for face in FACES:
        namespace: dict[str, object] = {}
        exec(f"from {face} import *", namespace)
        assert set(namespace) - {"__builtins__"} == listed()[face], face


def write_faces_file() -> None:
    """Rewrite the list from the faces' current ``__all__`` (run this file as a script)."""
    lines = sorted(f"{face}: {name}" for face in FACES for name in importlib.import_module(face).__all__)
    FACES_FILE.write_text(HEADER + "\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} names to {FACES_FILE}", file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    write_faces_file()
