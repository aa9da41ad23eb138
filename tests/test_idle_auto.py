"""While `auto` decodes ordinarily it should cost what ordinary decoding costs: no layer-input
extraction far from a probe (the draft cache closes the gap, `PositionMap`) and probes scored
against the tokens ordinary decoding produces instead of verified (shadow probes)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import PROMPT_TEXT
from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig
from llama_dflash.adaptive import AdaptiveController, FixedCosts
from llama_dflash.errors import LlamaCallError
from llama_dflash.proposer import PositionMap, ScriptedProposer

CPU = FixedCosts(verify=lambda k: 0.010 + 0.006 * k, draft=lambda k: 0.004 + 0.0007 * k)


# ---- PositionMap ------------------------------------------------------------------------------
def test_position_map_is_the_identity_without_gaps():
    m = PositionMap()
    assert m.place(0, 5) == 0 and m.place(5, 3) == 5
    assert m.block_pos(8) == 8
    assert m.cut(6) == 6 and m.end_target == 6
    assert m.place(6, 1) == 6


def test_position_map_closes_gaps_and_cuts_through_them():
    m = PositionMap()
    m.place(0, 10)  # target 0..9 -> draft 0..9
    assert m.place(15, 5) == 10  # target 15..19 -> draft 10..14 (10..14 never came)
    assert m.block_pos(20) == 15
    assert m.place(20, 2) == 15  # contiguous with the last run
    assert m.cut(17) == 12 and (m.end_target, m.end_draft) == (17, 12)  # inside the second run
    assert m.cut(12) == 10 and (m.end_target, m.end_draft) == (10, 10)  # inside the gap: run 2 goes
    assert m.place(12, 1) == 10  # a new gap, closed the same way
    assert m.cut(4) == 4 and m.runs == [(0, 0)]
    with pytest.raises(ValueError, match="roll back first"):
        m.place(2, 1)
    assert m.cut(0) == 0 and m.runs == []
    assert m.block_pos(7) == 7  # nothing injected: the block goes where the target is
    assert m.cut(5) == 5  # nothing mapped (a restored cache): rows sit at their own positions
    assert m.place(3, 2) == 3  # a fresh map starts as the identity (prefix reuse)
    assert m.cut(2) == 2 and m.runs == []  # below the first run: the identity too


def test_a_block_after_a_gap_drafts_as_if_the_rows_were_contiguous(tiny_config, tiny_draft):
    """The draft cache after a gap must hold the same rows at the same relative places as a cache
    fed only those rows: the gapped engine and a contiguous one propose the same tokens."""
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=4, backend_sampling=False)) as eng:
        p = eng._dflash
        prompt = eng.tokenize(PROMPT_TEXT)
        assert len(prompt) >= 8
        toks = (prompt * 4)[:24]
        eng.target.clear()
        eng.target.decode(toks, 0, logits="none")
        feats = eng.target.layer_features()
        p.clear()
        p.inject(feats[:8], 0)
        p.inject(np.ascontiguousarray(feats[14:20]), 14)  # rows 8..13 never injected
        gapped = p.propose(toks[20], 20, 4)
        assert p.pos_max() == 13  # the block's cells are gone again; 14 rows of features stay
        p.clear()
        p.inject(np.ascontiguousarray(np.concatenate([feats[:8], feats[14:20]])), 0)
        contiguous = p.propose(toks[20], 14, 4)
        assert gapped == contiguous and len(gapped) == 4
        # rolling back into the gap keeps the rows before it; drafting goes on from there
        p.clear()
        p.inject(feats[:8], 0)
        p.inject(np.ascontiguousarray(feats[14:20]), 14)
        p.rollback(11)
        assert p.pos_max() == 7
        p.inject(np.ascontiguousarray(feats[11:13]), 11)
        assert p.pos_max() == 9
        assert len(p.propose(toks[13], 13, 4)) == 4


def test_layer_features_refused_after_a_decode_without_extraction(tiny_config, tiny_draft):
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=4)) as eng:
        t = eng.target
        prompt = eng.tokenize(PROMPT_TEXT)
        t.clear()
        t.set_extraction(False)
        t.decode(prompt, 0, logits="last")
        with pytest.raises(LlamaCallError, match="did not extract"):
            t.layer_features()
        t.set_extraction(True)
        t.decode(prompt[:1], len(prompt), logits="last")
        assert t.layer_features().shape == (1, len(eng.draft_info.target_layers) * t.n_embd)


# ---- the controller ---------------------------------------------------------------------------
def _idle(ctl: AdaptiveController, steps: int) -> list[tuple[int, int, bool]]:
    """Steps with a draft that never matches: (k chosen, shadow tokens, wants features) each."""
    out = []
    for _ in range(steps):
        k = ctl.choose(7)
        shadow = ctl.shadow_probe()
        out.append((k, shadow, ctl.wants_features()))
        ctl.observe(k, 0, 0.0, 0.0)
        if shadow:
            ctl.observe_shadow(shadow, 0)
    return out


def test_idle_controller_probes_in_shadow_and_skips_features_far_from_probes():
    ctl = AdaptiveController(7, CPU, shadow_probes=True)
    steps = _idle(ctl, 600)
    tail = steps[200:]
    assert all(k == 0 for k, _, _ in tail)  # nothing verified once idle
    probes = [i for i, (_, s, _) in enumerate(tail) if s]
    assert len(probes) >= 2 and all(tail[i][1] == ctl.probe_tokens for i in probes)
    assert ctl.probe_interval == ctl.max_probe_interval
    # features only in the warm window before each probe (and on the probe's own step not at all:
    # its draft was made before the decode)
    wants = [w for _, _, w in tail]
    assert sum(wants) / len(wants) < 2 * ctl.warm_window / ctl.max_probe_interval
    for i in probes[1:]:
        assert all(wants[i - ctl.warm_window : i])
        assert not any(wants[i - ctl.max_probe_interval + 1 : i - ctl.warm_window])


def test_without_shadow_probes_probes_are_verified():
    ctl = AdaptiveController(7, CPU)
    steps = _idle(ctl, 300)
    assert all(s == 0 for _, s, _ in steps)
    assert any(k for k, _, _ in steps[100:])


def test_a_fully_accepted_shadow_probe_makes_the_next_probe_verified():
    ctl = AdaptiveController(7, CPU, shadow_probes=True)
    _idle(ctl, 300)
    while True:  # the next shadow probe: accepted whole
        k = ctl.choose(7)
        assert k == 0
        n = ctl.shadow_probe()
        ctl.observe(0, 0, 0.0, 0.0)
        if n:
            ctl.observe_shadow(n, n)
            break
    k = ctl.choose(7)
    assert k == 2 * n  # verified at once, twice as long (and it earns its tokens)
    assert ctl.shadow_probe() == 0 and ctl.wants_features()


# ---- the engine's loop ------------------------------------------------------------------------
@pytest.fixture()
def long_config(tiny_config):
    return dataclasses.replace(tiny_config, n_ctx=1024)


def _reference(config, n):
    with OrdinaryDecoding(config) as o:
        prompt = o.tokenize(PROMPT_TEXT)
        return prompt, o.generate(prompt, n, ignore_eos=True).tokens


def _count_extraction(eng):
    """Wrap the target's decode: single-row decodes with / without layer-input extraction."""
    counts = {"on": 0, "off": 0}
    decode = eng.target.decode

    def counting(tokens, pos0, logits="last"):
        if len(tokens) == 1:
            counts["on" if eng.target.extracting else "off"] += 1
        return decode(tokens, pos0, logits)

    eng.target.decode = counting
    return counts


