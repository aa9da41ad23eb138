"""Speculative output equals ordinary output; caches stay aligned through every accept/rollback.

`tiny_config` offloads every layer where the build can (TargetConfig's n_gpu_layers -1), so the
comparisons go through `assert_same_tokens`: exact on the CPU, on a GPU exact where batch and
single rows agree, else a divergence only at a near-tie (tests/_equivalence.py).  The `gpu`-marked
tests are the paths that differ there (offload, close, interpreter shutdown).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import pytest

from _equivalence import assert_same_tokens
from conftest import PROMPT_TEXT
from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, TargetConfig
from llama_dflash.generate import GenerationState
from llama_dflash.writer import write_random_draft
from llama_dflash.proposers import ScriptedProposer

N_TOKENS = 48


@pytest.fixture()
def reference(tiny_config):
    with OrdinaryDecoding(tiny_config) as o:
        prompt = o.tokenize(PROMPT_TEXT)
        res = o.generate(prompt, N_TOKENS, ignore_eos=True)
    assert len(res.tokens) == N_TOKENS
    return prompt, res.tokens


@pytest.mark.gpu
@pytest.mark.parametrize("draft_fixture", ["tiny_draft", "tiny_draft_own_embd"])
@pytest.mark.parametrize("n_draft", range(1, 9))
def test_greedy_output_matches_ordinary(request, tiny_config, reference, draft_fixture, n_draft):
    prompt, ref = reference
    draft = request.getfixturevalue(draft_fixture)
    with LlamaDFlashDecoding(tiny_config, SpecConfig(draft, draft_n_max=n_draft)) as eng:
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
        assert_same_tokens(res.tokens, ref, prompt=prompt, config=tiny_config)
        assert res.finish_reason == "length"
        s = res.stats
        assert s.generated_tokens == N_TOKENS
        assert s.verification_steps >= 1 and s.drafted == s.verified
        assert len(s.proposed_per_position) == n_draft
        assert eng.target.pos_max() == eng._dflash.pos_max()


def _script_from_reference(prompt, ref, corrupt_at):
    """Proposes the ordinary continuation, corrupted at block slot corrupt_at(step)."""
    seq = list(prompt) + list(ref)
    step = {"i": 0}

    def script(n_past, n):
        block = seq[n_past + 1 : n_past + 1 + n]
        k = corrupt_at(step["i"], len(block))
        step["i"] += 1
        if k < len(block):
            block = list(block)
            block[k] = (block[k] + 7) % 300 + 1
        return block

    return script


@pytest.mark.gpu
def test_every_accepted_length_keeps_output_and_caches(tiny_config, tiny_draft, reference):
    prompt, ref = reference
    n_max = 5
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=n_max)) as eng:
        # cycle the corrupted slot through 0..n_max (n_max = nothing corrupted = all accepted)
        eng.use_proposer(ScriptedProposer(eng._dflash, _script_from_reference(prompt, ref, lambda i, n: i % (n_max + 1))))
        state = GenerationState()
        accepted_lengths = []
        last_accepted = 0
        out = []
        for tok in eng.stream(prompt, N_TOKENS, ignore_eos=True, state=state):
            out.append(tok)
            # at every yield both caches hold exactly positions 0..n_past-1
            assert eng.target.pos_max() == state.n_past - 1
            assert eng._dflash.pos_max() == state.n_past - 1
            if eng.last_stats.accepted != last_accepted or not accepted_lengths:
                accepted_lengths.append(eng.last_stats.accepted - last_accepted)
                last_accepted = eng.last_stats.accepted
        s = eng.last_stats
        assert_same_tokens(out, ref, prompt=prompt, config=tiny_config)
        # every slot 0..n_max-1 got accepted at least once, and rollbacks happened
        assert all(a > 0 for a in s.accepted_per_position)
        assert s.rollbacks > 0 and s.accepted > 0
        assert s.accepted < s.verified


def test_all_accepted_lengths_seen(tiny_config, tiny_draft, reference):
    prompt, ref = reference
    n_max = 4
    seen = set()

    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=n_max)) as eng:
        eng.use_proposer(ScriptedProposer(eng._dflash, _script_from_reference(prompt, ref, lambda i, n: i % (n_max + 1))))

        class Ctl:
            def choose(self, n_limit):
                return n_limit

            def observe(self, n_draft, n_accepted, *_):
                if n_draft == n_max:
                    seen.add(n_accepted)

        res = eng.generate(prompt, N_TOKENS, ignore_eos=True, controller=Ctl())
        assert_same_tokens(res.tokens, ref, prompt=prompt, config=tiny_config)
        assert seen == set(range(n_max + 1))


def test_repeated_runs_identical(tiny_config, tiny_draft, reference):
    prompt, ref = reference
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=6)) as eng:
        outs = [eng.generate(prompt, N_TOKENS, ignore_eos=True).tokens for _ in range(3)]
    assert outs[1] == outs[0] and outs[2] == outs[0]  # the same batches every run: identical on any device
    assert_same_tokens(outs[0], ref, prompt=prompt, config=tiny_config)


def test_p_min_one_drafts_nothing(tiny_config, tiny_draft, reference):
    prompt, ref = reference
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=4, draft_p_min=1.0)) as eng:
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
    assert res.tokens == ref  # nothing drafted: one-row decodes as ordinary decoding, exact anywhere
    assert res.stats.drafted == 0 and res.stats.verified == 0
    assert res.stats.verification_steps == N_TOKENS


def test_n_min_discards_short_drafts(tiny_config, tiny_draft, reference):
    prompt, ref = reference
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=3, draft_n_min=3)) as eng:
        res = eng.generate(prompt, 10, ignore_eos=True)
    assert_same_tokens(res.tokens, ref[:10], prompt=prompt, config=tiny_config)
    # a draft is either all 3 tokens or none
    assert res.stats.drafted % 3 == 0


def test_draft_n_max_is_clamped_with_warning(tiny_config, tiny_draft):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=40)) as eng:
            assert eng.draft_n_max == 15  # block 16, DFlash layout yields block-1
    assert any("clamped to 15" in str(w.message) for w in caught)


@pytest.fixture(scope="module")
def tiny_draft_block4(tiny_dir, tiny_target):
    return write_random_draft(str(tiny_dir / "draft_block4.gguf"), tiny_target, block_size=4, seed=5)


def test_default_draft_n_max_is_clamped_silently(tiny_config, tiny_draft_block4):
    """SpecConfig(draft) with the default draft_n_max (7) over a block that yields 3: the block's
    limit, no warning (the user asked for nothing); an explicit 7 still warns."""
    assert SpecConfig(tiny_draft_block4).draft_n_max == 7
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft_block4)) as eng:
            assert eng.draft_n_max == 3
    assert not [w for w in caught if "clamped" in str(w.message)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft_block4, draft_n_max=7)) as eng:
            assert eng.draft_n_max == 3
    assert any("clamped to 3" in str(w.message) for w in caught)


def test_context_exhaustion_finishes_with_length(tiny_target, tiny_draft):
    cfg = TargetConfig(tiny_target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    with OrdinaryDecoding(cfg) as o:
        prompt = o.tokenize(PROMPT_TEXT)
        ref = o.generate(prompt, 400, ignore_eos=True)
    with LlamaDFlashDecoding(cfg, SpecConfig(tiny_draft, draft_n_max=7)) as eng:
        n_ctx = eng.target.n_ctx
        res = eng.generate(prompt, 400, ignore_eos=True)
    assert res.finish_reason == "length" and ref.finish_reason == "length"
    assert len(prompt) + len(res.tokens) == n_ctx + 1  # the last token sampled needs no cache cell
    assert_same_tokens(res.tokens, ref.tokens, prompt=prompt, config=cfg)


def test_prompt_longer_than_context_is_clear_error(tiny_target, tiny_draft):
    cfg = TargetConfig(tiny_target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    with LlamaDFlashDecoding(cfg, SpecConfig(tiny_draft)) as eng:
        with pytest.raises(ValueError, match="more than the context size"):
            eng.generate([5 + i % 200 for i in range(eng.target.n_ctx + 1)], 4)
        with pytest.raises(ValueError, match="at least one token"):
            eng.generate([], 4)


def test_stream_closed_early_then_next_request_correct(tiny_config, tiny_draft, reference):
    prompt, ref = reference
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=4)) as eng:
        state = GenerationState()
        gen = eng.stream(prompt, N_TOKENS, ignore_eos=True, state=state)
        first = [next(gen) for _ in range(5)]
        gen.close()
        assert_same_tokens(first, ref[:5], prompt=prompt, config=tiny_config)
        assert eng.target.pos_max() == len(prompt) - 1 + 5 - 1
        assert eng._dflash.pos_max() == eng.target.pos_max()
        assert_same_tokens(eng.generate(prompt, N_TOKENS, ignore_eos=True).tokens, ref, prompt=prompt,
                           config=tiny_config)


@pytest.mark.gpu
def test_close_twice_and_use_after_close(tiny_config, tiny_draft):
    eng = LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft))
    eng.close()
    eng.close()
    assert eng.closed
    with pytest.raises(RuntimeError, match="closed"):
        eng.generate([1, 2, 3], 2)


def test_stops_on_eog_unless_ignored(tiny_config, tiny_draft, reference):
    """ignore_eos masks end-of-generation tokens (llama.cpp's meaning): the masked run equals
    the plain run up to where the plain run samples an EOG and stops."""
    prompt, ref = reference
    with OrdinaryDecoding(tiny_config) as o:
        eog = set(o.target.model.eog_tokens())
        long = o.generate(prompt, 200, ignore_eos=True).tokens
        plain = o.generate(prompt, 200)
    assert len(long) == 200 and not eog & set(long)
    stopped = plain.tokens
    assert long[: len(stopped)] == stopped
    assert plain.finish_reason == ("stop" if len(stopped) < 200 else "length")
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=3)) as eng:
        assert_same_tokens(eng.generate(prompt, 200).tokens, stopped, prompt=prompt, config=tiny_config,
                           ignore_eos=False)
        assert_same_tokens(eng.generate(prompt, 200, ignore_eos=True).tokens, long, prompt=prompt,
                           config=tiny_config)


@pytest.mark.gpu
@pytest.mark.parametrize("close", [True, False])
def test_interpreter_exit_without_close(tiny_target, tiny_draft, close):
    code = textwrap.dedent(f"""
        from llama_dflash import LlamaDFlashDecoding, SpecConfig, TargetConfig
        eng = LlamaDFlashDecoding(TargetConfig({tiny_target!r}, n_ctx=128, n_batch=32, n_ubatch=32),
                                  SpecConfig({tiny_draft!r}, draft_n_max=3))
        toks = eng.generate(eng.tokenize("the and"), 8, ignore_eos=True).tokens
        assert len(toks) == 8
        gen = eng.stream(eng.tokenize("the and"), 8)
        next(gen)  # a suspended generator left for the interpreter's shutdown
        if {close}:
            eng.close()
        print("done")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout
