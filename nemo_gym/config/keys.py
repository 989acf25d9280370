"""Names every layer of a config shares: the framework's own top-level keys and the unset marker.

This module imports nothing, so code that only needs the names (masking secrets in console output, on every
``gym`` command's path) does not load the config machinery (OmegaConf, the server models) to get them.
"""

from __future__ import annotations

RESERVED_TOP_LEVEL_KEYS = frozenset(
    {
        "config_paths", "entrypoint", "default_host", "head_server", "disallowed_ports", "head_server_deps",
        "python_version", "pip_install_verbose", "use_absolute_ip", "uv_pip_set_python", "skip_venv_if_present",
        "hf_token", "ray_head_node_address", "port_range_low", "port_range_high", "dry_run",
        "model_endpoint_readiness_timeout_seconds", "allow_openai_version_skew", "uv_cache_dir", "uv_venv_dir",
        "results_dir", "cache_dir", "_inherit_from", "_copy", "nemo_gym_log_dir", "verbose", "json", "query",
        "observability_enabled", "model_call_capture_dir", "token_id_capture", "component_name",
        "skip_verification", "skip_verification_reward", "error_on_almost_servers", "shared_venv",
        "server_startup_timeout_seconds", "auth", "run_token", "server_max_body_bytes",
        # NeMo Gym 0.7's routing of rows to environment servers
        "environment_server_name", "environment_server_routes", "environment_routing_mode",
        "error_on_agent_without_environment_server",
        # NeMo Gym 0.7: run an agent or model a resources server's allowed_agents / allowed_model_types leave out
        "allow_unsupported_pairing",
        "server_call_timeout_seconds",
        "server_supervision",  # the launcher's restarts of servers that die or freeze (config/supervision.py)
    }
)  # fmt: skip
"""Top-level keys that are settings of the framework itself, never server instances."""

MISSING = "???"
"""OmegaConf's marker of a value that must be set (``key: ???``)."""
