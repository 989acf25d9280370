"""`gym view` and the legacy `ng_viewer +jsonl_fpath=...` serve the same app; user errors are one line."""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import pytest

from nemo_gym.cli.main import main
from tests.viewer import rows

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.read().decode()


def test_ng_viewer_opens_the_same_app(tmp_path: Path, start_viewer) -> None:
    path = rows.run_files(tmp_path, "legacy_run", {0: 1.0, 1: 0.0})
    script = Path(sys.executable).with_name("ng_viewer")
    command = [str(script)] if script.exists() else [sys.executable, "-c",
               "import sys; from nemo_gym.cli.legacy import main; sys.exit(main(['ng_viewer', *sys.argv[1:]]))"]  # fmt: skip
    legacy = start_viewer(f"+jsonl_fpath={path}", command=command)
    modern = start_viewer(path)
    assert legacy.url.startswith("http://127.0.0.1:")
    for viewer in (legacy, modern):
        overview = _page(viewer.url + "/run/0")
        assert "legacy_run" in overview and 'id="num-rollouts">2<' in overview
    assert legacy.status()["runs"] == modern.status()["runs"]


def test_a_missing_file_is_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(tmp_path / "nope.jsonl")]) == 1
    err = capsys.readouterr().err
    assert "nope.jsonl" in err and "is not a file" in err and "Traceback" not in err
    assert main(["view"]) == 1
    assert "no rollout file given" in capsys.readouterr().err
    assert main(["view", "+other=1"]) == 1
    assert "+jsonl_fpath=PATH" in capsys.readouterr().err
