"""Rollout health: deterministic checks of finished rollouts, from what their rows recorded (the canonical
``ng_trajectory``), behind the public face ``nemo_gym.rollout_health``.

``checks.py`` holds the checks (NeMo Gym 0.7's ids) and how they read a rollout's evidence; ``run.py`` maps them over
rollout files, reduces per task, decides verdicts and writes the reports. Checks report findings only; a check whose
evidence is missing leaves the rollout ``unobserved``, never ``healthy``.
"""
