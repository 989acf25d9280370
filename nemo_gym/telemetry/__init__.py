"""NeMo Gym 0.7's ``nemo_gym.telemetry``, as far as code written for 0.7 uses it: ``connection_pool``'s destination
label. 0.7's metrics and tracing exporters are not part of this package: our transport keeps no per-destination
metrics, so there is nothing for them to export."""
