"""`llama_dflash.Llama(..., speculative=...)` with flash attention off (llama_cpp.Llama's default)
warns once that greedy text can differ from ordinary decoding at near-ties, and how to avoid it
(issue 43, item 4)."""

from __future__ import annotations

import warnings

import pytest

from llama_dflash import highlevel
from llama_dflash.config import SpecConfig
from llama_dflash.highlevel import Llama

KW = dict(n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1, verbose=False)


def _made(*args, **kwargs) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Llama(*args, **kwargs).close()
    return [w for w in caught if "flash_attn" in str(w.message)]


def test_warns_once_with_flash_attention_off(tiny_target, tiny_draft, monkeypatch):
    monkeypatch.setattr(highlevel, "_flash_attn_warned", False)
    first = _made(tiny_target, speculative=SpecConfig(tiny_draft), **KW)
    assert len(first) == 1 and issubclass(first[0].category, UserWarning)
    assert "near-ties" in str(first[0].message) and "flash_attn=True" in str(first[0].message)
    assert first[0].filename == __file__  # points at the caller's line
    assert _made(tiny_target, speculative=SpecConfig(tiny_draft), **KW) == []  # once


@pytest.mark.parametrize("case", ["flash_attn on", "no speculation", "spec_type none"])
def test_silent_otherwise(tiny_target, tiny_draft, monkeypatch, case):
    monkeypatch.setattr(highlevel, "_flash_attn_warned", False)
    kwargs = {"flash_attn on": dict(speculative=SpecConfig(tiny_draft), flash_attn=True),
              "no speculation": dict(speculative=None),
              "spec_type none": dict(speculative=SpecConfig(spec_type="none"))}[case]
    assert _made(tiny_target, **kwargs, **KW) == []
