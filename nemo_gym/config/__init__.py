"""Config composition internals. The public entry points are :mod:`nemo_gym.global_config` and
:mod:`nemo_gym.config_types`."""
