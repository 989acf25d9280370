"""Why a server folder's tests failed, guessed from the error text: the cause column of the migration check.

A pure function of text, so it is tested on real-looking errors. The order of the checks matters: an import of a
``nemo_gym`` name we lack is our API even when it mentions a URL, and a network error is the network even when it is
raised inside our HTTP client.
"""

from __future__ import annotations

import re
import sys
from typing import Literal

Cause = Literal[
    "our-api",
    "missing-dependency",
    "needs-python",
    "needs-gpu",
    "needs-network",
    "needs-docker",
    "needs-api-key",
    "timeout",
    "other",
]
Stage = Literal["build", "tests", "timeout"]

_OUR_NAME = re.compile(
    r"(cannot import name '\w+' from '?nemo_gym"
    r"|No module named '?nemo_gym[.']"
    r"|module '?nemo_gym[\w.]*'? has no attribute"
    r"|(ImportError|AttributeError|TypeError)\b.*\bnemo_gym\b)"
)
_DOCKER = re.compile(
    r"(Docker daemon|docker\.errors|DockerException|docker\.sock"
    r"|No such file or directory: '(docker|podman|apptainer|singularity|enroot)'"
    r"|\b(apptainer|singularity|enroot|podman)\b.*not (found|installed|available))",
    re.I,
)
_GPU = re.compile(r"(\bCUDA\b|\bcuda\b|nvidia-smi|libcuda|NVIDIA driver|\bGPUs?\b.*(not|no) (found|available))")
_API_KEY = re.compile(
    r"(\b[A-Z][A-Z0-9_]*_(API_KEY|TOKEN)\b|api_key client option must be set|AuthenticationError"
    r"|\b401\b.*Unauthorized|Incorrect API key|Invalid API key)"
)
_NETWORK = re.compile(
    r"(Cannot connect to host|Name or service not known|Temporary failure in name resolution|getaddrinfo failed"
    r"|Network is unreachable|Failed to establish a new connection|Max retries exceeded|urlopen error"
    r"|Could not resolve host|dns error|Failed to (fetch|clone|download)|ConnectTimeout|ConnectError"
    r"|LocalEntryNotFoundError|couldn't connect to 'https?://|huggingface\.co|git\+https?://)",
    re.I,
)
_PYTHON = re.compile(
    r"(does not satisfy Python|requires a different Python|Requires-Python|^E?\s*SyntaxError\b"
    r"|python_version\s*[<>=]+)",
    re.M,
)
_STDLIB_NAME = re.compile(r"(cannot import name '\w+' from '(?P<a>[\w.]+)'|module '(?P<b>[\w.]+)' has no attribute)")
_MISSING_MODULE = re.compile(r"No module named '(?P<module>[\w.]+)'")
_INNERMOST_FRAME = re.compile(r"^(?P<path>\S+\.py):\d+: (?!in )\w", re.M)
_EXCEPTION_LINE = re.compile(r"^E\s+(?P<line>([\w.]+\.)?[A-Z]\w*(Error|Exception|Exit|Interrupt|Timeout)\b.*)$", re.M)


def classify_failure(text: str, stage: Stage = "tests") -> Cause:
    """The cause class of one failure: ``stage`` says whether the venv build, the tests, or the clock failed."""
    if stage == "timeout":
        return "timeout"
    evidence = _evidence(text)
    if stage == "build":
        for cause, pattern in (("needs-network", _NETWORK), ("needs-python", _PYTHON), ("needs-gpu", _GPU)):
            if pattern.search(evidence):
                return cause  # type: ignore[return-value]
        return "missing-dependency"
    if _OUR_NAME.search(evidence):
        return "our-api"
    for cause, pattern in (
        ("needs-docker", _DOCKER),
        ("needs-gpu", _GPU),
        ("needs-api-key", _API_KEY),
        ("needs-network", _NETWORK),
        ("needs-python", _PYTHON),
    ):
        if pattern.search(evidence):
            return cause  # type: ignore[return-value]
    if _names_stdlib(evidence):
        return "needs-python"  # e.g. ``from typing import override`` (3.12) on an older interpreter
    if (missing := _MISSING_MODULE.search(evidence)) and not missing["module"].startswith("nemo_gym"):
        return "missing-dependency"
    if _raised_in_nemo_gym(text):
        return "our-api"
    return "other"


def first_error_line(text: str) -> str:
    """The line that says what went wrong: the last exception line of a pytest report, else its first ``E`` line,
    else the first line that names an error, else the first non-empty line."""
    exceptions = [m["line"].strip() for m in _EXCEPTION_LINE.finditer(text)]
    if exceptions:
        return exceptions[-1]
    for line in text.splitlines():
        if line.startswith("E "):
            return line[1:].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if re.search(r"(?i)\berror\b|\bfailed\b|exception", line):
            return line.removeprefix("×").strip()
    return lines[0] if lines else ""


def _evidence(text: str) -> str:
    """The error lines of a pytest report (``E ...``), where the cause is said; the whole text when there are none
    (a build log, a crash before pytest reported)."""
    lines = [line for line in text.splitlines() if line.startswith("E ")]
    return "\n".join(lines) if lines else text


def _names_stdlib(evidence: str) -> bool:
    for match in _STDLIB_NAME.finditer(evidence):
        module = (match["a"] or match["b"]).split(".")[0]
        if module in sys.stdlib_module_names:
            return True
    return False


def _raised_in_nemo_gym(text: str) -> bool:
    """Whether the innermost frame of the traceback is in the ``nemo_gym`` package (a test failing on our
    behaviour rather than on its own code)."""
    frames = list(_INNERMOST_FRAME.finditer(text))
    return bool(frames) and re.search(r"(^|/)nemo_gym/", frames[-1]["path"]) is not None