def test_idle_auto_skips_extraction_and_verifies_no_probe(long_config, tiny_draft):
    prompt, ref = _reference(long_config, 400)
    assert len(ref) == 400
    with LlamaDFlashDecoding(long_config, SpecConfig(tiny_draft, draft_n_max="auto")) as eng:
        eng.controller.costs = CPU
        # a draft that is always wrong
        eng.use_proposer(ScriptedProposer(eng._dflash, lambda n_past, n: [(t % 300) + 7 for t in range(n)]))
        counts = _count_extraction(eng)
        first = eng.generate(prompt, 400, ignore_eos=True)
        assert first.tokens == ref
        counts.update(on=0, off=0)
        second = eng.generate(prompt, 400, ignore_eos=True)
    assert second.tokens == ref
    s = second.stats
    assert s.verified == 0 and s.rollbacks == 0  # every probe was a shadow probe
    assert s.shadow_probes >= 2 and s.shadow_drafted >= 2 * s.shadow_probes and s.shadow_accepted == 0
    assert counts["off"] > 0.7 * (counts["on"] + counts["off"])
    assert eng.target.extracting  # left on for whoever decodes next


def test_auto_resumes_after_idle_stretches_with_identical_output(long_config, tiny_draft):
    """Garbage for 130 tokens (long enough for probes to grow rare and the extraction to stop),
    then the truth: a shadow probe catches it, drafting resumes with a draft cache that has gaps,
    the output stays the target's."""
    prompt, ref = _reference(long_config, 360)
    assert len(ref) == 360
    seq = prompt + ref

    def script(n_past, n):
        block = seq[n_past + 1 : n_past + 1 + n]
        good = n_past + 1 - len(prompt) >= 130
        return block if good else [(t + 3) % 300 + 1 for t in block]

    with LlamaDFlashDecoding(long_config, SpecConfig(tiny_draft, draft_n_max="auto")) as eng:
        eng.controller.costs = CPU
        eng.use_proposer(ScriptedProposer(eng._dflash, script))
        counts = _count_extraction(eng)
        res = eng.generate(prompt, 360, ignore_eos=True)
        assert eng.target.pos_max() == len(prompt) + 360 - 2
    assert res.tokens == ref
    s = res.stats
    assert s.shadow_probes > 0 and s.shadow_accepted > 0
    assert s.accepted > 60 and any(int(k) >= 4 for k in s.chosen_draft_tokens)
    assert counts["off"] > 0  # some idle steps skipped the extraction, and drafting came back after
