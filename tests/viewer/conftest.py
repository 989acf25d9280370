"""A real `gym view` process on 127.0.0.1 (port 0) and a headless Chromium driven by Selenium."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "results" / "viewer_screenshots"  # git-ignored; each test writes its own folder
START_DEADLINE_S = 60  # a hang guard only: the viewer prints its URL as soon as it is bound


class Viewer:
    """``gym view ARGS`` in its own process group; ``url`` is the one it printed."""

    def __init__(self, args: list[str], command: list[str] | None = None) -> None:
        argv = command or [sys.executable, "-m", "nemo_gym.cli.main", "view"]
        self.process = subprocess.Popen(
            [*argv, *args, "--port", "0"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(lines,), daemon=True).start()
        self.output: list[str] = []
        while True:
            try:
                line = lines.get(timeout=START_DEADLINE_S)
            except queue.Empty:
                self.stop()
                raise AssertionError("gym view printed no URL: " + "".join(self.output)) from None
            self.output.append(line)
            if "http://" in line:
                self.url = line[line.index("http://") :].split()[0].rstrip("/")
                self.wait_indexed()
                return
            if not line:
                raise AssertionError("gym view exited: " + "".join(self.output))

    def status(self) -> dict:
        with urllib.request.urlopen(self.url + "/status.json", timeout=30) as answer:
            return json.loads(answer.read())

    def wait_indexed(self) -> None:
        """Until the viewer's first pass over its files is done (pages rendered before it say "indexing…")."""
        deadline = time.monotonic() + START_DEADLINE_S
        while self.status()["indexing"]:
            assert time.monotonic() < deadline, "the viewer never finished indexing"
            time.sleep(0.05)  # polling a condition, not synchronising on time

    def _pump(self, lines: queue.Queue[str]) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            lines.put(line)
        lines.put("")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=15)


@pytest.fixture
def start_viewer() -> Iterator[Callable[..., Viewer]]:
    started: list[Viewer] = []

    def start(*paths: Path, command: list[str] | None = None) -> Viewer:
        viewer = Viewer([str(p) for p in paths], command)
        started.append(viewer)
        return viewer

    yield start
    for viewer in started:
        viewer.stop()


@pytest.fixture
def browser() -> Iterator[object]:
    """Debian's chromium through its chromedriver, headless (`make test` installs both when missing)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    driver_path = shutil.which("chromedriver")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if driver_path is None or chromium is None:
        pytest.skip(
            "chromium / chromedriver not installed: `make test` installs them (apt-get install chromium chromium-driver)"
        )
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):  # fmt: skip
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shots(request: pytest.FixtureRequest) -> Callable[[object, str], Path]:
    """``shots(driver, name)`` saves a screenshot under results/viewer_screenshots/<test>/<name>.png."""
    folder = SCREENSHOTS / request.node.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)

    def save(driver: object, name: str) -> Path:
        path = folder / f"{name}.png"
        driver.save_screenshot(str(path))  # type: ignore[attr-defined]
        return path

    return save
