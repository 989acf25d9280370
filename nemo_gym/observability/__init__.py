"""Rollout observability: which rollout a model call belongs to, what was observed, and the trajectory record.

* ``correlation.py``: the rollout id of a ``/run`` body, the ``/ng-rollout/<id>/...`` path prefix that carries it
  to the model server, and the middleware that strips it again;
* ``records.py``: the typed records an agent may return (``ng_agent_observations``) and the standardized
  ``TrajectoryRecord``;
* ``capture.py``: model-call capture on a model server (``CaptureStore``, the ASGI middleware) and its merge into a
  finished rollout;
* ``model_call_records.py``: ``ModelCallRecord``, what one captured exchange says (re-exported by ``capture.py``);
* ``trajectory.py``: the projection of all of that into one ``ng_trajectory`` per rollout.

Everything here is off unless a run sets ``observability_enabled`` (with ``model_call_capture_dir``): a server
without it installs nothing and a rollout without capture data is left as it is.
"""
