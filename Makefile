PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test demo lint up
setup: $(BIN)/tide

$(BIN)/tide: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(BIN)/tide

test: setup
	$(BIN)/pytest -q

demo: setup
	$(BIN)/tide up --demo

lint: setup
	$(BIN)/ruff check .
