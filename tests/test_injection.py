"""Feature injection into the draft is queued and written in batches; drafts do not change."""

from __future__ import annotations

import numpy as np

from conftest import PROMPT_TEXT
from llama_dflash import LlamaDFlashDecoding, SpecConfig
from spec_common import Recorder


def _blocks(config, draft, chunk=None):
    with LlamaDFlashDecoding(config, SpecConfig(draft, draft_n_max=4, backend_sampling=False)) as eng:
        if chunk is not None:
            eng._dflash._chunk = chunk  # 1: every inject is written at once, as without a queue
        rec = Recorder(eng._dflash)
        eng.use_proposer(rec)
        prompt = eng.tokenize(PROMPT_TEXT)
        res = eng.generate(prompt, 30, ignore_eos=True)
        assert eng.target.pos_max() == eng._dflash.pos_max()
        return rec.blocks, res.tokens


def test_queued_injection_drafts_like_immediate(tiny_config, tiny_draft):
    queued, out_q = _blocks(tiny_config, tiny_draft)
    immediate, out_i = _blocks(tiny_config, tiny_draft, chunk=1)
    assert out_q == out_i
    assert len(queued) == len(immediate) > 0
    for a, b in zip(queued, immediate):
        assert a == b


def test_rollback_and_clear_drop_queued_rows(tiny_config, tiny_draft):
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=4)) as eng:
        p = eng._dflash
        eng.target.clear()
        p.clear()
        prompt = eng.tokenize(PROMPT_TEXT)
        eng.target.decode(prompt, 0, logits="none")
        feats = eng.target.layer_features()
        p.inject(feats[:4], 0)
        p.inject(feats[4:], 4)
        assert p.ctx.pos_max(0) == -1  # queued, not written yet
        p.rollback(6)
        assert p.pos_max() == 5  # rows 6.. of the queue were dropped before writing
        p.inject(np.ascontiguousarray(feats[6:]), 6)
        p.clear()
        assert p.pos_max() == -1
