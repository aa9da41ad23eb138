"""Shared bits of the DSpark / d2t / backend-sampling tests."""

from __future__ import annotations

from _equivalence import assert_same_tokens
from conftest import PROMPT_TEXT
from llama_dflash import OrdinaryDecoding
from llama_dflash.proposers import ScriptedProposer

N_TOKENS = 40


def ordinary_reference(config, n_tokens: int = N_TOKENS):
    with OrdinaryDecoding(config) as o:
        prompt = o.tokenize(PROMPT_TEXT)
        res = o.generate(prompt, n_tokens, ignore_eos=True)
    assert len(res.tokens) == n_tokens
    return prompt, res.tokens


def script_from_reference(prompt, ref, corrupt_at):
    """Proposes the ordinary continuation, corrupted at block slot corrupt_at(step, n)."""
    seq = list(prompt) + list(ref)
    step = {"i": 0}

    def script(n_past, n):
        block = list(seq[n_past + 1 : n_past + 1 + n])
        k = corrupt_at(step["i"], len(block))
        step["i"] += 1
        if k < len(block):
            block[k] = (block[k] + 7) % 300 + 1
        return block

    return script


class Recorder(ScriptedProposer):
    """Passes the real draft's tokens through, recording every block."""

    def __init__(self, inner):
        super().__init__(inner, lambda n_past, n: [])
        self.blocks: list[list[int]] = []

    def propose(self, id_last, n_past, n, *, shadow=False, history=()):
        toks = self.inner.propose(id_last, n_past, n, shadow=shadow, history=history)
        self.blocks.append(list(toks))
        return toks


def check_every_accepted_length(eng, prompt, ref, n_max):
    """Drive accepted lengths 0..n_max with a scripted proposer; output and caches stay right."""
    seen = set()

    class Ctl:
        def choose(self, n_limit):
            return n_limit

        def observe(self, n_draft, n_accepted, *_):
            if n_draft == n_max:
                seen.add(n_accepted)

    eng.use_proposer(ScriptedProposer(eng._dflash, script_from_reference(prompt, ref, lambda i, n: i % (n_max + 1))))
    try:
        res = eng.generate(prompt, len(ref), ignore_eos=True, controller=Ctl())
    finally:
        eng.use_proposer(eng._dflash)
    # exact on the CPU; on a GPU only a near-tie divergence (tests/_equivalence.py)
    assert_same_tokens(res.tokens, ref, prompt=prompt, config=eng.target.config)
    assert seen == set(range(n_max + 1))
    assert eng.target.pos_max() == eng._dflash.pos_max()
    return res
