"""``gym --version``: what is installed where, for bug reports."""

from __future__ import annotations

import json
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version

from nemo_gym import INSTALL_DIR, __version__
from nemo_gym.cli.output import console


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def version_info() -> dict[str, object]:
    import psutil

    return {
        "nemo_gym": __version__,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "install_path": str(INSTALL_DIR),
        "openai": _package_version("openai"),
        "pydantic": _package_version("pydantic"),
        "omegaconf": _package_version("omegaconf"),
        "ray": _package_version("ray"),
        "os": platform.system(),
        "platform": platform.platform(),
        "architecture": platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
    }


def print_version(as_json: bool = False) -> None:
    info = version_info()
    if as_json:
        print(json.dumps(info))
        return
    console.print(f"NeMo Gym {info['nemo_gym']}")
    for key, value in info.items():
        if key != "nemo_gym":
            console.print(f"  {key + ':':<20} {value if value is not None else 'not installed'}")
