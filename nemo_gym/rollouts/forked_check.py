"""Checking a run's rows in a child forked as ``gym eval run --no-serve`` starts.

Every row is checked and written before any rollout starts (a bad line fails the run first, see ``materialize.py``).
For 10,000 rows that is ~0.15 s of a core, after ~0.1 s of importing the Responses models and config composition. A
child forked when the command starts does those imports while the command composes its config and asks the head
server for the running one; once handed both, it checks and writes the rows while the command imports its HTTP
machinery. On two cores the command's start-up and the child's work run side by side, and the first rollout starts
when the later of the two is done.

Only this module's standard-library imports come before the fork, so the child starts as early as it can.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from nemo_gym.config.compose import ComposedConfig
    from nemo_gym.rollouts.config import RolloutCollectionConfig
    from nemo_gym.rollouts.materialize import Materialized

__all__ = ["ForkedRowCheck"]


class ForkedRowCheck:
    """A child that waits for a run's settings and config, then does :func:`~nemo_gym.rollouts.inputs.prepare_inputs`.

    Entering forks the child; :meth:`run` hands it the run and returns its result. Leaving stops a child that was
    never handed a run (the command failed before its rows were due), so nothing is left running. Where no child can
    be forked (no ``fork``, other threads running), or the child fails in any way (a bad row, a full disk, a config
    that cannot be sent), :meth:`run` calls ``prepare_inputs`` here after ``meanwhile``, which raises exactly what it
    raises: the child's result is only ever a shortcut to the same file.
    """

    def __init__(self) -> None:
        self._pid = 0
        self._request_fd = -1
        """Written by this process: the pickled settings and config, then closed (closed empty: nothing to do)."""
        self._result_fd = -1
        """Read by this process: the pickled result, written only when the child succeeded."""

    def __enter__(self) -> ForkedRowCheck:
        if hasattr(os, "fork") and threading.active_count() == 1:
            request_read, self._request_fd = os.pipe()
            self._result_fd, result_write = os.pipe()
            self._pid = os.fork()
            if self._pid == 0:
                os.close(self._request_fd)
                os.close(self._result_fd)
                _child(request_read, result_write)  # never returns
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
        from nemo_gym.rollouts.inputs import prepare_inputs

        if not self._hand_over(settings, config):
            self._stop(interrupt=False)
            meanwhile()
            return prepare_inputs(settings, config)
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
        return prepare_inputs(settings, config)

    def _hand_over(self, settings: Any, config: Any) -> bool:
        """Send the run to a waiting child; False when there is none or it cannot be sent."""
        if not self._pid:
            return False
        try:
            request = pickle.dumps((settings, config))
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


def _child(request_fd: int, result_fd: int) -> None:
    """The forked child: it never returns into the caller's code (whose ``finally`` blocks, such as the output's
    lock, are the parent's), and exits 0 only when it wrote its result or was told there is nothing to do."""
    code = 1
    try:
        gc.freeze()  # collections here never walk the parent's objects (which would copy their pages)
        from nemo_gym.datasets import validation  # noqa: F401 - the Responses models, loaded while the parent composes
        from nemo_gym.rollouts.inputs import prepare_inputs

        with os.fdopen(request_fd, "rb") as pipe:
            request = pipe.read()
        if request:
            settings, config = pickle.loads(request)
            payload = pickle.dumps(prepare_inputs(settings, config))
            with os.fdopen(result_fd, "wb") as pipe:
                pipe.write(payload)
        code = 0
    except BaseException:
        pass
    finally:
        os._exit(code)
