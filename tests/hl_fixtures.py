"""Fixtures shared by the high-level API tests (imported by name into their modules):
our Llama with and without a draft, on the tiny pair."""

import pytest

from llama_dflash import SpecConfig
from llama_dflash.highlevel import Llama

HL_KW = dict(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, verbose=False)


@pytest.fixture(scope="module")
def spec(tiny_target, tiny_draft):
    llm = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=4), **HL_KW)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def ordinary(tiny_target):
    llm = Llama(tiny_target, **HL_KW)
    yield llm
    llm.close()
