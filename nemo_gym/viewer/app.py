"""The viewer's Starlette app: server-rendered pages (Jinja2, autoescaped), one small script, one stylesheet.

A follower thread indexes every run's files and keeps indexing what is appended (a run still being written), so the
first page answers at once, before a large file is fully indexed; pages say how far indexing got. The pages send a
Content-Security-Policy that allows only this server's own script and stylesheet: even a rollout that slipped past
escaping could not run a script.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from nemo_gym.viewer import plots, trajectory
from nemo_gym.viewer.compare import PASS_AT, compare, differing_inputs, rollouts_of_task
from nemo_gym.viewer.runs import FAILURE, ROLLOUT, Filters, Run

if TYPE_CHECKING:
    from nemo_gym.run_comparison import Comparison

HERE = Path(__file__).parent
PAGE_SIZE = 50
FOLD_AT = 800  # characters: longer texts are folded behind their first lines
POLL_S = 0.5
CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'"

templates = Environment(
    loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True), trim_blocks=True
)
templates.globals["FOLD_AT"] = FOLD_AT


class Follower:
    """Indexes every run's files, then keeps polling them for appended rows until stopped."""

    def __init__(self, runs: list[Run], poll_s: float = POLL_S) -> None:
        self.runs = runs
        self.poll_s = poll_s
        self.first_pass = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="viewer-follower", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for run in self.runs:
                run.refresh()
            self.first_pass.set()
            self._stop.wait(self.poll_s)


def _version(runs: list[Run]) -> str:
    """Changes whenever a run gains rows or its metrics file changes: what the live pages watch."""
    parts = []
    for run in runs:
        metrics = run.metrics_path.stat().st_mtime_ns if run.metrics_path.exists() else 0
        parts.append(f"{run.rollouts.generation}.{len(run.rollouts)}.{len(run.failures)}.{metrics}")
    return "-".join(parts)


def _page(request: Request, name: str, **context: Any) -> HTMLResponse:
    state = request.app.state
    html = templates.get_template(name).render(
        runs=state.runs, version=_version(state.runs), indexing=not state.follower.first_pass.is_set(), **context
    )
    return HTMLResponse(html, headers={"Content-Security-Policy": CSP, "Cache-Control": "no-store"})


def _run(request: Request) -> Run:
    runs: list[Run] = request.app.state.runs
    number = int(request.path_params["run"])
    if not 0 <= number < len(runs):
        raise HTTPException(404, f"no run {number}: this viewer has {len(runs)}")
    return runs[number]


async def home(request: Request) -> Response:
    runs: list[Run] = request.app.state.runs
    if len(runs) == 1:
        return RedirectResponse("/run/0", status_code=307)
    return _page(request, "home.html", title="runs")


