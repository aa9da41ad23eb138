"""Prefix reuse across generations: the caches keep the common prefix, both stay aligned, and
the output is exactly what a fresh generation gives."""

from __future__ import annotations

import pytest

from conftest import PROMPT_TEXT
from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, TargetConfig
from llama_dflash.writer import write_random_draft, write_tiny_target


def _fresh(config, prompt, n):
    with OrdinaryDecoding(config) as o:
        return o.generate(prompt, n, ignore_eos=True).tokens


@pytest.fixture(scope="module")
def lfm2_pair(tiny_dir):
    t = write_tiny_target(str(tiny_dir / "reuse_lfm2.gguf"), arch="lfm2", seed=21)
    return t, write_random_draft(str(tiny_dir / "reuse_lfm2_draft.gguf"), t, block_size=8, seed=22)


def _conversation(eng, config, reuse: bool):
    """A chat-like sequence: each prompt extends the previous prompt and its answer; then an
    unrelated prompt; then one sharing only a part of the first."""
    p1 = eng.tokenize(PROMPT_TEXT)
    out = []
    r1 = eng.generate(p1, 12, ignore_eos=True, reuse_prefix=reuse)
    out.append((p1, r1))
    p2 = p1 + r1.tokens + eng.tokenize(" and then")[1:]
    r2 = eng.generate(p2, 12, ignore_eos=True, reuse_prefix=reuse)
    out.append((p2, r2))
    p3 = p1[:4] + eng.tokenize(" a lazy brown dog")[1:]
    r3 = eng.generate(p3, 12, ignore_eos=True, reuse_prefix=reuse)
    out.append((p3, r3))
    r4 = eng.generate(p3, 12, ignore_eos=True, reuse_prefix=reuse)  # the same prompt again
    out.append((p3, r4))
    for prompt, res in out:
        assert res.tokens == _fresh(config, prompt, 12)
    return out


@pytest.mark.parametrize("kind", ["ordinary", "dflash"])
def test_reuse_on_attention_target(tiny_config, tiny_draft, kind):
    eng = OrdinaryDecoding(tiny_config) if kind == "ordinary" else \
        LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=4))
    with eng:
        out = _conversation(eng, tiny_config, reuse=True)
        reused = [res.stats.reused_prompt_tokens for _, res in out]
        (p1, r1), (p2, _), (p3, _), _ = out
        # the second prompt extends the first and its answer: all of the cache is kept
        assert reused[1] == len(p1) + len(r1.tokens) - 1
        assert reused[2] == 4  # only the shared head of the third
        assert reused[3] == len(p3) - 1  # everything but the last prompt token
        if kind == "dflash":
            assert eng.target.pos_max() == eng._dflash.pos_max()
        off = _conversation(eng, tiny_config, reuse=False)
        assert all(res.stats.reused_prompt_tokens == 0 for _, res in off)


@pytest.mark.parametrize("mode", ["native", "checkpoint"])
def test_reuse_on_hybrid_target_only_extends(lfm2_pair, mode):
    target, draft = lfm2_pair
    config = TargetConfig(target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    with LlamaDFlashDecoding(config, SpecConfig(draft, draft_n_max=4, rollback=mode)) as eng:
        out = _conversation(eng, config, reuse=True)
        reused = [res.stats.reused_prompt_tokens for _, res in out]
        (p1, r1), _, (p3, _), _ = out
        # a recurrent state cannot be cut: only exact extensions of the cache are reused
        assert reused[1] == len(p1) + len(r1.tokens) - 1
        assert reused[2] == 0
        assert reused[3] == 0  # the cache holds p3 plus its answer, not a prefix of p3


def test_stream_closed_early_then_reuse(tiny_config, tiny_draft):
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=4)) as eng:
        p = eng.tokenize(PROMPT_TEXT)
        stream = eng.stream(p, 30, ignore_eos=True, reuse_prefix=True)
        got = [next(stream) for _ in range(5)]
        stream.close()
        p2 = p + got
        res = eng.generate(p2, 10, ignore_eos=True, reuse_prefix=True)
        assert res.stats.reused_prompt_tokens == len(p2) - 1
        assert res.tokens == _fresh(tiny_config, p2, 10)


def test_failed_generation_forgets_the_cache(tiny_config, tiny_draft):
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=4)) as eng:
        p = eng.tokenize(PROMPT_TEXT)
        eng.generate(p, 5, ignore_eos=True, reuse_prefix=True)
        with pytest.raises(ValueError):
            eng.generate(p + [999999], 5, reuse_prefix=True)  # a token id outside the vocabulary
        res = eng.generate(p, 5, ignore_eos=True, reuse_prefix=True)
        assert res.stats.reused_prompt_tokens == 0
