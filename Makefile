# Two commands for a fresh machine: `make demo` and `make test`. Everything else is a building block.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-16)

.PHONY: setup test lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@test -x $(BIN)/uv || $(BIN)/python -m pip install --quiet --disable-pip-version-check uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e '.[dev,embedded]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) results cache .pytest_cache
