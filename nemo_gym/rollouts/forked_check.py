"""Checking a run's rows in a child forked as ``gym eval run --no-serve`` starts.

Every row is checked and written before any rollout starts (a bad line fails the run first, see ``materialize.py``).
For 10,000 rows that is ~0.15 s of a core, after ~0.1 s of importing the Responses models and config composition. A
child forked when the command starts does those imports while the command imports its router, composes its config
and asks the head server for the running one; once handed both, it checks and writes the rows while the command
imports its HTTP machinery. On two cores the command's start-up and the child's work run side by side, and the first
rollout starts when the later of the two is done.

The ``gym`` entry point forks the child before anything but the standard library is imported (:func:`forked_early`,
see ``cli/main.py``); the collect command takes that child (:meth:`ForkedRowCheck.early_or_new`), or forks one itself
when called some other way. When the command line names the input file, the child does not wait idle for the run:
it validates the file's create params ahead (``datasets/validation.check_params_ahead``, the larger part of the
check) until the run arrives, and the run uses those verdicts wherever they hold (the same file, unchanged, no
overrides), so on two cores most of the check is done beside the command's own start-up.
"""

from __future__ import annotations

import gc
import os
import pickle
import select
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from nemo_gym.config.compose import ComposedConfig
    from nemo_gym.rollouts.config import RolloutCollectionConfig
    from nemo_gym.rollouts.inputs import RowsToCheck
    from nemo_gym.rollouts.materialize import Materialized

__all__ = ["ForkedRowCheck", "forked_early"]

_early: ForkedRowCheck | None = None
"""The child :func:`forked_early` started, until a command takes it."""


@contextmanager
def forked_early(wanted: bool, input_path: str | None = None) -> Iterator[None]:
    """Fork the checker now when ``wanted`` (the command line reads as a collect against running servers), checking
    ``input_path`` ahead when given; a child that no command took is stopped on the way out."""
    global _early
    if not wanted:
        yield
        return
    with ForkedRowCheck(input_path) as check:
        _early = check
        try:
            yield
        finally:
            _early = None


class ForkedRowCheck:
    """A child that waits for what checking a run's rows needs, then does :func:`~nemo_gym.rollouts.inputs.check_rows`.

    Entering forks the child; :meth:`run` hands it the run and returns its result. Leaving stops a child that was
    never handed a run (the command failed before its rows were due), so nothing is left running. Where no child can
    be forked (no ``fork``, other threads running), or the child fails in any way (a bad row, a full disk, a config
    that cannot be sent), :meth:`run` calls ``check_rows`` here after ``meanwhile``, which raises exactly what it
    raises: the child's result is only ever a shortcut to the same file.
    """

    def __init__(self, input_path: str | None = None) -> None:
        self._input_path = input_path
        """The input file the command line names, if it does: the child checks its create params while it waits."""
        self._forked = False
        self._pid = 0
        self._request_fd = -1
        """Written by this process: the pickled :class:`RowsToCheck`, then closed (closed empty: nothing to do)."""
        self._result_fd = -1
        """Read by this process: the pickled result, written only when the child succeeded."""

    @staticmethod
    def early_or_new() -> ForkedRowCheck:
        """The child the entry point forked (taken: only one command uses it), or a new checker to enter."""
        global _early
        check, _early = _early or ForkedRowCheck(), None
        return check

    def __enter__(self) -> ForkedRowCheck:
        if not self._forked and hasattr(os, "fork") and threading.active_count() == 1:
            self._forked = True
            request_read, self._request_fd = os.pipe()
            self._result_fd, result_write = os.pipe()
            self._pid = os.fork()
            if self._pid == 0:
                os.close(self._request_fd)
                os.close(self._result_fd)
                _child(request_read, result_write, self._input_path)  # never returns
            os.close(request_read)
            os.close(result_write)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop(interrupt=False)

    def run(
        self,
        settings: RolloutCollectionConfig,
        config: ComposedConfig | DictConfig,
        meanwhile: Callable[[], Any],
    ) -> Materialized:
        """The run's materialized rows, checked and written by the child while this process runs ``meanwhile``."""
        from nemo_gym.rollouts.inputs import RowsToCheck, check_rows

        rows = RowsToCheck.of(settings, config)
        if not self._hand_over(rows):
            self._stop(interrupt=False)
            meanwhile()
            return check_rows(rows)
        payload = b""
        status = 1
        try:
            meanwhile()
            with os.fdopen(self._result_fd, "rb", closefd=False) as pipe:
                payload = pipe.read()
            _, status = os.waitpid(self._pid, 0)
            self._pid = 0
        finally:
            self._stop(interrupt=True)  # interrupted: SIGINT lets the child remove its temporary file on its way out
        if os.waitstatus_to_exitcode(status) == 0 and payload:
            from nemo_gym.rollouts.materialize import Materialized

            materialized = pickle.loads(payload)
            if isinstance(materialized, Materialized):
                return materialized
        return check_rows(rows)

    def _hand_over(self, rows: RowsToCheck) -> bool:
        """Send the run to a waiting child; False when there is none or it cannot be sent."""
        if not self._pid:
            return False
        try:
            request = pickle.dumps(rows)
        except Exception:  # a value pickle cannot carry (a custom object in the config): the work stays here
            return False
        try:
            with os.fdopen(self._request_fd, "wb", closefd=False) as pipe:
                pipe.write(request)
        except OSError:  # the child is gone (it failed while importing)
            return False
        finally:
            os.close(self._request_fd)
            self._request_fd = -1
        return True

    def _stop(self, interrupt: bool) -> None:
        """Close this side's pipes and reap the child. A child still waiting for a run reads an empty request and
        exits; one still checking rows is interrupted when ``interrupt`` is set."""
        for fd in (self._request_fd, self._result_fd):
            if fd >= 0:
                os.close(fd)
        self._request_fd = self._result_fd = -1
        if self._pid:
            if interrupt:
                os.kill(self._pid, signal.SIGINT)
            os.waitpid(self._pid, 0)
            self._pid = 0


def _child(request_fd: int, result_fd: int, input_path: str | None) -> None:
    """The forked child: it never returns into the caller's code (whose ``finally`` blocks, such as the output's
    lock, are the parent's), and exits 0 only when it wrote its result or was told there is nothing to do."""
    code = 1
    try:
        gc.freeze()  # collections here never walk the parent's objects (which would copy their pages)
        from pathlib import Path

        from nemo_gym.datasets.validation import check_params_ahead  # the Responses models, loaded meanwhile

        checked = None
        if input_path:

            def run_arrived() -> bool:  # the request is readable once it is written (or the command gave up)
                return bool(select.select([request_fd], [], [], 0)[0])

            checked = check_params_ahead(Path(input_path).expanduser(), stop=run_arrived)
        from nemo_gym.rollouts.inputs import check_rows

        with os.fdopen(request_fd, "rb") as request_pipe:
            request = request_pipe.read()
        if request:
            payload = pickle.dumps(check_rows(pickle.loads(request), checked))
            with os.fdopen(result_fd, "wb") as result_pipe:
                result_pipe.write(payload)
        code = 0
    except BaseException:
        pass
    finally:
        os._exit(code)
