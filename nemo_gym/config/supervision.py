"""``server_supervision``: how the launcher keeps a launch's servers up (``launcher/supervisor.py`` acts on it).

Its own module, with pydantic only, so that config validation can check the block without loading the launcher.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

SUPERVISION_KEY = "server_supervision"


class SupervisionConfig(BaseModel):
    """The launcher's rules for a server that dies or freezes; the defaults suit a long unattended run.

    Set from the command line as ``+server_supervision.max_restarts=2`` and so on; ``enabled=false`` gives back the
    old behaviour (the first server to exit stops the launch).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    max_restarts: int = Field(default=5, ge=0)
    """Restarts in a row a server gets without staying up ``stable_after_s`` in between; one more death: given up."""
    backoff_s: float = Field(default=1.0, ge=0)
    """Wait before the first restart; doubled for each further one in a row, up to ``max_backoff_s``."""
    max_backoff_s: float = Field(default=30.0, ge=0)
    stable_after_s: float = Field(default=60.0, gt=0)
    """A server up and answering this long after a restart has its count of restarts in a row reset."""
    probe_interval_s: float = Field(default=1.0, gt=0)
    """How often each server's health route (``GET /``) is asked."""
    probe_timeout_s: float = Field(default=3.0, gt=0)
    """How long a connected probe waits for the answer; ``GET /`` skips admission, so even a busy server answers."""
    frozen_after_probes: int = Field(default=2, ge=1)
    """Unanswered probes in a row (the connection taken, no answer) after which a server is told as frozen."""
    restart_frozen_after_s: float | None = Field(default=60.0, gt=0)
    """A server frozen this long is killed and restarted; ``null``: only told, never killed."""
