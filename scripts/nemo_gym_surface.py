"""List every ``nemo_gym`` name that a NeMo Gym release's own server folders import, as a data file for the tests.

Two modes:

``SOURCE`` (a ``nemo_gym-*.whl`` file, or a directory: an unpacked wheel or a checkout)
    reads the ``.py`` files of the five folder kinds (``resources_servers``, ``responses_api_agents``,
    ``responses_api_models``, ``environment_servers``, ``environments``), collects every ``from nemo_gym... import X``
    and ``import nemo_gym...`` in their syntax trees (function bodies and ``if TYPE_CHECKING:`` blocks included) and
    prints one ``module: name  # N folders`` line per pair, N being how many ``<kind>/<name>`` folders import it.
    A bare ``import nemo_gym.x`` is written with an empty name (``nemo_gym.x:``): the module itself is what is used.

``--pending SURFACE_FILE``
    prints the ``module: name`` lines of that file that do not import from this checkout's ``nemo_gym`` now, with the
    header of ``tests/public_api/nemo_gym_07_pending.txt``. It must agree with
    ``tests/unit/test_nemo_gym_07_surface.py``, which asks the same question (``from module import name``).

Usage (from the repository root)::

    pip download --no-deps --python-version 3.13.14 --only-binary=:all: nemo-gym==0.7.0 -d /tmp/ng07
    .venv/bin/python scripts/nemo_gym_surface.py /tmp/ng07/nemo_gym-0.7.0-py3-none-any.whl \\
        > tests/public_api/nemo_gym_07_surface.txt
    .venv/bin/python scripts/nemo_gym_surface.py --pending tests/public_api/nemo_gym_07_surface.txt \\
        > tests/public_api/nemo_gym_07_pending.txt
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import re
import sys
import zipfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

KINDS = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers", "environments")
SURFACE_LINE = re.compile(r"^(?P<module>[\w.]+):(?P<name> \w+|\s*)\s*#\s*(?P<count>\d+) folders$")


def _python_files(source: Path) -> Iterator[tuple[str, str]]:
    """(path inside the source, text) of every .py file under the five folder kinds."""
    if source.is_file():
        with zipfile.ZipFile(source) as wheel:
            for member in sorted(wheel.namelist()):
                if member.endswith(".py") and member.split("/", 1)[0] in KINDS:
                    yield member, wheel.read(member).decode("utf-8")
        return
    for kind in KINDS:
        for path in sorted((source / kind).rglob("*.py")):
            yield path.relative_to(source).as_posix(), path.read_text(encoding="utf-8")


def _imported(tree: ast.AST) -> set[tuple[str, str]]:
    """Every (module, name) of nemo_gym that the tree imports, wherever the import statement sits."""
    pairs: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "nemo_gym" or node.module.startswith("nemo_gym."):
                pairs.update((node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "nemo_gym" or alias.name.startswith("nemo_gym."):
                    pairs.add((alias.name, ""))
    return pairs


def collect(source: Path) -> tuple[dict[tuple[str, str], set[str]], set[str]]:
    """(module, name) -> the folders that import it, and every folder that has Python files."""
    importers: dict[tuple[str, str], set[str]] = defaultdict(set)
    folders: set[str] = set()
    for path, text in _python_files(source):
        parts = path.split("/")
        folder = "/".join(parts[:2])  # a file right under <kind>/ (environments/__init__.py) stands for itself
        if len(parts) > 2:
            folders.add(folder)
        for pair in _imported(ast.parse(text, filename=path)):
            importers[pair].add(folder)
    return importers, folders


def _describe(source: Path) -> tuple[str, list[str]]:
    """(version, where the list comes from): the wheel's file name, sha256 and file dates, or the directory."""
    if source.is_file():
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        with zipfile.ZipFile(source) as wheel:
            names = wheel.namelist()
            metadata = next(wheel.read(n).decode() for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
            built = datetime.date(*max(info.date_time for info in wheel.infolist())[:3])
        found = re.search(r"^Version: (.+)$", metadata, re.M)
        version = found.group(1) if found else "?"
        return version, [
            f"PyPI's nemo-gym {version}, the wheel {source.name}",
            f"(sha256 {digest}, its files dated {built.isoformat()})",
        ]
    version = "?"
    for metadata_path in source.glob("*.dist-info/METADATA"):
        found = re.search(r"^Version: (.+)$", metadata_path.read_text(), re.M)
        version = found.group(1) if found else version
    return version, [f"NeMo Gym {version}, the directory {source.resolve()}"]


def surface(source: Path) -> str:
    importers, folders = collect(source)
    rows = sorted(importers.items(), key=lambda item: (-len(item[1]), item[0]))
    modules = {module for module, _ in importers}
    importing = set().union(*importers.values()) & folders
    version, origin = _describe(source)
    short = "".join(version.split(".")[:2])
    wheel = source.name if source.is_file() else "nemo_gym-VERSION-py3-none-any.whl"
    header = [
        f"# The nemo_gym names that NeMo Gym {version}'s own server folders import, one `module: name` a line, with how",
        "# many folders import each, most used first. Source: " + origin[0],
        *(f"# {line}" for line in origin[1:]),
        f"# read on {datetime.date.today().isoformat()}: every `from nemo_gym... import` and `import nemo_gym...`",
        "# (function bodies and TYPE_CHECKING blocks included) in the .py files of",
        "# " + ", ".join(f"{kind}/" for kind in KINDS) + ";",
        "# a folder is <kind>/<name>. An empty name is a bare `import module`. Regenerate from the repository root with",
        f"#   pip download --no-deps --python-version 3.13.14 --only-binary=:all: nemo-gym=={version} -d /tmp/ng",
        f"#   .venv/bin/python scripts/nemo_gym_surface.py /tmp/ng/{wheel} > tests/public_api/nemo_gym_{short}_surface.txt",
        f"# Checked by tests/unit/test_nemo_gym_{short}_surface.py; the names not provided yet are in",
        f"# nemo_gym_{short}_pending.txt.",
        f"# Totals: {len(rows)} names, {len(modules)} modules, {len(importing)} importing folders of {len(folders)} with"
        " Python files.",
    ]
    lines = [f"{module}: {name}  # {len(used)} folders" if name else f"{module}:  # {len(used)} folders"
             for (module, name), used in rows]  # fmt: skip
    return "\n".join(header + lines) + "\n"


def read_surface(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, folders) of each line of a surface file."""
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = SURFACE_LINE.match(line)
        if match is None:
            raise ValueError(f"{path.name}:{number}: expected 'module: name  # N folders', got {line!r}")
        entries.append((match["module"], match["name"].strip(), int(match["count"])))
    return entries


def resolves(module: str, name: str) -> bool:
    """Whether ``from module import name`` (``import module`` for an empty name) works here."""
    try:
        exec(f"from {module} import {name}" if name else f"import {module}", {})
    except ImportError:
        return False
    return True


def pending(surface_file: Path) -> str:
    missing = [(m, n) for m, n, _ in read_surface(surface_file) if not resolves(m, n)]
    header = [
        f"# The `module: name` pairs of {surface_file.name} that our nemo_gym does not provide yet. This list may only",
        "# shrink: tests/unit/test_nemo_gym_07_surface.py fails when a name here starts to import (remove it) and when",
        "# a name missing from here does not import. Regenerate it from the repository root with",
        f"#   .venv/bin/python scripts/nemo_gym_surface.py --pending tests/public_api/{surface_file.name} \\",
        "#     > tests/public_api/nemo_gym_07_pending.txt",
        f"# {len(missing)} pending on {datetime.date.today().isoformat()}.",
    ]
    return "\n".join(header + [f"{m}: {n}".rstrip() for m, n in missing]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("source", nargs="?", type=Path, help="a nemo_gym wheel file, an unpacked one, or a checkout")
    parser.add_argument("--pending", type=Path, metavar="SURFACE_FILE", help="print the names that do not import now")
    args = parser.parse_args(argv)
    if (args.source is None) == (args.pending is None):
        parser.error("give either SOURCE or --pending SURFACE_FILE")
    if args.pending is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's nemo_gym, wherever it runs from
        sys.stdout.write(pending(args.pending))
    else:
        sys.stdout.write(surface(args.source))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
