"""logprobs through llama_dflash.Llama(logits_all=True) equal llama_cpp.Llama(logits_all=True)
(tiny fixtures, CPU): the same arguments, the same context, the same response code."""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from llama_dflash import SpecConfig
from llama_dflash.highlevel import Llama
from llama_dflash.proposers import ScriptedProposer

PROMPTS = ["the quick brown fox and the lazy dog is", "a b c d", "hello world of the"]
KW = dict(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
TOL = 1e-3
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def ref(tiny_target):
    llm = llama_cpp.Llama(tiny_target, verbose=False, logits_all=True, **KW)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def spec(tiny_target, tiny_draft):
    llm = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=4), logits_all=True, **KW)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def ordinary(tiny_target):
    llm = Llama(tiny_target, logits_all=True, **KW)
    yield llm
    llm.close()


class _Oracle:
    """Proposes the reference continuation (so drafts are accepted), spoiling the last token of
    every other block (so rows of rejected positions are exercised too)."""

    def __init__(self):
        self.seq: list[int] = []
        self.blocks = 0
        self.n_vocab = 1

    def __call__(self, n_past: int, n: int) -> list[int]:
        toks = list(self.seq[n_past + 1 : n_past + 1 + n])
        self.blocks += 1
        if toks and self.blocks % 2 == 0:
            toks[-1] = (toks[-1] + 1) % self.n_vocab
        return toks


@pytest.fixture(scope="module")
def oracle(tiny_target, tiny_draft):
    llm = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=4), logits_all=True, **KW)
    script = _Oracle()
    script.n_vocab = llm.n_vocab()
    llm.speculator.use_proposer(ScriptedProposer(llm.speculator.draft, script))
    llm.script = script
    yield llm
    llm.close()


def _same(a, b, path="", tol=TOL):
    """Equal structure and strings; floats within tol."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            _same(a[k], b[k], f"{path}.{k}", tol)
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{path}: lengths {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]", tol)
    elif isinstance(a, (float, np.floating)) and not isinstance(a, bool):
        assert isinstance(b, (float, np.floating)), f"{path}: {b!r} is not a float"
        assert abs(float(a) - float(b)) <= tol, f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _prime(oracle, ref, prompt_tokens, n=48):
    g = ref.generate(prompt_tokens, temp=0)
    oracle.script.seq = list(prompt_tokens) + [next(g) for _ in range(n)]
    g.close()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_logprobs_like_llama_cpp(ref, spec, ordinary, oracle, prompt):
    kw = dict(max_tokens=30, temperature=0, logprobs=3)
    expected = ref.create_completion(prompt, **kw)
    assert expected["choices"][0]["logprobs"]["token_logprobs"]
    _prime(oracle, ref, ref.tokenize(prompt.encode()))
    for llm in (spec, ordinary, oracle):
        out = llm.create_completion(prompt, **kw)
        _same(expected["choices"], out["choices"])
        assert out["usage"] == expected["usage"]
    # the oracle's verify batches accepted drafts and rejected others
    stats = oracle.last_stats
    if stats.generated_tokens > 4:
        assert stats.accepted > 0 and stats.rollbacks > 0


@pytest.mark.parametrize("n", [0, 1, 5])
def test_completion_logprobs_sizes_and_max_tokens(ref, spec, n):
    for max_tokens in (1, 7):
        kw = dict(max_tokens=max_tokens, temperature=0, logprobs=n)
        _same(ref.create_completion(PROMPTS[1], **kw)["choices"], spec.create_completion(PROMPTS[1], **kw)["choices"])


def test_streaming_completion_logprobs_like_llama_cpp(ref, spec, oracle):
    for prompt in PROMPTS[:2]:
        kw = dict(max_tokens=25, temperature=0, logprobs=2, stream=True)
        expected = [c["choices"] for c in ref.create_completion(prompt, **kw)]
        assert any(ch[0]["logprobs"] for ch in expected)
        _prime(oracle, ref, ref.tokenize(prompt.encode()))
        for llm in (spec, oracle):
            _same(expected, [c["choices"] for c in llm.create_completion(prompt, **kw)])


def test_logprobs_with_stop_sequence(ref, spec):
    full = ref.create_completion(PROMPTS[1], max_tokens=30, temperature=0)["choices"][0]["text"]
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    for stream in (False, True):
        kw = dict(max_tokens=30, temperature=0, logprobs=2, stop=[stop], stream=stream)
        a, b = ref.create_completion(PROMPTS[1], **kw), spec.create_completion(PROMPTS[1], **kw)
        if stream:
            a, b = [c["choices"] for c in a], [c["choices"] for c in b]
        else:
            a, b = a["choices"], b["choices"]
        _same(a, b)


def test_chat_logprobs_like_llama_cpp(ref, spec, ordinary):
    kw = dict(max_tokens=20, temperature=0, logprobs=True, top_logprobs=3)
    expected = ref.create_chat_completion(MESSAGES, **kw)
    assert expected["choices"][0]["logprobs"]["content"]
    for llm in (spec, ordinary):
        _same(expected["choices"], llm.create_chat_completion(MESSAGES, **kw)["choices"])
    stream_ref = [c["choices"] for c in ref.create_chat_completion(MESSAGES, stream=True, **kw)]
    _same(stream_ref, [c["choices"] for c in spec.create_chat_completion(MESSAGES, stream=True, **kw)])
    # logprobs=False (or no top_logprobs): no logprobs, like llama_cpp
    for extra in (dict(logprobs=False, top_logprobs=3), dict(logprobs=True)):
        a = ref.create_chat_completion(MESSAGES, max_tokens=5, temperature=0, **extra)
        b = spec.create_chat_completion(MESSAGES, max_tokens=5, temperature=0, **extra)
        assert a["choices"][0]["logprobs"] is None and b["choices"][0]["logprobs"] is None


def test_logprobs_with_penalties_and_logit_bias_report_raw_rows(ref, spec):
    """As in llama_cpp, logprobs come from the model's raw logits, not the processed ones."""
    kw = dict(max_tokens=20, temperature=0, logprobs=2, repeat_penalty=1.3, presence_penalty=0.4,
              logit_bias={5: 3.0})
    _same(ref.create_completion(PROMPTS[0], **kw)["choices"], spec.create_completion(PROMPTS[0], **kw)["choices"])


