"""The adaptive draft-length controller: deterministic with injected costs, correct end to end."""

from __future__ import annotations

import pytest

from conftest import PROMPT_TEXT
from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig
from llama_dflash.adaptive import AcceptanceModel, AdaptiveController, CostModel, FixedCosts
from llama_dflash.proposers import ScriptedProposer

CPU = FixedCosts(verify=lambda k: 0.010 + 0.006 * k, draft=lambda k: 0.004 + 0.0007 * k)  # DESIGN.md's curve
GPU = FixedCosts(verify=lambda k: 0.010 + 0.0002 * k, draft=lambda k: 0.001 + 0.0001 * k)


def _feed(ctl: AdaptiveController, profile: list[float], steps: int = 400) -> None:
    """Observe `steps` full-length drafts whose slots are accepted with conditional probs `profile`."""
    import random

    rnd = random.Random(0)
    for _ in range(steps):
        n = 0
        while n < len(profile) and rnd.random() < profile[n]:
            n += 1
        ctl.observe(len(profile), n, 0.0, 0.0)


def _brute_force(costs: FixedCosts, profile: list[float]) -> int:
    def rate(k):
        total, run = 1.0, 1.0
        for p in profile[:k]:
            run *= p
            total += run
        return total / (costs.verify_time(k) + costs.draft_time(k))

    return max(range(len(profile) + 1), key=rate)


@pytest.mark.parametrize("costs,profile", [
    (CPU, [0.95] * 7),
    (CPU, [0.6] * 7),
    (CPU, [0.9, 0.9, 0.5, 0.3, 0.2, 0.1, 0.1]),
    (GPU, [0.9] * 7),
    (GPU, [0.5, 0.4, 0.3, 0.2, 0.2, 0.2, 0.2]),
    (GPU, [0.05] * 7),
])
def test_picks_the_known_optimum(costs, profile):
    ctl = AdaptiveController(7, costs)
    ctl.acceptance = AcceptanceModel(7, decay=0.999)
    _feed(ctl, profile, 3000)
    expected = _brute_force(costs, [ctl.acceptance.p(i) for i in range(7)])
    assert ctl.best_k(7) == expected
    # and the estimated acceptance is close to the scripted one
    for i, p in enumerate(profile):
        if ctl.acceptance.trials[i] > 50:
            assert abs(ctl.acceptance.p(i) - p) < 0.08


def test_cpu_curve_never_drafts_one_token():
    # on this curve k=1 costs 1.64 decodes plus a draft: even perfect acceptance cannot pay it back
    ctl = AdaptiveController(7, CPU)
    _feed(ctl, [1.0] * 7, 200)
    assert ctl.best_k(1) == 0
    assert ctl.best_k(7) >= 6


def test_falls_back_to_ordinary_and_probes_rarely():
    ctl = AdaptiveController(7, CPU)
    chosen = []
    for _ in range(300):
        k = ctl.choose(7)
        chosen.append(k)
        ctl.observe(k, 0, 0.0, 0.0)  # nothing is ever accepted
    tail = chosen[50:]
    assert tail.count(0) / len(tail) > 0.95
    assert 0 < sum(1 for k in tail if k) <= 8  # probes with exponential back-off
    assert max(tail) <= ctl.probe_tokens


def test_resumes_when_drafts_start_matching():
    ctl = AdaptiveController(7, CPU)
    for _ in range(200):
        k = ctl.choose(7)
        ctl.observe(k, 0, 0.0, 0.0)
    assert ctl.best_k(7) == 0
    resumed_at = None
    for step in range(400):
        k = ctl.choose(7)
        ctl.observe(k, k, 0.0, 0.0)  # every drafted token is accepted now
        if k >= 4 and resumed_at is None:
            resumed_at = step
    assert resumed_at is not None and resumed_at < 300
    assert ctl.best_k(7) >= 6  # 6 and 7 are within the prior's pull of each other


def test_cost_model_fits_unmeasured_lengths():
    cm = CostModel()
    for _ in range(5):
        cm.observe(0, 0.0, 0.010)
        cm.observe(6, 0.006, 0.046)
    assert cm.verify_time(3) == pytest.approx(0.028, rel=1e-6)
    assert cm.draft_time(0) == 0.0
    # noise never makes a longer block look cheaper (the fitted slope is clamped at >= 0)
    cm2 = CostModel()
    cm2.observe(0, 0.0, 0.02)
    cm2.observe(4, 0.001, 0.01)
    assert cm2.verify_time(4) >= cm2.verify_time(0) - 1e-12


def test_cost_model_keeps_the_cpu_kink_between_one_row_and_two():
    """Measured lengths read their own cost: a line fitted mostly on long drafts would call a
    1-token verification far cheaper than measured (on a 2-core CPU: 1.9 single decodes)."""
    cm = CostModel()
    measured = {0: 0.008, 1: 0.015, 2: 0.017, 8: 0.030, 16: 0.040}
    for k, v in measured.items():
        for _ in range(20 if k == 16 else 3):
            cm.observe(k, 0.001, v)
    assert cm.verify_time(1) == pytest.approx(0.015)
    assert cm.verify_time(0) == pytest.approx(0.008)
    assert cm.verify_time(5) == pytest.approx(0.017 + 0.013 * 3 / 6)
    assert cm.verify_time(20) > cm.verify_time(16)  # extrapolated with the fitted slope
    # noise that makes a longer block measure cheaper is flattened, never believed
    cm.observe(3, 0.001, 0.001)
    assert cm.verify_time(3) == pytest.approx(0.017)


