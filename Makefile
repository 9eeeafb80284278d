PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test typecheck demo lint up
setup: $(BIN)/tide

$(BIN)/tide: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[all,dev]'   # every extra: agent, sim, stack (pyproject.toml)
	touch $(BIN)/tide

test: setup typecheck
	$(BIN)/pytest -q

# mypy --strict on the pure core (config: [tool.mypy] in pyproject.toml)
typecheck: setup
	$(BIN)/mypy

demo: setup
	$(BIN)/tide up --demo

lint: setup
	$(BIN)/ruff check .
