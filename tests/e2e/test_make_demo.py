"""`make demo` with the head server's port 11000 held by another process: the real `make` recipe, the real
`gym eval run` line it runs, with DEMO_ARGS swapping in the scripted model (the embedded one takes minutes; the
recipe and its arguments are the same) and sending the files to a temporary directory.

`-o setup` leaves `make setup` (installing the venv) out: this test checks the demo's command line, not the install.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.config.ports import probe_free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HEAD_PORT = 11000
NOTICE = "make demo: port 11000 is taken"
HANG_GUARD_S = 240


@contextlib.contextmanager
def port_11000_held() -> Iterator[None]:
    """A plain listening socket on 127.0.0.1:11000; if something else holds it already, that does as well."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        try:
            sock.bind(("127.0.0.1", HEAD_PORT))
            sock.listen(1)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
        yield
    finally:
        sock.close()


def make_demo(tmp_path: Path, *demo_args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("make") is None or not (INSTALL_DIR / ".venv" / "bin" / "gym").exists():
        pytest.skip("needs make and the repository's .venv (make setup)")
    args = [
        "--model-type", "scripted_model", "--output", str(tmp_path / "weather_rollouts.jsonl"), "+shared_venv=true",
        f"+results_dir={tmp_path / 'results'}", f"+cache_dir={tmp_path / 'cache'}", *demo_args,
    ]  # fmt: skip
    env = os.environ | {"NEMO_GYM_ENV_YAML": "", "OPENAI_API_KEY": ""}
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(INSTALL_DIR), "-o", "setup", "demo", f"DEMO_ARGS={' '.join(args)}"],
        env=env, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )  # fmt: skip


def rewards(tmp_path: Path) -> list[float]:
    return [json.loads(line)["reward"] for line in (tmp_path / "weather_rollouts.jsonl").read_text().splitlines()]


def test_the_demo_takes_a_free_head_port_when_11000_is_held_and_says_so(tmp_path: Path) -> None:
    with port_11000_held():
        done = make_demo(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    notices = [line for line in done.stderr.splitlines() if line.startswith(NOTICE)]
    assert len(notices) == 1, done.stderr
    assert "+head_server.port=0" in done.stdout  # the recipe's command line, as make echoes it
    assert "5 rollouts scored, 0 failed" in done.stdout + done.stderr
    assert rewards(tmp_path) == [1.0] * 5  # the scripted model calls get_weather, then says "It is cold there."


def test_demo_args_reach_the_command_and_a_head_port_in_them_is_kept(tmp_path: Path) -> None:
    port = probe_free_port()
    with port_11000_held():
        done = make_demo(tmp_path, f"+head_server.port={port}")
        refused = make_demo(tmp_path / "refused", f"+head_server.port={HEAD_PORT}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert NOTICE not in done.stderr and "+head_server.port=0" not in done.stdout
    assert f"+head_server.port={port}" in done.stdout and len(rewards(tmp_path)) == 5
    # Asked for the held port itself, the demo is refused with the launcher's one line, not a traceback.
    assert refused.returncode != 0 and NOTICE not in refused.stderr
    assert f"cannot listen on 127.0.0.1:{HEAD_PORT}" in refused.stderr and "Traceback" not in refused.stderr