@pytest.mark.parametrize("prompt", PROMPTS)
def test_echo_with_logprobs_like_llama_cpp(ref, spec, ordinary, prompt):
    """Prompt-token logprobs (echo=True) come from an extra pass over the prompt."""
    kw = dict(max_tokens=8, temperature=0, logprobs=2, echo=True)
    expected = ref.create_completion(prompt, **kw)
    assert len(expected["choices"][0]["logprobs"]["tokens"]) > 8
    for llm in (spec, ordinary):
        _same(expected["choices"], llm.create_completion(prompt, **kw)["choices"])
        # the next request (reusing caches) is still right
        _same(ref.create_completion(prompt, max_tokens=8, temperature=0)["choices"],
              llm.create_completion(prompt, max_tokens=8, temperature=0)["choices"])
    expected = [c["choices"] for c in ref.create_completion(prompt, stream=True, **kw)]
    _same(expected, [c["choices"] for c in spec.create_completion(prompt, stream=True, **kw)])


def test_logprobs_need_logits_all_as_in_llama_cpp(tiny_target, tiny_draft):
    """Like llama_cpp.Llama, logprobs without logits_all=True are refused (the rows are not kept)."""
    for llm in (llama_cpp.Llama(tiny_target, verbose=False, **KW),
                Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=4), **KW)):
        with pytest.raises(ValueError, match="logits_all"):
            llm.create_completion(PROMPTS[0], max_tokens=4, logprobs=1)
        llm.close()


def test_only_sampled_rows_get_logits_without_logits_all(tiny_target, tiny_draft, monkeypatch):
    """A verification batch asks for every row's logits, a prompt only for its last row."""
    from llama_dflash.target import TargetContext

    modes = []
    decode = TargetContext.decode
    monkeypatch.setattr(TargetContext, "decode",
                        lambda self, toks, pos0, logits="last": (modes.append((len(toks), logits)),
                                                                  decode(self, toks, pos0, logits))[1])
    llm = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=4), **KW)
    llm.create_completion(PROMPTS[0], max_tokens=12, temperature=0)
    llm.close()
    assert modes[0][1] == "last" and modes[0][0] > 1  # the prompt
    assert all(mode == "all" for n, mode in modes[1:] if n > 1)


def test_abandoned_logprobs_stream_leaves_later_requests_right(ref, spec):
    stream = spec.create_completion(PROMPTS[0], max_tokens=20, temperature=0, logprobs=2, stream=True)
    next(stream)
    plain_out = spec.create_completion(PROMPTS[2], max_tokens=20, temperature=0)
    assert plain_out["choices"][0]["logprobs"] is None
    expected = ref.create_completion(PROMPTS[2], max_tokens=20, temperature=0)
    assert plain_out["choices"][0]["text"] == expected["choices"][0]["text"]
    stream.close()
    kw = dict(max_tokens=20, temperature=0, logprobs=2)
    _same(ref.create_completion(PROMPTS[2], **kw)["choices"], spec.create_completion(PROMPTS[2], **kw)["choices"])
