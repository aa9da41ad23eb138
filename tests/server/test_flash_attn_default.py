"""`llama-dflash serve` turns flash attention on by default (issue 13, found by bench/load.py).

With llama_cpp.Llama's default (flash_attn=False), a quantized CPU build computes a verification
batch's attention with another kernel than a single-token decode: logits differ by up to 0.5 on
SmolLM2 Q4_1, a near-tie flips, and greedy answers depended on the draft lengths the adaptive
controller picked from timings (not reproducible across runs).  With flash attention the batch
computes exactly what single decodes compute.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from llama_dflash.server import cli as server_cli  # noqa: E402


class _Stop(Exception):
    pass


def _constructed_with(monkeypatch, argv: list[str]) -> dict:
    seen: dict = {}

    def fake_llama(model, **kw):
        seen.update(kw)
        raise _Stop()

    monkeypatch.setattr("llama_dflash.highlevel.Llama", fake_llama)
    parser = argparse.ArgumentParser()
    server_cli.configure(parser)
    with pytest.raises(_Stop):
        server_cli.run(parser.parse_args(["--model", "m.gguf", *argv]))
    return seen


def test_serve_uses_flash_attention_by_default(monkeypatch):
    assert _constructed_with(monkeypatch, [])["flash_attn"] is True
    assert _constructed_with(monkeypatch, ["--flash-attn", "off"])["flash_attn"] is False


def _batch_vs_single(path: str, flash_attn: bool) -> float:
    from llama_dflash._llama import Model, set_verbose
    from llama_dflash.config import TargetConfig
    from llama_dflash.target import TargetContext

    set_verbose(False)
    model = Model(path)
    tgt = TargetContext(model, TargetConfig(model=path, n_ctx=512, n_threads=2,
                                            flash_attn="on" if flash_attn else "off"))
    try:
        toks = model.tokenize("<|im_start|>user\nWrite a Python function that reverses a list.<|im_end|>\n"
                              "<|im_start|>assistant\n") + list(range(1000, 1008))
        p = len(toks) - 8
        tgt.decode(toks[:p], 0, logits="none")
        single = []
        for i in range(p, p + 5):
            tgt.decode([toks[i]], i, logits="last")
            single.append(np.array(tgt.logits_row(0)))
        worst = 0.0
        for n in (2, 5):
            tgt.seq_rm(p)
            tgt.decode(toks[p:p + n], p, logits="all")
            worst = max(worst, max(float(np.abs(np.array(tgt.logits_row(j)) - single[j]).max()) for j in range(n)))
        return worst
    finally:
        tgt.close()
        model.close()


@pytest.mark.slow
def test_flash_attention_makes_a_batch_equal_single_decodes():
    """The property the server's default relies on, on the real model (and that without flash
    attention it does not hold there: the reason for the default)."""
    from llama_dflash.defaults import smollm2_path

    path = smollm2_path()
    assert _batch_vs_single(path, flash_attn=True) == 0.0
    assert _batch_vs_single(path, flash_attn=False) > 0.0