def test_auto_config_and_stats(tiny_config, tiny_draft):
    with pytest.raises(ValueError, match="or 'auto'"):
        SpecConfig(tiny_draft, draft_n_max="fast")
    with OrdinaryDecoding(tiny_config) as o:
        prompt = o.tokenize(PROMPT_TEXT)
        ref = o.generate(prompt, 120, ignore_eos=True).tokens
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max="auto")) as eng:
        assert eng.draft_n_max == 15
        first = eng.generate(prompt, 120, ignore_eos=True)
        second = eng.generate(prompt, 120, ignore_eos=True)
    assert first.tokens == ref and second.tokens == ref
    for res in (first, second):
        s = res.stats
        assert s.adaptive
        # every step is chosen by the controller except a last one with no room left to draft
        assert s.verification_steps - 1 <= sum(s.chosen_draft_tokens.values()) <= s.verification_steps
        assert s.ordinary_steps == s.chosen_draft_tokens.get("0", 0)
        assert s.cost_curve
    # the controller is kept: the second call starts warm and mostly decodes ordinarily (random draft)
    assert second.stats.ordinary_steps > 0.8 * second.stats.verification_steps


def test_greedy_output_identical_through_every_switch(tiny_config, tiny_draft):
    with OrdinaryDecoding(tiny_config) as o:
        prompt = o.tokenize(PROMPT_TEXT)
        ref = o.generate(prompt, 180, ignore_eos=True).tokens
    seq = prompt + ref

    def script(n_past, n):
        generated = n_past + 1 - len(prompt)
        good = (generated // 40) % 2 == 1  # alternate 40-token stretches of garbage and of the truth
        block = seq[n_past + 1 : n_past + 1 + n]
        return block if good else [(t + 3) % 300 + 1 for t in block]

    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max="auto")) as eng:
        eng.controller.costs = CPU  # a known curve: drafting pays only with long accepted runs
        eng.use_proposer(ScriptedProposer(eng._dflash, script))
        res = eng.generate(prompt, 180, ignore_eos=True)
    assert res.tokens == ref
    s = res.stats
    assert s.ordinary_steps > 0 and s.accepted > 20
    assert any(int(k) >= 4 for k in s.chosen_draft_tokens)


def test_set_draft_n_max_switches_modes(tiny_config, tiny_draft):
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=3)) as eng:
        assert eng.controller is None
        assert eng.set_draft_n_max("auto") == "auto" and eng.controller is not None
        assert eng.set_draft_n_max(5) == 5 and eng.controller is None
        with pytest.raises(ValueError):
            eng.set_draft_n_max(0)


# ---- block semantics (issue 12 item 2): the block is decoded at n_max (+1), then cut ----------

def _block_spy(p, monkeypatch):
    blocks: list[int] = []
    real = type(p)._draft_block

    def spy(self, id_last, n_past, n_block):
        blocks.append(n_block)
        return real(self, id_last, n_past, n_block)

    monkeypatch.setattr(type(p), "_draft_block", spy)
    return blocks


@pytest.fixture(scope="module")
def attentive_draft(tiny_dir, tiny_target):
    """A random draft with weights large enough that the mask slots' attention moves the argmax
    (the default fixtures' slots barely see each other: their proposals ignore the block length)."""
    from llama_dflash.inspect import read_gguf
    from llama_dflash.writer import DraftShape, evenly_spread_layers, random_draft_weights, write_draft

    target = read_gguf(tiny_target)
    shape = DraftShape(n_embd=target.n_embd, n_head=4, n_head_kv=2, block_size=16,
                       target_layers=evenly_spread_layers(target.n_layer))
    weights = random_draft_weights(shape, target.n_vocab, seed=4, scale=0.2)
    return write_draft(str(tiny_dir / "attentive.gguf"), shape, weights, tokenizer_from=tiny_target, mask_token_id=3)


def test_short_proposals_are_the_full_blocks_prefix(tiny_config, attentive_draft):
    """Asking for fewer tokens cuts the full block's proposal, as llama.cpp does; it does not decode
    a shorter block (whose non-causal attention would propose other tokens)."""
    from llama_dflash.generate import prefill

    with LlamaDFlashDecoding(tiny_config, SpecConfig(attentive_draft, draft_n_max=6)) as eng:
        p = eng._dflash
        prompt = eng.tokenize(PROMPT_TEXT)
        prefill(eng.target, prompt[:-1], p.inject)
        n_past = len(prompt) - 1
        for anchor in prompt[-6:]:
            full = p.propose(anchor, n_past, 6)
            assert len(full) == 6
            for n in range(1, 6):
                assert p.propose(anchor, n_past, n) == full[:n]
            assert p.pos_max() == n_past - 1
        # the fixture is one where the block length matters: a 3-row block proposes other tokens
        differs = False
        for anchor in prompt[-6:]:
            shorter = p._draft_block(anchor, n_past, 3)
            p.ctx.seq_rm(0, n_past, -1)
            differs |= shorter != p.propose(anchor, n_past, 2)
        assert differs


