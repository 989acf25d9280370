"""Every ``nemo_gym`` name that NeMo Gym 0.7.0's own server folders import resolves here, from the same module path.

The list is data, ``tests/public_api/nemo_gym_07_surface.txt``, written by ``scripts/nemo_gym_surface.py`` (its header
says from which wheel). The names still being implemented are listed in ``nemo_gym_07_pending.txt``; the test also
fails when a pending name starts to import, so that list can only shrink and is emptied as the work lands. An entry
with an empty name is a bare ``import module``.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

PUBLIC_API = Path(__file__).resolve().parents[1] / "public_api"
SURFACE_FILE = PUBLIC_API / "nemo_gym_07_surface.txt"
PENDING_FILE = PUBLIC_API / "nemo_gym_07_pending.txt"
REGENERATE = (
    f".venv/bin/python scripts/nemo_gym_surface.py --pending tests/public_api/{SURFACE_FILE.name}"
    f" > tests/public_api/{PENDING_FILE.name}"
)
LINE = re.compile(r"^(?P<module>nemo_gym(\.\w+)*):(?P<name> \w+|)(?P<rest>.*)$")
TOTALS = re.compile(r"^# Totals: (\d+) names, (\d+) modules, (\d+) importing folders of (\d+) with Python files\.$")


def _entries(path: Path) -> list[tuple[str, str, str]]:
    """(module, name, what follows on the line) of each non-comment line."""
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = LINE.match(line)
        assert match, f"{path.name}:{number}: expected 'module: name', got {line!r}"
        entries.append((match["module"], match["name"].strip(), match["rest"]))
    return entries


def _surface() -> list[tuple[str, str, int]]:
    entries = []
    for module, name, rest in _entries(SURFACE_FILE):
        count = re.fullmatch(r"\s+# (\d+) folders", rest)
        assert count, f"{SURFACE_FILE.name}: expected '{module}: {name}  # N folders'"
        entries.append((module, name, int(count[1])))
    return entries


def _pending() -> list[tuple[str, str]]:
    entries = []
    for module, name, rest in _entries(PENDING_FILE):
        assert not rest.strip(), f"{PENDING_FILE.name}: expected '{module}: {name}' alone on its line"
        entries.append((module, name))
    return entries


def _imports(module: str, name: str) -> bool:
    """``from module import name`` (a submodule included), ``import module`` for an empty name: the script's check."""
    try:
        exec(f"from {module} import {name}" if name else f"import {module}", {})
    except ImportError:
        return False
    return True


SURFACE = _surface()
PENDING = frozenset(_pending())


def test_the_list_names_its_source_and_matches_its_totals() -> None:
    header = [line for line in SURFACE_FILE.read_text().splitlines() if line.startswith("#")]
    assert any("nemo_gym-0.7.0-py3-none-any.whl" in line for line in header)
    assert any(re.search(r"sha256 [0-9a-f]{64}", line) for line in header)
    totals = [match for match in map(TOTALS.match, header) if match]
    assert len(totals) == 1, f"{SURFACE_FILE.name} must state its totals once: '# Totals: N names, M modules, ...'"
    names, modules, importing, folders = map(int, totals[0].groups())
    pairs = [(m, n) for m, n, _ in SURFACE]
    assert len(set(pairs)) == len(pairs), "a (module, name) is listed twice"
    assert len(pairs) == names, f"the header says {names} names, the file lists {len(pairs)}"
    assert len({m for m, _ in pairs}) == modules, f"the header says {modules} modules"
    counts = [count for _, _, count in SURFACE]
    assert all(1 <= count <= importing <= folders for count in counts)
    assert counts == sorted(counts, reverse=True), "the lines are sorted by folder count, most used first"


def test_the_pending_list_only_names_listed_pairs() -> None:
    pending = _pending()
    assert len(set(pending)) == len(pending), f"{PENDING_FILE.name} lists a pair twice"
    unknown = sorted(PENDING - {(m, n) for m, n, _ in SURFACE})
    assert not unknown, f"{PENDING_FILE.name} names pairs that {SURFACE_FILE.name} does not have: {unknown}"


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, n, _ in SURFACE], ids=lambda v: str(v) or "<module>")
def test_name_imports_from_its_module(module: str, name: str) -> None:
    if (module, name) in PENDING:
        assert not _imports(module, name), (
            f"{module}: {name} imports now: remove it from {PENDING_FILE.name} (or regenerate it: {REGENERATE})"
        )
    else:
        try:
            importlib.import_module(module)  # a broken module fails here with its own error
        except ModuleNotFoundError as error:  # the module itself missing: the message below says more
            if not f"{module}.".startswith(f"{error.name}."):
                raise
        assert _imports(module, name), (
            f"NeMo Gym 0.7.0's folders import {name or 'the module'} from {module}; it must exist there"
            f" (a name still being written goes in {PENDING_FILE.name})"
        )
