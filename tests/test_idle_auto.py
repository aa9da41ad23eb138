"""While `auto` decodes ordinarily, its probes are drafted but not verified: they are scored against
the tokens ordinary decoding goes on to produce (shadow probes), so an idle `auto` pays one draft
block per probe instead of a wide verification and a rollback."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import PROMPT_TEXT
from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig
from llama_dflash.adaptive import AdaptiveController, FixedCosts
from llama_dflash.proposers import ScriptedProposer

CPU = FixedCosts(verify=lambda k: 0.010 + 0.006 * k, draft=lambda k: 0.004 + 0.0007 * k)


# ---- the controller ---------------------------------------------------------------------------
def _idle(ctl: AdaptiveController, steps: int) -> list[tuple[int, int]]:
    """Steps with a draft that never matches: (k chosen, shadow tokens) each."""
    out = []
    for _ in range(steps):
        k = ctl.choose(7)
        shadow = ctl.shadow_probe()
        out.append((k, shadow))
        ctl.observe(k, 0, 0.0, 0.0)
        if shadow:
            ctl.observe_shadow(shadow, 0)
    return out


def test_idle_controller_probes_in_shadow_with_back_off():
    ctl = AdaptiveController(7, CPU, shadow_probes=True)
    steps = _idle(ctl, 600)
    tail = steps[200:]
    assert all(k == 0 for k, _ in tail)  # nothing verified once idle
    probes = [i for i, (_, s) in enumerate(tail) if s]
    assert len(probes) >= 2 and all(tail[i][1] == ctl.probe_tokens for i in probes)
    assert ctl.probe_interval == ctl.max_probe_interval
    assert all(b - a == ctl.max_probe_interval for a, b in zip(probes, probes[1:]))


def test_without_shadow_probes_probes_are_verified():
    ctl = AdaptiveController(7, CPU)
    steps = _idle(ctl, 300)
    assert all(s == 0 for _, s in steps)
    assert any(k for k, _ in steps[100:])


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
    assert ctl.shadow_probe() == 0
    ctl.observe(k, 1, 0.0, 0.0)  # a verified probe that is not accepted whole: shadows again
    for _ in range(ctl.probe_interval):
        assert ctl.choose(7) == 0
        ctl.observe(0, 0, 0.0, 0.0)
    assert ctl.shadow_probe() == ctl.probe_tokens


# ---- the engine's loop ------------------------------------------------------------------------
@pytest.fixture()
def long_config(tiny_config):
    return dataclasses.replace(tiny_config, n_ctx=1024)


def _reference(config, n):
    with OrdinaryDecoding(config) as o:
        prompt = o.tokenize(PROMPT_TEXT)
        return prompt, o.generate(prompt, n, ignore_eos=True).tokens


def _count_wide_decodes(eng):
    """Wrap the target's decode: how many decodes of more than one row (verifications) it ran."""
    counts = {"wide": 0}
    decode = eng.target.decode

    def counting(tokens, pos0, logits="last"):
        if len(tokens) > 1 and logits == "all":
            counts["wide"] += 1
        return decode(tokens, pos0, logits)

    eng.target.decode = counting
    return counts


def test_idle_auto_verifies_no_probe(long_config, tiny_draft):
    prompt, ref = _reference(long_config, 400)
    assert len(ref) == 400
    with LlamaDFlashDecoding(long_config, SpecConfig(tiny_draft, draft_n_max="auto")) as eng:
        eng.controller.costs = CPU
        # a draft that is always wrong
        eng.use_proposer(ScriptedProposer(eng._dflash, lambda n_past, n: [(t % 300) + 7 for t in range(n)]))
        counts = _count_wide_decodes(eng)
        first = eng.generate(prompt, 400, ignore_eos=True)
        assert first.tokens == ref
        counts.update(wide=0)
        second = eng.generate(prompt, 400, ignore_eos=True)
    assert second.tokens == ref
    s = second.stats
    assert s.verified == 0 and s.rollbacks == 0 and counts["wide"] == 0  # every probe was a shadow probe
    assert s.shadow_probes >= 2 and s.shadow_drafted == 2 * s.shadow_probes and s.shadow_accepted == 0
    assert s.drafted == 0 and s.draft_steps == s.shadow_probes


