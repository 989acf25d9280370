"""The migration check's cause column: each class from error text shaped like what pytest and uv really print."""

from __future__ import annotations

import pytest

from nemo_gym.authoring.failure_causes import classify_failure, first_error_line


def collection_error(*lines: str) -> str:
    """A pytest collection error as JUnit XML carries it: the traceback, then the ``E`` lines."""
    return "\n".join(
        [
            "ImportError while importing test module '/ck/resources_servers/x/tests/test_app.py'.",
            "Hint: make sure your test modules/packages have valid Python names.",
            "Traceback:",
            "/usr/lib/python3.11/importlib/__init__.py:126: in import_module",
            "    return _bootstrap._gcd_import(name[level:], package, level)",
            "tests/test_app.py:17: in <module>",
            "    from app import Server",
            *lines,
        ]
    )


def failed_test(frame: str, *lines: str) -> str:
    """A failed test: frames ending in ``path:line: ExceptionName``, with the ``E`` lines before it."""
    return "\n".join(
        [
            "async def test_verify(self) -> None:",
            ">       result = await server.verify(body)",
            "",
            "tests/test_app.py:40: ",
            "_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _",
            *lines,
            "",
            frame,
        ]
    )


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        (collection_error("E   ImportError: cannot import name 'TASK_INDEX_KEY_NAME' from 'nemo_gym.global_config' "
                          "(/work/main/nemo_gym/global_config.py)"), "our-api"),
        (collection_error("E   ModuleNotFoundError: No module named 'nemo_gym.reward_profile'"), "our-api"),
        (failed_test("app.py:88: AttributeError",
                      "E   AttributeError: module 'nemo_gym.server_utils' has no attribute 'get_server_url'"),
         "our-api"),
        (failed_test("app.py:51: TypeError",
                      "E   TypeError: object NoneType can't be used in 'await' expression"), "other"),
        (failed_test("/work/main/nemo_gym/base_resources_server.py:120: ValidationError",
                      "E   pydantic_core._pydantic_core.ValidationError: 1 validation error for BaseVerifyRequest",
                      "E   tools.0", "E     Input should be a valid dictionary"), "our-api"),
        (collection_error("E   ModuleNotFoundError: No module named 'ray'"), "missing-dependency"),
        (collection_error("E   ImportError: cannot import name 'override' from 'typing' "
                          "(/usr/lib/python3.11/typing.py)"), "needs-python"),
        (collection_error("E     File \"/ck/resources_servers/x/app.py\", line 12", "E       type Row = dict[str, int]",
                          "E            ^^^", "E   SyntaxError: invalid syntax"), "needs-python"),
        (failed_test("/venv/lib/python3.11/site-packages/torch/cuda/__init__.py:310: RuntimeError",
                      "E   RuntimeError: Found no NVIDIA driver on your system."), "needs-gpu"),
        (failed_test("/venv/lib/python3.11/site-packages/docker/api/client.py:221: DockerException",
                      "E   docker.errors.DockerException: Error while fetching server API version: "
                      "('Connection aborted.', FileNotFoundError(2, 'No such file or directory'))"), "needs-docker"),
        (failed_test("/venv/lib/python3.11/site-packages/openai/_client.py:110: OpenAIError",
                      "E   openai.OpenAIError: The api_key client option must be set either by passing api_key to "
                      "the client or by setting the OPENAI_API_KEY environment variable"), "needs-api-key"),
        (failed_test("app.py:30: KeyError", "E   KeyError: 'TAVILY_API_KEY'"), "needs-api-key"),
        (failed_test("/venv/lib/python3.11/site-packages/aiohttp/connector.py:1268: ClientConnectorError",
                      "E   aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host "
                      "huggingface.co:443 ssl:default [Temporary failure in name resolution]"), "needs-network"),
        (failed_test("tests/test_app.py:12: AssertionError", "E       assert 0.0 == 1.0"), "other"),
    ],
)  # fmt: skip
def test_a_failed_test_is_classified(text: str, cause: str) -> None:
    assert classify_failure(text) == cause


def test_a_network_error_raised_inside_our_client_is_the_network() -> None:
    text = failed_test(
        "/work/main/nemo_gym/transport/http_client.py:201: ClientConnectorError",
        "E   aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host api.example.com:443",
    )
    assert classify_failure(text) == "needs-network"


@pytest.mark.parametrize(
    ("log", "cause"),
    [
        ("Using Python 3.11.7 environment at: /cache/venvs/x\n  × No solution found when resolving dependencies:\n"
         "  ╰─▶ Because there is no version of vllm==0.19.2 and you require vllm==0.19.2, we can conclude that your "
         "requirements are unsatisfiable.", "missing-dependency"),
        ("  × Failed to download and build `tau2 @ git+https://github.com/bxyu-nvidia/tau2-bench@stable`\n"
         "  ├─▶ Git operation failed\n  ╰─▶ failed to clone into: /root/.cache/uv/git-v0/db/6f1c", "needs-network"),
        ("  × No solution found when resolving dependencies:\n  ╰─▶ Because the current Python version (3.11.7) does "
         "not satisfy Python>=3.12 and spacy==3.9.0 depends on Python>=3.12, we can conclude that spacy==3.9.0 "
         "cannot be used.", "needs-python"),
    ],
)  # fmt: skip
def test_a_failed_venv_build_is_classified(log: str, cause: str) -> None:
    assert classify_failure(log, "build") == cause


def test_a_timeout_is_a_timeout_whatever_the_text() -> None:
    assert classify_failure("E   ModuleNotFoundError: No module named 'nemo_gym.judge'", "timeout") == "timeout"


def test_first_error_line_is_the_exception_not_the_traceback() -> None:
    text = collection_error("E   ModuleNotFoundError: No module named 'ray'")
    assert first_error_line(text) == "ModuleNotFoundError: No module named 'ray'"
    chained = failed_test(
        "app.py:9: RuntimeError",
        "E   KeyError: 'x'",
        "E   During handling of the above exception, another exception occurred:",
        "E   RuntimeError: the verifier failed",
    )
    assert first_error_line(chained) == "RuntimeError: the verifier failed"
    assert first_error_line(failed_test("t.py:3: AssertionError", "E       assert 1 == 2", "E        +  where")) == (
        "assert 1 == 2"
    )
    assert first_error_line("\n\nsomething went wrong\n") == "something went wrong"
    assert first_error_line("") == ""
