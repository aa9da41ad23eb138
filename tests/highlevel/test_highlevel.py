"""llama_dflash.highlevel.Llama behaves like llama_cpp.Llama (tiny fixtures, CPU)."""

from __future__ import annotations

import llama_cpp
import pytest

from llama_dflash import SpecConfig
from llama_dflash.highlevel import Llama
from hl_fixtures import ordinary, spec  # noqa: F401 (fixtures)

PROMPTS = ["the quick brown fox and the lazy dog is", "a b c d", "hello world of the"]
KW = dict(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)


@pytest.fixture(scope="module")
def plain(tiny_target):
    llm = llama_cpp.Llama(tiny_target, verbose=False, **KW)
    yield llm
    llm.close()


def _text(r):
    return r["choices"][0]["text"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_completion_identical_to_llama_cpp(plain, spec, ordinary, prompt):
    ref = plain.create_completion(prompt, max_tokens=40, temperature=0)
    for llm in (spec, ordinary):
        out = llm.create_completion(prompt, max_tokens=40, temperature=0)
        assert _text(out) == _text(ref)
        assert out["choices"][0]["finish_reason"] == ref["choices"][0]["finish_reason"]
        assert out["usage"] == ref["usage"]
    assert out["speculative"]["generated_tokens"] >= 1


def test_greedy_chat_identical_to_llama_cpp(plain, spec):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    ref = plain.create_chat_completion(messages, max_tokens=30, temperature=0)
    out = spec.create_chat_completion(messages, max_tokens=30, temperature=0)
    assert out["choices"][0]["message"] == ref["choices"][0]["message"]
    assert out["choices"][0]["finish_reason"] == ref["choices"][0]["finish_reason"]
    assert out["speculative"]["algorithm"] == "dflash"


def test_streaming_identical(plain, spec):
    ref = _text(plain.create_completion(PROMPTS[0], max_tokens=30, temperature=0))
    chunks = list(spec.create_completion(PROMPTS[0], max_tokens=30, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == ref
    assert chunks[-1]["choices"][0]["finish_reason"] is not None
    assert chunks[-1]["speculative"]["generated_tokens"] >= 1
    messages = [{"role": "user", "content": "hi"}]
    ref_chat = plain.create_chat_completion(messages, max_tokens=20, temperature=0)["choices"][0]["message"]["content"]
    deltas = list(spec.create_chat_completion(messages, max_tokens=20, temperature=0, stream=True))
    assert "".join(d["choices"][0]["delta"].get("content", "") for d in deltas) == ref_chat


def test_stop_sequences_and_max_tokens(plain, spec):
    texts = {p: _text(plain.create_completion(p, max_tokens=40, temperature=0)) for p in PROMPTS}
    prompt = max(PROMPTS, key=lambda p: len(texts[p]))
    full = texts[prompt]
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert len(stop) == 2 and full.index(stop) > 0
    ref = plain.create_completion(prompt, max_tokens=40, temperature=0, stop=[stop])
    out = spec.create_completion(prompt, max_tokens=40, temperature=0, stop=[stop])
    assert _text(out) == _text(ref) and stop not in _text(out)
    assert out["choices"][0]["finish_reason"] == "stop"
    streamed = "".join(c["choices"][0]["text"] for c in
                       spec.create_completion(prompt, max_tokens=40, temperature=0, stop=[stop], stream=True))
    assert streamed == _text(ref)
    for n in (1, 5):
        ref = plain.create_completion(PROMPTS[1], max_tokens=n, temperature=0)
        out = spec.create_completion(PROMPTS[1], max_tokens=n, temperature=0)
        # llama_cpp may take a few tokens more to complete a UTF-8 character; same count both ways
        assert out["usage"]["completion_tokens"] == ref["usage"]["completion_tokens"]
        assert n <= out["usage"]["completion_tokens"] <= n + 3
        assert _text(out) == _text(ref)
        assert out["choices"][0]["finish_reason"] == "length"


def test_penalties_match_llama_cpp(plain, spec):
    kw = dict(max_tokens=40, temperature=0, repeat_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2)
    texts = {p: _text(plain.create_completion(p, max_tokens=40, temperature=0)) for p in PROMPTS}
    prompt = max(PROMPTS, key=lambda p: len(texts[p]))
    ref = plain.create_completion(prompt, **kw)
    assert _text(ref) != texts[prompt]
    assert _text(spec.create_completion(prompt, **kw)) == _text(ref)


def test_seed_reproducible_and_same_as_ordinary(spec, ordinary):
    kw = dict(max_tokens=30, temperature=0.9, top_k=5, top_p=0.95, min_p=0.0)
    a = _text(spec.create_completion(PROMPTS[0], seed=123, **kw))
    b = _text(spec.create_completion(PROMPTS[0], seed=123, **kw))
    c = _text(ordinary.create_completion(PROMPTS[0], seed=123, **kw))
    d = _text(spec.create_completion(PROMPTS[0], seed=124, **kw))
    assert a == b == c  # one random draw per emitted token in both loops
    assert a != d


def test_closed_stream_then_correct_request(plain, spec):
    ref = _text(plain.create_completion(PROMPTS[2], max_tokens=30, temperature=0))
    stream = spec.create_completion(PROMPTS[0], max_tokens=30, temperature=0, stream=True)
    next(stream), next(stream)
    stream.close()
    assert _text(spec.create_completion(PROMPTS[2], max_tokens=30, temperature=0)) == ref
    # abandoned without close: the next request closes it first; closing it later is harmless
    abandoned = spec.create_completion(PROMPTS[1], max_tokens=30, temperature=0, stream=True)
    next(abandoned), next(abandoned)
    assert _text(spec.create_completion(PROMPTS[2], max_tokens=30, temperature=0)) == ref
    abandoned.close()
    assert _text(spec.create_completion(PROMPTS[2], max_tokens=30, temperature=0)) == ref
    g = spec.generate(spec.tokenize(PROMPTS[0].encode()), temp=0)
    next(g)
    del g
    assert _text(spec.create_completion(PROMPTS[2], max_tokens=30, temperature=0)) == ref


def test_mirostat_and_typical_like_llama_cpp(plain, spec):
    """Samplers we used to refuse or ignore run through the reference's own chain now."""
    for kw in (dict(mirostat_mode=2, temperature=0.8, seed=3), dict(mirostat_mode=1, temperature=0.8, seed=4),
               dict(typical_p=0.5, temperature=0.9, seed=5)):
        ref = plain.create_completion(PROMPTS[0], max_tokens=12, **kw)
        assert _text(spec.create_completion(PROMPTS[0], max_tokens=12, **kw)) == _text(ref), kw


def test_stopping_criteria_like_llama_cpp(plain, spec):
    """Chat templates from GGUF metadata stop on token ids through a StoppingCriteria."""
    toks = plain.tokenize(PROMPTS[0].encode())
    g = plain.generate(toks, temp=0)
    greedy = [next(g) for _ in range(8)]
    g.close()
    stop_id = greedy[5]
    crit = llama_cpp.StoppingCriteriaList([lambda ids, logits: int(ids[-1]) == stop_id])
    ref = plain.create_completion(toks, max_tokens=8, temperature=0, stopping_criteria=crit)
    out = spec.create_completion(toks, max_tokens=8, temperature=0, stopping_criteria=crit)
    assert out["choices"][0]["text"] == ref["choices"][0]["text"]
    assert out["choices"][0]["finish_reason"] == ref["choices"][0]["finish_reason"] == "stop"
