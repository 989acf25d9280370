"""What a server process loads at start: every MB here is paid once per server, and deployments run dozens.

`import openai` brings its HTTP clients (httpx, an aiohttp transport), ~20 MB, although servers only ever need its
hosted-tool item models, and only when such an item arrives; aiohttp is only needed by servers that call others.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import importlib, json, sys
importlib.import_module({module!r})
print(json.dumps({{name: name in sys.modules for name in ("openai", "aiohttp", "httpx2", "httpx")}}))
"""


def loaded_after_import(module: str) -> dict[str, bool]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "module",
    ["resources_servers.example_single_tool_call.app", "responses_api_models.scripted_model.app"],
)
def test_a_server_that_calls_no_other_server_loads_neither_openai_nor_aiohttp(module: str) -> None:
    assert loaded_after_import(module) == {"openai": False, "aiohttp": False, "httpx2": False, "httpx": False}


def test_an_agent_loads_the_http_client_but_not_the_openai_sdk() -> None:
    loaded = loaded_after_import("responses_api_agents.simple_agent.app")
    assert loaded["aiohttp"] and not loaded["openai"]


def test_hosted_tool_items_still_load_and_validate_with_the_sdk() -> None:
    probe = (
        "import sys\n"
        "from nemo_gym.openai_utils import NeMoGymResponse\n"
        "assert 'openai' not in sys.modules\n"
        "r = NeMoGymResponse.model_validate({'id': 'r', 'created_at': 0, 'model': 'm', 'object': 'response',"
        " 'output': [{'type': 'web_search_call', 'id': 'w', 'status': 'completed', 'action': {'type': 'search', 'query': 'q'}}], 'parallel_tool_calls': True,"
        " 'tool_choice': 'auto', 'tools': []})\n"
        "print(type(r.output[0]).__module__, r.model_dump(exclude_unset=True)['output'][0]['type'])\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["openai.types.responses.response_function_web_search", "web_search_call"]


def test_dumping_a_usage_reads_the_sdks_shape_without_importing_the_sdk() -> None:
    """A resources server dumps every ``/verify`` body, usage included: that used to import the whole SDK (~20 MB)
    on the first rollout, only to ask whether its usage details have ``cache_write_tokens``."""
    probe = (
        "import sys\n"
        "from nemo_gym.openai_utils import NeMoGymResponse\n"
        "r = NeMoGymResponse.model_validate({'id': 'r', 'created_at': 0, 'model': 'm', 'output': [],"
        " 'usage': {'input_tokens': 3, 'output_tokens': 1, 'total_tokens': 4}})\n"
        "details = r.model_dump()['usage']['input_tokens_details']\n"
        "assert 'openai' not in sys.modules, 'the dump imported the SDK'\n"
        "from openai.types.responses.response_usage import InputTokensDetails\n"
        "assert set(details) == set(InputTokensDetails.model_fields), (details, InputTokensDetails.model_fields)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok"]


def test_the_sdks_usage_shape_read_from_source_is_the_imported_one() -> None:
    """The fast path (the SDK's source, parsed) and the general one (the SDK imported) give the same answer."""
    from openai.types.responses.response_usage import InputTokensDetails

    from nemo_gym import openai_usage

    assert openai_usage._sdk_declared_input_details_fields() == frozenset(InputTokensDetails.model_fields)
    assert openai_usage._sdk_counts_cache_writes() == ("cache_write_tokens" in InputTokensDetails.model_fields)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("class InputTokensDetails(BaseModel):\n    cached_tokens: int\n", frozenset({"cached_tokens"})),  # openai 2.7
        ("class InputTokensDetails(Base):\n    cached_tokens: int\n", None),  # inherited fields: import to know
        ("InputTokensDetails = dict\n", None),
        ("class InputTokensDetails(BaseModel:\n", None),  # unparseable
    ],
)
def test_an_sdk_usage_source_that_cannot_be_read_plainly_means_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, expected: frozenset[str] | None
) -> None:
    import importlib.machinery
    import importlib.util

    from nemo_gym import openai_usage

    package = tmp_path / "openai"
    (package / "types" / "responses").mkdir(parents=True)
    (package / "types" / "responses" / "response_usage.py").write_text(source)
    spec = importlib.machinery.ModuleSpec("openai", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "openai" else None)
    assert openai_usage._sdk_declared_input_details_fields() == expected


@pytest.mark.parametrize("module", ["nemo_gym.cli.router", "nemo_gym.launcher.runner"])
def test_the_launcher_loads_no_http_client_library(module: str) -> None:
    """`gym env start` lives as long as its servers; its readiness probe needs no client library (~10 MB)."""
    loaded = loaded_after_import(module)
    assert not loaded["aiohttp"] and not loaded["httpx"]


CLI_PROBE = """
import sys
from nemo_gym.cli.main import main
try:
    main(["--help"])
except SystemExit:
    pass
heavy = ("omegaconf", "hydra", "aiohttp", "fastapi", "nemo_gym.config.server_models", "nemo_gym.openai_responses")
print("loaded:", [name for name in heavy if name in sys.modules])
"""


def test_gym_help_loads_no_config_machinery_nor_web_stack() -> None:
    """Every command module is imported to build the parser: what they import at the top is paid by every ``gym``
    call, so composing a config, the server models and the HTTP stacks are imported where a command runs."""
    out = subprocess.run(
        [sys.executable, "-c", CLI_PROBE], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "loaded: []"
