"""nemo_gym.profiling: NeMo Gym's Profiler, with its optional tools replaced by fakes (none is a dependency)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from nemo_gym import profiling
from nemo_gym.errors import UserError
from nemo_gym.profiling import Profiler, ProfilerDependencyError

STATS_TABLE = """Clock type: CPU
Ordered by: totaltime, desc

name                                  ncall  tsub      ttot      tavg
resources_servers/mine/app.py:10 verify  4  0.1  0.9  0.2
nemo_gym/server_utils.py:99 request      4  0.2  0.3  0.1
"""


class FakeTools:
    """yappi, gprof2dot and pydot stand-ins that record what the profiler asked of them."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        stats = SimpleNamespace(save=self._save, print_all=lambda out, columns: out.write(STATS_TABLE))
        self.yappi = SimpleNamespace(
            set_clock_type=lambda kind: self.calls.append(("clock", kind)),
            start=lambda: self.calls.append("start"),
            stop=lambda: self.calls.append("stop"),
            get_func_stats=lambda: stats,
        )
        self.gprof2dot = SimpleNamespace(main=self._gprof2dot)
        graph = SimpleNamespace(write_png=lambda path: Path(path).write_bytes(b"\x89PNG"))
        self.pydot = SimpleNamespace(graph_from_dot_file=lambda path: [graph])

    def _save(self, path: str, type: str) -> None:
        self.calls.append(("save", type))
        Path(path).write_text("callgrind")

    def _gprof2dot(self, argv: list[str]) -> None:
        self.calls.append(("gprof2dot", argv[-1]))
        output = next(a.split("=", 1)[1] for a in argv if a.startswith("--output="))
        Path(output).write_text("digraph {}")


@pytest.fixture
def tools(monkeypatch: pytest.MonkeyPatch) -> FakeTools:
    fakes = FakeTools()
    for name in ("yappi", "gprof2dot", "pydot"):
        monkeypatch.setitem(sys.modules, name, getattr(fakes, name))
    monkeypatch.setattr(profiling.shutil, "which", lambda name: f"/usr/bin/{name}")
    return fakes


def test_start_and_stop_write_the_four_outputs(tmp_path: Path, tools: FakeTools) -> None:
    profiler = Profiler(name="task-7", base_profile_dir=tmp_path / "profile", required_str="resources_servers")
    profiler.start()
    profiler.stop()
    names = sorted(p.name for p in (tmp_path / "profile").iterdir())
    assert names == ["task-7.callgrind", "task-7.dot", "task-7.log", "task-7.png"]
    assert tools.calls[:3] == [("clock", "CPU"), "start", "stop"]
    assert ("gprof2dot", str(tmp_path / "profile" / "task-7.callgrind")) in tools.calls
    log = (tmp_path / "profile" / "task-7.log").read_text()
    assert "Clock type: CPU" in log and "ncall" in log  # the header stays
    assert "mine/app.py:10 verify" in log and "server_utils" not in log  # rows filtered by required_str


def test_without_required_str_the_log_keeps_the_header_only(tmp_path: Path, tools: FakeTools) -> None:
    Profiler(name="p", base_profile_dir=tmp_path).dump()
    assert (tmp_path / "p.log").read_text().splitlines()[-1].startswith("name")


def test_a_name_with_spaces_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="Spaces are not allowed"):
        Profiler(name="my task", base_profile_dir=tmp_path)


def test_missing_tools_are_reported_before_anything_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gprof2dot", None)  # an import of it now fails
    profiler = Profiler(name="p", base_profile_dir=tmp_path / "profile")
    with pytest.raises(ProfilerDependencyError, match="pip install yappi gprof2dot pydot") as info:
        profiler.dump()
    assert isinstance(info.value, ModuleNotFoundError) and isinstance(info.value, UserError)
    assert not (tmp_path / "profile").exists()


def test_a_missing_graphviz_is_reported_at_start(
    tmp_path: Path, tools: FakeTools, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(profiling.shutil, "which", lambda name: None)
    with pytest.raises(UserError, match="graphviz"):
        Profiler(name="p", base_profile_dir=tmp_path).start()
    assert "start" not in tools.calls
