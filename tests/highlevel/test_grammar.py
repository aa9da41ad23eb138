"""Grammar-constrained completions through llama_dflash.Llama equal llama_cpp.Llama's."""

from __future__ import annotations

import llama_cpp
import pytest

from hl_fixtures import ordinary, spec  # noqa: F401 (fixtures)

KW = dict(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
# words of the tiny vocabulary, so the grammar has tokens to choose from
GBNF = r'''root ::= word (" " word)*
word ::= "the" | "a" | "dog" | "fox" | "is" | "and"'''


@pytest.fixture(scope="module")
def plain(tiny_target):
    llm = llama_cpp.Llama(tiny_target, verbose=False, **KW)
    yield llm
    llm.close()


@pytest.mark.parametrize("prompt", ["the quick brown fox", "a b c d"])
def test_grammar_completion_identical_to_llama_cpp(plain, spec, ordinary, prompt):
    grammar = llama_cpp.LlamaGrammar.from_string(GBNF, verbose=False)
    ref = plain.create_completion(prompt, max_tokens=16, temperature=0, grammar=grammar)
    text = ref["choices"][0]["text"]
    words = text.strip().split(" ")
    assert words and all(w in {"the", "a", "dog", "fox", "is", "and"} for w in words), text
    for llm in (spec, ordinary):
        out = llm.create_completion(prompt, max_tokens=16, temperature=0,
                                    grammar=llama_cpp.LlamaGrammar.from_string(GBNF, verbose=False))
        assert out["choices"][0]["text"] == text
    # and without the grammar the same object answers freely again
    free = plain.create_completion(prompt, max_tokens=16, temperature=0)
    assert spec.create_completion(prompt, max_tokens=16, temperature=0)["choices"][0]["text"] == free["choices"][0]["text"]


def test_grammar_at_temperature_stays_in_language(spec):
    for seed in range(3):
        out = spec.create_completion("the", max_tokens=12, temperature=1.0, seed=seed,
                                     grammar=llama_cpp.LlamaGrammar.from_string(GBNF, verbose=False))
        words = out["choices"][0]["text"].strip().split(" ")
        assert all(w in {"the", "a", "dog", "fox", "is", "and"} for w in words if w), out["choices"][0]["text"]


def test_grammar_that_would_overflow_the_parser_is_refused(spec):
    """60,000 nested parentheses overflow llama.cpp's recursive GBNF parser (a segfault)."""
    text = "root ::= " + "(" * 60000 + '"a"' + ")" * 60000
    grammar = llama_cpp.LlamaGrammar(_grammar=text)  # what from_string keeps, without parsing it
    with pytest.raises(ValueError):
        spec.create_completion("the", max_tokens=4, grammar=grammar)