def test_fixed_n_max_always_decodes_n_max_plus_one(tiny_config, tiny_draft, monkeypatch):
    with OrdinaryDecoding(tiny_config) as o:
        prompt = o.tokenize(PROMPT_TEXT)
        ref = o.generate(prompt, 23, ignore_eos=True).tokens
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=4)) as eng:
        blocks = _block_spy(eng._dflash, monkeypatch)
        res = eng.generate(prompt, 23, ignore_eos=True)  # max_tokens cuts the last drafts short
    assert res.tokens == ref
    assert blocks and set(blocks) == {5}


def test_auto_decodes_the_trained_block(tiny_config, tiny_draft, monkeypatch):
    """Under "auto" the controller chooses how many tokens to verify; the block is the draft's own."""
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max="auto")) as eng:
        eng.controller.costs = GPU  # drafting pays: short and long k both get chosen
        blocks = _block_spy(eng._dflash, monkeypatch)
        prompt = eng.tokenize(PROMPT_TEXT)
        res = eng.generate(prompt, 60, ignore_eos=True)
    assert len(res.stats.chosen_draft_tokens) > 1
    assert blocks and set(blocks) == {eng.draft_info.block_size}


def test_block_shortened_only_where_the_context_ends(tiny_target, tiny_draft, monkeypatch):
    from llama_dflash import TargetConfig

    cfg = TargetConfig(tiny_target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    with OrdinaryDecoding(cfg) as o:
        prompt = o.tokenize(PROMPT_TEXT)
        ref = o.generate(prompt, 400, ignore_eos=True).tokens
    with LlamaDFlashDecoding(cfg, SpecConfig(tiny_draft, draft_n_max=6)) as eng:
        n_ctx = eng.target.n_ctx
        blocks = []
        real = type(eng._dflash)._draft_block

        def spy(self, id_last, n_past, n_block):
            blocks.append((n_past, n_block))
            return real(self, id_last, n_past, n_block)

        monkeypatch.setattr(type(eng._dflash), "_draft_block", spy)
        res = eng.generate(prompt, 400, ignore_eos=True)
    assert res.tokens == ref[: len(res.tokens)] and res.finish_reason == "length"
    assert all(n_block == min(7, n_ctx - n_past) for n_past, n_block in blocks), blocks[-8:]
    assert any(n_block < 7 for _, n_block in blocks)


def test_proposals_are_each_rows_argmax(tiny_config, attentive_draft):
    """Slot i's token is the argmax of block row i (all rows decoded with outputs).  Guards the
    anchor's output flag: llama.cpp's dflash graph copies the first n_outputs head rows, so a
    block without the anchor's output reads every slot one row early (issue 17 item 3)."""
    import numpy as np

    from llama_dflash.generate import prefill

    with LlamaDFlashDecoding(tiny_config, SpecConfig(attentive_draft, draft_n_max=6, backend_sampling=False)) as eng:
        p = eng._dflash
        prompt = eng.tokenize(PROMPT_TEXT)
        prefill(eng.target, prompt[:-1], p.inject)
        n_past = len(prompt) - 1
        for anchor in prompt[-4:]:
            p.flush()
            p.batch.set_block(anchor, p.mask, 7, n_past)
            assert p.batch.decode(p.ctx.ptr) == 0
            expect = [int(np.argmax(p._logits(i))) for i in range(1, 7)]
            p.ctx.seq_rm(0, n_past, -1)
            assert p.propose(anchor, n_past, 6) == expect


@pytest.mark.slow
def test_trained_smollm2_draft_short_proposals_are_prefixes():
    """The same on the real pair: under "auto" a k-token proposal is the trained block's first k."""
    from llama_dflash import TargetConfig
    from llama_dflash.bench.cli import chat_wrap
    from llama_dflash.defaults import smollm2_path, trained_draft_path
    from llama_dflash.generate import prefill

    draft = trained_draft_path()
    if draft is None:
        pytest.skip("the shipped trained draft is absent")
    path = smollm2_path()
    cfg = TargetConfig(path, n_ctx=512, n_batch=128, n_ubatch=128, n_threads=2)
    with LlamaDFlashDecoding(cfg, SpecConfig(draft, draft_n_max="auto")) as eng:
        p = eng._dflash
        prompt = eng.tokenize(chat_wrap(path, "List five prime numbers."))
        prefill(eng.target, prompt[:-1], p.inject)
        n_past = len(prompt) - 1
        full = p.propose(prompt[-1], n_past, p.n_max)
        assert len(full) == eng.draft_info.max_draft_tokens
        for k in range(1, p.n_max):
            assert p.propose(prompt[-1], n_past, k) == full[:k]