def test_auto_resumes_after_idle_stretches_with_identical_output(long_config, tiny_draft):
    """Garbage for 130 tokens (long enough for probes to grow rare), then the truth: a shadow
    probe catches it, verified drafting resumes, the output stays the target's."""
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
        res = eng.generate(prompt, 360, ignore_eos=True)
        assert eng.target.pos_max() == len(prompt) + 360 - 2
    assert res.tokens == ref
    s = res.stats
    assert s.shadow_probes > 0 and s.shadow_accepted > 0
    assert s.accepted > 60 and any(int(k) >= 4 for k in s.chosen_draft_tokens)


# ---- llama_dflash.Llama (the drop-in and the server: Speculator) ------------------------------
HL = dict(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, verbose=False)


def _llama_cpp_tokens(tiny_target, n):
    """Greedy continuation of PROMPT_TEXT by llama_cpp.Llama itself (the reference)."""
    import llama_cpp

    ref = llama_cpp.Llama(tiny_target, **HL)
    try:
        prompt = ref.tokenize(PROMPT_TEXT.encode())
        eos = ref.token_eos()

        def no_eos(_ids, scores):
            scores[eos] = -np.inf
            return scores

        out = []
        for tok in ref.generate(prompt, temp=0.0, logits_processor=llama_cpp.LogitsProcessorList([no_eos])):
            out.append(int(tok))
            if len(out) == n:
                break
        text = _complete(ref, n)
        assert ref.detokenize(out).decode(errors="ignore").startswith(text[:20])
        return prompt, out, text
    finally:
        ref.close()


def _complete(llm, n):
    """n greedy tokens, end of generation masked (the tiny target would stop early)."""
    out = llm.create_completion(PROMPT_TEXT, max_tokens=n, temperature=0, logit_bias={llm.token_eos(): -1e9})
    assert out["usage"]["completion_tokens"] == n
    return out["choices"][0]["text"]


def _auto_llama(tiny_target, tiny_draft, script):
    from llama_dflash.highlevel import Llama

    llm = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max="auto"), **HL)
    llm.speculator.controller.costs = CPU
    llm.speculator.use_proposer(ScriptedProposer(llm.speculator.draft, script))
    return llm


def test_dropin_idle_auto_verifies_no_probe(tiny_target, tiny_draft):
    _, _, ref_text = _llama_cpp_tokens(tiny_target, 300)
    llm = _auto_llama(tiny_target, tiny_draft, lambda n_past, n: [(t % 300) + 7 for t in range(n)])
    try:
        texts = [_complete(llm, 300) for _ in range(2)]
        s = llm.speculator.stats  # the second completion's
    finally:
        llm.close()
    assert texts == [ref_text, ref_text]
    assert s.verified == 0 and s.rollbacks == 0  # every probe was a shadow probe
    assert s.shadow_probes >= 2 and s.shadow_drafted == 2 * s.shadow_probes and s.shadow_accepted == 0


def test_dropin_auto_resumes_after_an_idle_stretch(tiny_target, tiny_draft):
    prompt, ref, ref_text = _llama_cpp_tokens(tiny_target, 300)
    seq = list(prompt) + ref

    def script(n_past, n):
        block = seq[n_past + 1 : n_past + 1 + n]
        good = n_past + 1 - len(prompt) >= 130
        return block if good else [(t + 3) % 300 + 1 for t in block]

    llm = _auto_llama(tiny_target, tiny_draft, script)
    try:
        text = _complete(llm, 300)
        s = llm.speculator.stats
    finally:
        llm.close()
    assert text == ref_text
    assert s.shadow_probes > 0 and s.shadow_accepted > 0
    # (verified probes resume the same way here: 44 accepted, k 2 x5, 4, 8, 15 x3)
    assert s.accepted > 30 and s.rollbacks == 0 and any(int(k) >= 8 for k in s.chosen_draft_tokens)
