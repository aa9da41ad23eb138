"""End-of-generation tokens: `ignore_eos` masks them out of sampling (llama.cpp's --ignore-eos),
and an EOG sampled inside a verified block ends the step (nothing after it is accepted)."""

from __future__ import annotations

from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig
from llama_dflash.proposers import ScriptedProposer
from llama_dflash.sampling import SamplingParams

EOG_PROMPT = "hello world of the"  # the tiny fixture answers one token, then an end-of-generation token


def test_ignore_eos_masks_eog_tokens(tiny_config, tiny_draft):
    with OrdinaryDecoding(tiny_config) as o:
        prompt = o.tokenize(EOG_PROMPT)
        eog = set(o.target.model.eog_tokens())
        assert eog
        plain = o.generate(prompt, 8)
        # this prompt's greedy continuation is an end-of-generation token after one token
        assert len(plain.tokens) == 1 and plain.finish_reason == "stop"
        masked = o.generate(prompt, 40, ignore_eos=True)
        assert len(masked.tokens) == 40 and not eog & set(masked.tokens)
        hot = o.generate(prompt, 40, SamplingParams(temperature=1.5, seed=3), ignore_eos=True)
        assert len(hot.tokens) == 40 and not eog & set(hot.tokens)
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=4)) as eng:
        assert eng.generate(prompt, 40, ignore_eos=True).tokens == masked.tokens
        assert eng.generate(prompt, 40, SamplingParams(temperature=1.5, seed=3), ignore_eos=True).tokens == hot.tokens


def test_eog_inside_a_verified_block_ends_the_step(tiny_config, tiny_draft):
    with OrdinaryDecoding(tiny_config) as o:
        prompt = o.tokenize(EOG_PROMPT)
        word = o.generate(prompt, 1).tokens  # greedy: one token, then an EOG ...
        o.target.clear()
        o.target.decode(prompt + word, 0, logits="last")
        eog = int(o.target.logits_row(len(prompt) + len(word) - 1).argmax())  # ... this one
        assert o.target.model.is_eog(eog)
        # what the target would say after that EOG, so a naive verifier would accept it too
        o.target.decode([eog], len(prompt) + len(word), logits="last")
        after = [int(o.target.logits_row(0).argmax())]
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=4)) as eng:
        def script(n_past, n):
            return [*word, eog, *after][:n]

        eng.use_proposer(ScriptedProposer(eng._dflash, script))
        res = eng.generate(prompt, 8)
        assert res.tokens == word and res.finish_reason == "stop"
        stats = eng.last_stats
        assert stats.verification_steps == 1
        # llama.cpp's count: the EOG ends the step like a rejection (accepted = samples - 1)
        assert stats.accepted == 1, "draft tokens after an end-of-generation token were accepted"
