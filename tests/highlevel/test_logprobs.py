"""logprobs through llama_dflash.highlevel.Llama equal llama_cpp.Llama(logits_all=True) (tiny fixtures, CPU).

The reference enables flash attention because our target context runs with llama.cpp's default
(auto: on for CPU) while llama_cpp.Llama turns it off by default; with the same attention kernel
the raw logits agree to ~1e-6 and the remaining differences come from verify batches of several
rows (a few 1e-4 at most).  Without flash_attn on the reference, values differ by up to ~6e-3
(logits of the engine, not of the logprobs code: ordinary decoding shows the same).
"""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from llama_dflash import SpecConfig
from llama_dflash.highlevel import Llama
from hl_fixtures import ordinary, spec  # noqa: F401 (fixtures)
from llama_dflash.logprobs import ScoreRecorder
from llama_dflash.proposer import ScriptedProposer

PROMPTS = ["the quick brown fox and the lazy dog is", "a b c d", "hello world of the"]
KW = dict(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
TOL = 1e-3
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def ref(tiny_target):
    llm = llama_cpp.Llama(tiny_target, verbose=False, logits_all=True, flash_attn=True, **KW)
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
    llm = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=4), **KW)
    script = _Oracle()
    script.n_vocab = llm.n_vocab()
    llm.engine.use_proposer(ScriptedProposer(llm.engine.proposer, script))
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
        assert llm._logits_all is False and llm._record_into is None
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


def test_no_row_work_without_logprobs(spec, ordinary, monkeypatch):
    rows, softmaxes, hooks = [], [], []
    record = ScoreRecorder.__call__
    monkeypatch.setattr(ScoreRecorder, "__call__", lambda self, g, l: (rows.append(1), record(self, g, l))[1])
    to_lp = llama_cpp.Llama.logits_to_logprobs
    monkeypatch.setattr(llama_cpp.Llama, "logits_to_logprobs",
                        staticmethod(lambda *a, **k: (softmaxes.append(1), to_lp(*a, **k))[1]))
    for llm in (spec, ordinary):
        stream = llm.engine.stream

        def spy(prompt, max_tokens, sampling=None, _stream=stream, **kw):
            hooks.append(sampling.logits_hook)
            return _stream(prompt, max_tokens, sampling, **kw)

        monkeypatch.setattr(llm.engine, "stream", spy)
        llm.create_completion(PROMPTS[0], max_tokens=12, temperature=0)
        list(llm.create_completion(PROMPTS[0], max_tokens=12, temperature=0, stream=True))
        llm.create_chat_completion(MESSAGES, max_tokens=8, temperature=0)
        assert hooks == [None, None, None]  # greedy stays a plain argmax of the llama.cpp row
        assert rows == [] and softmaxes == []
        out = llm.create_completion(PROMPTS[0], max_tokens=12, temperature=0, logprobs=1)
        n = len(out["choices"][0]["logprobs"]["tokens"])
        assert isinstance(hooks[-1], ScoreRecorder) and len(rows) >= n > 0 and softmaxes
        hooks.clear(), rows.clear(), softmaxes.clear()


def test_abandoned_logprobs_stream_does_not_leak(ref, spec):
    stream = spec.create_completion(PROMPTS[0], max_tokens=20, temperature=0, logprobs=2, stream=True)
    next(stream)
    assert spec._logits_all is True
    plain_out = spec.create_completion(PROMPTS[2], max_tokens=20, temperature=0)
    assert plain_out["choices"][0]["logprobs"] is None
    expected = ref.create_completion(PROMPTS[2], max_tokens=20, temperature=0)
    assert plain_out["choices"][0]["text"] == expected["choices"][0]["text"]
    stream.close()
    assert spec._logits_all is False and spec._record_into is None
    kw = dict(max_tokens=20, temperature=0, logprobs=2)
    _same(ref.create_completion(PROMPTS[2], **kw)["choices"], spec.create_completion(PROMPTS[2], **kw)["choices"])