async def overview(request: Request) -> Response:
    run = _run(request)
    index = run.rollouts
    n = len(index)
    rewards = [r for r in index.reward[:n] if not math.isnan(r)]
    scored = [i for i in range(n) if not math.isnan(index.reward[i])]
    scored = scored[:: max(1, len(scored) // plots.MAX_POINTS)]  # the scatter shows a regular sample
    per_task = sorted(run.task_rewards().items())
    pass_rates = [sum(r >= PASS_AT for r in rs) / len(rs) for _, rs in per_task]
    figures = [
        plots.histogram("Reward", rewards, "reward"),
        plots.bars("Pass rate per task" if len(per_task) <= 60 else "Tasks by pass rate",
                   [str(t) for t, _ in per_task], pass_rates, "task", "pass rate")
        if len(per_task) <= 60 else plots.histogram("Tasks by pass rate", pass_rates, "pass rate"),
        plots.scatter("Reward vs. output length", [float(index.output_chars[i]) for i in scored],
                      [index.reward[i] for i in scored], "output characters", "reward"),
        plots.histogram("Turns per rollout", [float(t) for t in index.turns[:n]], "turns"),
    ]  # fmt: skip
    return _page(request, "overview.html", title=run.name, run=run, summary=run.overview(), metrics=run.metrics(),
                 figures=figures, health=run.health.overview())  # fmt: skip


async def rollout_list(request: Request) -> Response:
    run = _run(request)
    filters = Filters.from_query(request.query_params)
    chosen = run.select(filters)
    try:
        page = max(int(request.query_params.get("page", "0")), 0)
    except ValueError:
        page = 0
    shown = [run.summary(kind, i) for kind, i in chosen[page * PAGE_SIZE : (page + 1) * PAGE_SIZE]]
    query = {k: v for k, v in request.query_params.items() if k != "page"}
    return _page(request, "list.html", title=f"{run.name}: rollouts", run=run, filters=filters, rows=shown,
                 total=len(chosen), page=page, pages=max(math.ceil(len(chosen) / PAGE_SIZE), 1), query=query,
                 agents=run.rollouts.agents.names, classes=[c or "unclassified" for c in run.failures.failure_classes.names])  # fmt: skip


def _entry(request: Request) -> tuple[Run, str, int]:
    run = _run(request)
    kind, i = request.path_params["kind"], int(request.path_params["row"])
    if kind not in (ROLLOUT, FAILURE) or not 0 <= i < len(run.index_of(kind)):
        raise HTTPException(404, f"no such row in {run.name}")
    return run, kind, i


async def rollout_page(request: Request) -> Response:
    run, kind, i = _entry(request)
    row = run.index_of(kind).row(i)
    entry = run.summary(kind, i)
    health = run.health.of_rollout(entry["task"], entry["rollout"]) if kind == ROLLOUT else None
    return _page(request, "rollout.html", title=f"{run.name} #{i}", run=run, kind=kind, row_number=i,
                 entry=entry, items=trajectory.items(row), fields=trajectory.fields(row),
                 usage=trajectory.usage(row), health=health)  # fmt: skip


async def rollout_raw(request: Request) -> Response:
    run, kind, i = _entry(request)
    text = trajectory.pretty(run.index_of(kind).raw(i))
    return Response(text, media_type="text/plain; charset=utf-8", headers={"X-Content-Type-Options": "nosniff"})


def _pair(request: Request) -> tuple[Run, Run]:
    runs: list[Run] = request.app.state.runs
    try:
        a, b = int(request.query_params.get("a", "0")), int(request.query_params.get("b", "1"))
    except ValueError as e:
        raise HTTPException(400, "a and b are run numbers") from e
    if not (0 <= a < len(runs) and 0 <= b < len(runs)):
        raise HTTPException(404, "compare needs two runs: start `gym view RUN_A.jsonl RUN_B.jsonl`")
    return runs[a], runs[b]


async def compare_page(request: Request) -> Response:
    before, after = _pair(request)
    deltas = compare(before, after)
    flipped = [d for d in deltas if d.change in ("fixed", "broken")]
    differing = differing_inputs(before, after, deltas)
    numbers, refused = await run_in_threadpool(_statistics, before, after)
    return _page(request, "compare.html", title="compare", before=before, after=after, deltas=deltas,
                 flipped=flipped, pass_at=PASS_AT, differing=differing, stats=numbers, refused=refused)  # fmt: skip


def _statistics(before: Run, after: Run) -> tuple[Comparison | None, str | None]:
    """``gym eval compare``'s numbers for the pair, from the same code (a worker thread: it reads both files whole);
    or, for runs of different tasks, the line it refuses them with."""
    from nemo_gym.rollouts.compare import read_run
    from nemo_gym.run_comparison import TaskMismatchError, compare_runs

    try:
        return compare_runs(read_run(before.path), read_run(after.path)), None
    except TaskMismatchError as error:
        return None, str(error)


async def compare_task(request: Request) -> Response:
    before, after = _pair(request)
    try:
        task = int(request.query_params["task"])
    except (KeyError, ValueError) as e:
        raise HTTPException(400, "task is a task index") from e
    sides = []
    for run in (before, after):
        rows = rollouts_of_task(run, task)
        sides.append({"run": run, "rollouts": [
            {"entry": run.summary(ROLLOUT, i), "steps": trajectory.items(run.rollouts.row(i))} for i in rows[:8]
        ], "more": max(len(rows) - 8, 0)})  # fmt: skip
    return _page(request, "compare_task.html", title=f"task {task}", task=task, sides=sides, before=before, after=after)


async def status(request: Request) -> Response:
    runs: list[Run] = request.app.state.runs
    return JSONResponse({
        "version": _version(runs),
        "indexing": not request.app.state.follower.first_pass.is_set(),
        "runs": [{"name": r.name, "rollouts": len(r.rollouts), "failures": len(r.failures)} for r in runs],
    })  # fmt: skip


def build_app(runs: list[Run], poll_s: float = POLL_S) -> Starlette:
    follower = Follower(runs, poll_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        follower.start()
        try:
            yield
        finally:
            follower.stop()

    routes = [
        Route("/", home),
        Route("/status.json", status),
        Route("/compare", compare_page),
        Route("/compare/task", compare_task),
        Route("/run/{run:int}", overview),
        Route("/run/{run:int}/rollouts", rollout_list),
        Route("/run/{run:int}/{kind}/{row:int}", rollout_page),
        Route("/run/{run:int}/{kind}/{row:int}/raw", rollout_raw),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.runs = runs
    app.state.follower = follower
    return app
