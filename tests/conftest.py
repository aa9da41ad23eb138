import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from llama_dflash.config import TargetConfig  # noqa: E402
from llama_dflash.writer import write_random_draft, write_tiny_target  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_target(tiny_dir):
    return write_tiny_target(str(tiny_dir / "target.gguf"), seed=1)


@pytest.fixture(scope="session")
def tiny_draft(tiny_dir, tiny_target):
    """Shares embeddings and LM head with the target through ctx_other."""
    return write_random_draft(str(tiny_dir / "draft.gguf"), tiny_target, block_size=16, seed=2)


@pytest.fixture(scope="session")
def tiny_draft_own_embd(tiny_dir, tiny_target):
    """Carries its own token_embd and output tensors."""
    return write_random_draft(str(tiny_dir / "draft_embd.gguf"), tiny_target, block_size=16, seed=3,
                              with_embeddings=True, n_layer=2)


@pytest.fixture()
def tiny_config(tiny_target):
    return TargetConfig(tiny_target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)


PROMPT_TEXT = "the quick brown fox and the lazy dog is"


# `make test` (and so CI) builds llama.cpp's C++ reference binaries first and sets this: a parity
# test skipped there for a missing binary would check nothing, so it fails instead
REQUIRE_CPP = os.environ.get("LLAMA_DFLASH_REQUIRE_CPP") == "1"
_MISSING_BINARY = ("not built", "build-cpp-reference", "build_cpp_reference")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_CPP and report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        if any(s in reason for s in _MISSING_BINARY):
            report.outcome = "failed"
            report.longrepr = f"LLAMA_DFLASH_REQUIRE_CPP=1 but a C++ reference binary is missing: {reason}"
