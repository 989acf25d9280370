"""CPU profiling of a server or a rollout, under NeMo Gym's name ``nemo_gym.profiling``.

``Profiler(name=..., base_profile_dir=...)`` samples CPU time with ``yappi`` between ``start()`` and ``stop()``, then
writes into ``base_profile_dir``: ``<name>.callgrind`` (open it with KCachegrind), ``<name>.dot`` and ``<name>.png``
(the call graph, hottest paths only, drawn by ``gprof2dot`` and Graphviz) and ``<name>.log`` (the per-function
table, filtered to lines containing ``required_str`` when it is set).

None of these tools is a dependency of the framework: ``pip install yappi gprof2dot pydot`` and Graphviz's ``dot``
(``apt install graphviz`` / ``brew install graphviz``). Without them ``start()`` says what is missing.
"""

from __future__ import annotations

import importlib
import shutil
from io import StringIO
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel, field_validator

from nemo_gym.errors import UserError as _UserError

__all__ = ["Profiler", "ProfilerDependencyError"]

_MODULES = {"yappi": "yappi", "gprof2dot": "gprof2dot", "pydot": "pydot"}
"""Module to import -> package to install."""
_STATS_COLUMNS = {0: ("name", 200), 1: ("ncall", 10), 2: ("tsub", 8), 3: ("ttot", 8), 4: ("tavg", 8)}
_GRAPH_MIN_PERCENT = 5
"""Nodes and edges below this share of the total time are left out of the call graph."""


class ProfilerDependencyError(_UserError, ModuleNotFoundError):
    """A tool that profiling needs is not installed; the message says how to install it."""


def _require(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise ProfilerDependencyError(
            f"profiling needs the {_MODULES[module]!r} package: pip install {' '.join(_MODULES.values())}"
        ) from e


def _require_dot() -> None:
    if shutil.which("dot") is None:
        raise _UserError(
            "profiling needs Graphviz's `dot` to draw the call graph: apt install graphviz (Linux) or "
            "brew install graphviz (macOS)"
        )


def _filter_stats(table: str, required_str: str | None) -> str:
    """The stats table's header (up to the ``name`` column line), then the rows that mention ``required_str``."""
    kept: list[str] = []
    in_rows = False
    for line in table.splitlines(keepends=True):
        if not in_rows or (required_str and required_str in line):
            kept.append(line)
        in_rows = in_rows or line.startswith("name")
    return "".join(kept)


class Profiler(BaseModel):
    """Profiles the CPU time of this process between :meth:`start` and :meth:`stop`; see the module docstring."""

    name: str
    """Names the output files, so it may not contain spaces."""
    base_profile_dir: Path
    required_str: str | None = None
    """Keep only the stats rows containing this (e.g. a package name), to cut the framework's own frames."""

    @field_validator("name")
    @classmethod
    def _no_spaces(cls, name: str) -> str:
        if " " in name:
            raise ValueError(f"Spaces are not allowed in a profiler name (it names files), got {name!r}")
        return name

    def start(self) -> None:
        """Start sampling CPU time; fails at once if a tool needed by :meth:`stop` is missing."""
        for module in _MODULES:
            _require(module)
        _require_dot()
        yappi: Any = _require("yappi")
        yappi.set_clock_type("CPU")
        yappi.start()
        print(f"Profiling {self.name}: results will be written to {self.base_profile_dir}")

    def stop(self) -> None:
        """Stop sampling and write the results (:meth:`dump`)."""
        yappi: Any = _require("yappi")
        yappi.stop()
        self.dump()
        print(f"Profile of {self.name} written to {self.base_profile_dir}")

    def dump(self) -> None:
        """Write ``<name>.callgrind``, ``.dot``, ``.png`` and ``.log`` from what was sampled so far."""
        yappi: Any = _require("yappi")
        gprof2dot: Any = _require("gprof2dot")
        pydot: Any = _require("pydot")
        self.base_profile_dir.mkdir(parents=True, exist_ok=True)
        out = {suffix: self.base_profile_dir / f"{self.name}.{suffix}" for suffix in ("callgrind", "dot", "png", "log")}

        stats = yappi.get_func_stats()
        stats.save(str(out["callgrind"]), type="CALLGRIND")
        gprof2dot.main(
            argv=[
                "--format=callgrind",
                f"--output={out['dot']}",
                f"--node-thres={_GRAPH_MIN_PERCENT}",
                f"--edge-thres={_GRAPH_MIN_PERCENT}",
                str(out["callgrind"]),
            ]
        )
        (graph,) = pydot.graph_from_dot_file(str(out["dot"]))
        graph.write_png(str(out["png"]))

        table = StringIO()
        stats.print_all(out=table, columns=_STATS_COLUMNS)
        out["log"].write_text(_filter_stats(table.getvalue(), self.required_str))
