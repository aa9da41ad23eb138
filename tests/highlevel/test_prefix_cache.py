"""llama_dflash.Llama reuses the cached prompt prefix across calls, like llama_cpp.Llama."""

from __future__ import annotations

import llama_cpp

from llama_dflash import SpecConfig
from llama_dflash.highlevel import Llama

KW = dict(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)


def test_follow_up_reuses_prefix_and_matches_llama_cpp(tiny_target, tiny_draft):
    plain = llama_cpp.Llama(tiny_target, verbose=False, **KW)
    spec = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=4), **KW)
    try:
        first = "the quick brown fox and the lazy dog is"
        a = spec.create_completion(first, max_tokens=12, temperature=0)
        assert a["choices"][0]["text"] == plain.create_completion(first, max_tokens=12, temperature=0)["choices"][0]["text"]
        follow = first + a["choices"][0]["text"] + " and then"
        b = spec.create_completion(follow, max_tokens=12, temperature=0)
        ref = plain.create_completion(follow, max_tokens=12, temperature=0)
        assert b["choices"][0]["text"] == ref["choices"][0]["text"]
        n_first = len(spec.tokenize(first.encode()))
        assert spec.last_stats.reused_prompt_tokens >= n_first  # the first prompt was not decoded again
        other = "a b c d"
        c = spec.create_completion(other, max_tokens=12, temperature=0)
        assert c["choices"][0]["text"] == plain.create_completion(other, max_tokens=12, temperature=0)["choices"][0]["text"]
        assert spec.last_stats.reused_prompt_tokens <= 1  # only a BOS can be shared
    finally:
        spec.close()
        plain.close()
