"""Every ``nemo_gym`` name that NeMo Gym's own environments import resolves here, from the same module path.

The list is data, ``tests/public_api/nemo_gym_surface.txt`` (its header says where it came from). A name that is still
being implemented goes in ``PENDING``; the test also fails when a pending name starts to import, so the set can only
shrink and is emptied as the work lands.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

SURFACE_FILE = Path(__file__).resolve().parents[1] / "public_api" / "nemo_gym_surface.txt"

# issue 12, in progress: names of the list that do not import yet.
PENDING: frozenset[tuple[str, str]] = frozenset()


def _surface() -> list[tuple[str, str, int]]:
    entries = []
    for number, line in enumerate(SURFACE_FILE.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        entry, _, comment = line.partition("#")
        module, sep, name = entry.partition(":")
        folders = comment.split()[0] if comment.strip() else ""
        assert sep and name.strip() and folders.isdigit(), (
            f"{SURFACE_FILE.name}:{number}: expected 'module: name  # N folders'"
        )
        entries.append((module.strip(), name.strip(), int(folders)))
    return entries


def _imports(module: str, name: str) -> bool:
    try:
        exec(f"from {module} import {name}", {})
    except ImportError:
        return False
    return True


SURFACE = _surface()


def test_the_list_is_whole_and_names_its_source() -> None:
    header = SURFACE_FILE.read_text().split("\n", 5)
    assert any("NVIDIA-NeMo/Gym" in line and "commit" in line for line in header)
    assert len(SURFACE) > 150 and len({(m, n) for m, n, _ in SURFACE}) == len(SURFACE)
    assert PENDING <= {(m, n) for m, n, _ in SURFACE}


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, n, _ in SURFACE], ids=lambda v: str(v))
def test_name_imports_from_its_module(module: str, name: str) -> None:
    if (module, name) in PENDING:
        assert not _imports(module, name), f"{module}: {name} imports now: remove it from PENDING"
    else:
        importlib.import_module(module)  # a broken module fails here with its own error
        assert _imports(module, name), f"NeMo Gym's environments import {name} from {module}; it must exist there"
