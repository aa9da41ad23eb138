"""Temperature > 0 is lossless: speculative and ordinary sampling give the same distribution.

With a scripted draft that proposes the greedy continuation (so drafts are often accepted and
often rejected), N generations of 3 tokens at temperature 1, top_k 2 are drawn from each loop with
distinct seeds.  The joint outcome (t1, t2, t3) has at most 8 values; a chi-square test of
homogeneity on the 2 x K table at significance 0.001 fails a correct implementation with
probability 0.1% (the false-failure rate).  A loop that, e.g., emitted the draft token whenever it
was in the top 2 would shift the mass far beyond that threshold at this N.
"""

from __future__ import annotations

from collections import Counter

from llama_dflash import SpecConfig
from llama_dflash.config import TargetConfig
from llama_dflash.engine import LlamaDFlashDecoding, OrdinaryDecoding
from llama_dflash.proposers import ScriptedProposer
from llama_dflash.sampling import SamplingParams

# chi-square critical values at p = 0.001 for df = 1..7
CHI2_CRIT_0001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322}
N = 500
N_TOK = 3


def chi_square_homogeneity(a: Counter, b: Counter) -> tuple[float, int]:
    keys = sorted(set(a) | set(b))
    na, nb = sum(a.values()), sum(b.values())
    stat = 0.0
    for k in keys:
        tot = a[k] + b[k]
        for obs, n in ((a[k], na), (b[k], nb)):
            exp = tot * n / (na + nb)
            stat += (obs - exp) ** 2 / exp
    return stat, len(keys) - 1


def test_speculative_sampling_distribution_matches_ordinary(tiny_target, tiny_draft):
    cfg = TargetConfig(tiny_target, n_ctx=64, n_batch=32, n_ubatch=32, n_threads=1)
    prompt_text = "the quick brown fox"
    with OrdinaryDecoding(cfg) as ordinary, LlamaDFlashDecoding(cfg, SpecConfig(tiny_draft, draft_n_max=3)) as spec:
        prompt = ordinary.tokenize(prompt_text)
        greedy = ordinary.generate(prompt, N_TOK + 3).tokens
        base = len(prompt) - 1  # position of the last prompt token

        def script(n_past: int, n: int) -> list[int]:
            i = n_past - base  # tokens emitted before this block
            return greedy[i : i + n]

        spec.use_proposer(ScriptedProposer(spec._dflash, script))
        outcomes = {"ordinary": Counter(), "speculative": Counter()}
        accepted = 0
        for seed in range(N):
            params = SamplingParams(temperature=1.0, top_k=2, seed=seed)
            outcomes["ordinary"][tuple(ordinary.generate(prompt, N_TOK, params, ignore_eos=True).tokens)] += 1
            params = SamplingParams(temperature=1.0, top_k=2, seed=10_000 + seed)
            r = spec.generate(prompt, N_TOK, params, ignore_eos=True)
            outcomes["speculative"][tuple(r.tokens)] += 1
            accepted += r.stats.accepted
    assert accepted > N // 4, "the scripted draft should be accepted often enough to matter"
    stat, df = chi_square_homogeneity(outcomes["ordinary"], outcomes["speculative"])
    assert 1 <= df <= 7
    assert stat < CHI2_CRIT_0001[df], (stat, df, outcomes)
