"""llama_dflash.Llama as a drop-in for llama_cpp.Llama: the same calls on both, side by side.

Every test builds the reference (`llama_cpp.Llama`) and ours with the same arguments -- ours
with no draft, with a random draft, and with a scripted draft whose proposals are the reference's
own continuation (so verification batches accept and reject) -- and compares tokens, texts and
object state.  The tiny random fixture is F32, where llama.cpp's logits do not depend on the batch
shape, so even sampled (T > 0) outputs must be identical token for token.  Those comparisons run
with llama_cpp.Llama's n_gpu_layers=0, on the CPU on any build; the `gpu`-marked tests offload
(`DEVICE_LAYERS`) and compare with `assert_same_tokens`, exact where the backend promises it.
"""

from __future__ import annotations


import os
import pickle
import subprocess
import sys

import llama_cpp
import numpy as np
import pytest

from _equivalence import DEVICE_LAYERS, assert_same_tokens
from llama_dflash import SpecConfig
from llama_dflash.highlevel import Llama
from llama_dflash.proposers import ScriptedProposer

KW = dict(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, verbose=False)
PROMPT = "the dog"  # the tiny fixture answers it with a long text (other prompts end at once)


class Oracle:
    """Proposes the reference's greedy continuation; every third block has its last token spoiled."""

    def __init__(self, seq: list[int], n_vocab: int):
        self.seq, self.n_vocab, self.blocks = seq, n_vocab, 0

    def __call__(self, n_past: int, n: int) -> list[int]:
        toks = list(self.seq[n_past + 1 : n_past + 1 + n])
        self.blocks += 1
        if toks and self.blocks % 3 == 0:
            toks[-1] = (toks[-1] + 1) % self.n_vocab
        return toks


def _text(out: dict) -> str:
    return out["choices"][0]["text"]


def _variants(tiny_target, tiny_draft, **kw):
    """Ours with no draft, a random draft and an oracle draft (built from the reference)."""
    ref = llama_cpp.Llama(tiny_target, **{**KW, **kw})
    toks = ref.tokenize(PROMPT.encode())
    g = ref.generate(toks, temp=0)
    seq = toks + [next(g) for _ in range(64)]
    g.close()
    none = Llama(tiny_target, **{**KW, **kw})
    rand = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=4), **{**KW, **kw})
    oracle = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=4), **{**KW, **kw})
    oracle.speculator.use_proposer(ScriptedProposer(oracle.speculator.draft, Oracle(seq, ref.n_vocab())))
    return ref, [none, rand, oracle]


def _close(*objs):
    for o in objs:
        if isinstance(o, list):
            _close(*o)
        else:
            o.close()


@pytest.fixture(scope="module")
def pair(tiny_target, tiny_draft):
    ref, ours = _variants(tiny_target, tiny_draft)
    yield ref, ours
    _close(ref, ours)


# ---- offload: the draft follows the target ------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("temp", [0.0, 0.8])
def test_offloaded_pair_matches_llama_cpp(tiny_target, tiny_draft, temp):
    """n_gpu_layers=DEVICE_LAYERS (every layer on a GPU build, none on a CPU one) on both: ours
    without a draft is llama_cpp.Llama exactly; with the random and the oracle draft (the draft
    placed where the target is) it is too, on the CPU, and on a GPU as the hardware promises."""
    kw = {**KW, "n_gpu_layers": DEVICE_LAYERS}
    ref = llama_cpp.Llama(tiny_target, **kw)
    prompt = ref.tokenize(PROMPT.encode())

    def run(llm, n=40):
        llm.set_seed(7)
        g = llm.generate(prompt, temp=temp)
        out = [next(g) for _ in range(n)]
        g.close()
        return out

    expected = run(ref)
    none = Llama(tiny_target, **kw)
    rand = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=4), **kw)
    oracle = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=4), **kw)
    oracle.speculator.use_proposer(ScriptedProposer(oracle.speculator.draft,
                                                    Oracle(prompt + run(ref, 64), ref.n_vocab())))
    try:
        assert run(none) == expected  # no draft: llama_cpp.Llama's own decoding
        for llm in (rand, oracle):
            assert llm.placement["draft"].n_gpu_layers == (0 if DEVICE_LAYERS == 0 else -1)
            assert_same_tokens(run(llm), expected, prompt=prompt, model=tiny_target, n_gpu_layers=DEVICE_LAYERS,
                               temperature=temp, ignore_eos=False, what=f"drop-in, draft {llm.speculative}")
        if temp == 0:
            assert oracle.speculator.stats.accepted > 0  # verification batches really accepted drafts
    finally:
        _close(ref, none, rand, oracle)


# ---- constructor arguments ----------------------------------------------------------------------
ARGUMENTS = [
    dict(flash_attn=True),
    dict(flash_attn=True, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32),
    dict(type_k=llama_cpp.GGML_TYPE_F32),
    dict(rope_freq_base=300.0),
    dict(rope_freq_scale=0.25),
    dict(rope_scaling_type=llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN, rope_freq_scale=0.5, yarn_orig_ctx=64,
         yarn_ext_factor=1.0, yarn_attn_factor=0.8, yarn_beta_fast=16.0, yarn_beta_slow=2.0),
    dict(kv_overrides={"llama.rope.freq_base": 500.0}),
    dict(use_mmap=False, use_mlock=False, n_threads_batch=1, offload_kqv=False, op_offload=False, swa_full=True),
    dict(n_threads=0, n_batch=16, n_ubatch=8),
    dict(last_n_tokens_size=-1),
    dict(seed=1234),
]
# arguments that change the reference's greedy output (so the comparison can fail)
CHANGES_OUTPUT = {"rope_freq_base", "rope_freq_scale", "rope_scaling_type", "kv_overrides"}


@pytest.mark.parametrize("kw", ARGUMENTS, ids=lambda kw: ",".join(kw))
def test_constructor_arguments_mean_the_same(tiny_target, tiny_draft, kw):
    ref, ours = _variants(tiny_target, tiny_draft, **kw)
    try:
        call = dict(max_tokens=24, temperature=0, repeat_penalty=1.1)
        expected = _text(ref.create_completion(PROMPT, **call))
        assert len(expected) > 8
        for llm in ours:
            assert _text(llm.create_completion(PROMPT, **call)) == expected, (kw, llm.speculative)
            assert llm.n_tokens == ref.n_tokens
            assert llm.context_params.n_threads == ref.context_params.n_threads
            assert llm.context_params.flash_attn_type == ref.context_params.flash_attn_type
        if CHANGES_OUTPUT & set(kw):
            plain = llama_cpp.Llama(tiny_target, **KW)
            assert _text(plain.create_completion(PROMPT, **call)) != expected, "the argument changes nothing"
            plain.close()
    finally:
        _close(ref, ours)


def test_bad_lora_path_is_a_clear_error(tiny_target, tiny_draft, tmp_path):
    with pytest.raises(ValueError, match="LoRA"):
        Llama(tiny_target, lora_path=str(tmp_path / "missing.gguf"), **KW)
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf at all")
    with pytest.raises(Exception, match="bogus.gguf"):
        Llama(tiny_target, speculative=SpecConfig(tiny_draft), lora_path=str(bogus), **KW)


def test_logits_all_and_mirostat_work(tiny_target, tiny_draft):
    ref, ours = _variants(tiny_target, tiny_draft, logits_all=True)
    try:
        call = dict(max_tokens=16, temperature=0.7, mirostat_mode=2, seed=9, logprobs=2)
        expected = ref.create_completion(PROMPT, **call)
        for llm in ours:
            out = llm.create_completion(PROMPT, **call)
            assert _text(out) == _text(expected)
            assert out["choices"][0]["logprobs"]["tokens"] == expected["choices"][0]["logprobs"]["tokens"]
    finally:
        _close(ref, ours)


# ---- sampling: same seed, same text, with or without a draft --------------------------------------
@pytest.mark.parametrize("call", [
    dict(temperature=0.8, seed=7),
    dict(temperature=1.2, top_k=0, top_p=1.0, min_p=0.0, seed=3),
    dict(temperature=0.9, typical_p=0.6, seed=11),
    dict(temperature=0.7, repeat_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.4, seed=5),
    dict(temperature=0.0, min_p=1.0),
    dict(temperature=0.6, repeat_penalty=0.0, seed=2),
    dict(temperature=-1.0, seed=8),
])
def test_sampled_text_identical(pair, call):
    ref, ours = pair

    def outcome(llm):
        try:
            return _text(llm.create_completion(PROMPT, max_tokens=32, **call))
        except Exception as e:  # noqa: BLE001 - the reference's failures must be ours too
            return type(e)

    expected = outcome(ref)
    for llm in ours:
        assert outcome(llm) == expected, llm.speculative
    oracle = ours[2]
    if call.get("temperature", 1) == 0:
        assert oracle.last_stats.accepted > 0  # verification batches really accepted drafts


def test_chat_identical(pair):
    ref, ours = pair
    messages = [{"role": "user", "content": "the dog"}]
    expected = ref.create_chat_completion(messages, max_tokens=20, temperature=0.8, seed=4)
    for llm in ours:
        out = llm.create_chat_completion(messages, max_tokens=20, temperature=0.8, seed=4)
        assert out["choices"][0]["message"] == expected["choices"][0]["message"]


# ---- the rest of the object ---------------------------------------------------------------------------
def test_n_tokens_input_ids_and_sample_after_a_completion(pair):
    ref, ours = pair
    ref.create_completion(PROMPT, max_tokens=5, temperature=0)
    after = ref.sample(temp=0)
    for llm in ours:
        llm.create_completion(PROMPT, max_tokens=5, temperature=0)
        assert llm.n_tokens == ref.n_tokens
        assert list(llm.input_ids[: llm.n_tokens]) == list(ref.input_ids[: ref.n_tokens])
        assert llm.sample(temp=0) == after


def test_eval_then_sample_like_llama_cpp(pair):
    ref, ours = pair
    toks = ref.tokenize(PROMPT.encode())
    ref.reset()
    ref.eval(toks)
    expected = ref.sample(temp=0)
    for llm in ours:
        llm.reset()
        llm.eval(toks)
        assert llm.n_tokens == len(toks)
        assert llm.sample(temp=0) == expected
        llm.eval([expected])
        assert llm.n_tokens == len(toks) + 1


def test_stopping_criteria_see_what_llama_cpp_shows_them(tiny_target, tiny_draft):
    """Criteria get the same token ids as in the reference, a real scores row, and stop at the
    same place."""
    ref, ours = _variants(tiny_target, tiny_draft, logits_all=True)
    try:
        def crit(store):
            def criterion(ids, logits):
                store.append((list(map(int, ids)), int(np.argmax(logits)), float(np.max(logits))))
                return len(store) >= 12
            return llama_cpp.StoppingCriteriaList([criterion])

        seen_ref: list = []
        ref_out = ref.create_completion(PROMPT, max_tokens=20, temperature=0, stopping_criteria=crit(seen_ref))
        assert len(seen_ref) >= 12
        for llm in ours:
            seen: list = []
            out = llm.create_completion(PROMPT, max_tokens=20, temperature=0, stopping_criteria=crit(seen))
            assert _text(out) == _text(ref_out)
            assert [ids for ids, *_ in seen] == [ids for ids, *_ in seen_ref]
            # a real logits row (the reference hands over row scores[sample_idx - n_tokens], which
            # with a draft in the batch is a row of that batch, not the first row of the buffer)
            assert all(np.isfinite(m) and m > 0 for *_, m in seen)
    finally:
        _close(ref, ours)


def test_save_and_load_state(pair):
    ref, ours = pair
    toks = ref.tokenize(PROMPT.encode())
    for llm in [ref, *ours]:
        g = llm.generate(toks, temp=0)
        first = [next(g) for _ in range(6)]
        g.close()
        state = llm.save_state()
        rest = llm.create_completion(toks + first, max_tokens=10, temperature=0)
        llm.create_completion("a b c", max_tokens=5, temperature=0)  # something else in between
        llm.load_state(state)
        assert llm.n_tokens == state.n_tokens
        again = llm.create_completion(toks + first, max_tokens=10, temperature=0)
        assert _text(again) == _text(rest)
        if llm is not ref and llm.speculative is not None:
            assert llm.last_stats.reused_prompt_tokens > 0
    assert len(ours[1].save_state().llama_state) > 1000  # the real cache, not a stub


def test_pickle_round_trip(tiny_target, tiny_draft):
    llm = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=3), **KW)
    expected = _text(llm.create_completion(PROMPT, max_tokens=12, temperature=0))
    clone = pickle.loads(pickle.dumps(llm))
    try:
        assert clone.speculative == llm.speculative and clone.speculator is not None
        assert _text(clone.create_completion(PROMPT, max_tokens=12, temperature=0)) == expected
    finally:
        _close(llm, clone)


def test_call_and_stream_like_llama_cpp(pair):
    ref, ours = pair
    expected = [c["choices"][0]["text"] for c in ref(PROMPT, max_tokens=16, temperature=0, stream=True)]
    for llm in ours:
        assert [c["choices"][0]["text"] for c in llm(PROMPT, max_tokens=16, temperature=0, stream=True)] == expected
        assert _text(llm(PROMPT, max_tokens=16, temperature=0)) == "".join(expected)


# ---- where the reference crashes, we raise ------------------------------------------------------------
@pytest.mark.parametrize("call", [dict(presence_penalty=float("nan")), dict(temperature=float("inf")),
                                  dict(frequency_penalty=float("-inf")), dict(top_p=float("nan"))])
def test_non_finite_sampling_values_are_refused(pair, call):
    for llm in pair[1]:
        with pytest.raises(ValueError):
            llm.create_completion(PROMPT, max_tokens=4, **call)
        assert _text(llm.create_completion(PROMPT, max_tokens=4, temperature=0)) == \
            _text(pair[0].create_completion(PROMPT, max_tokens=4, temperature=0))


def test_sample_without_eval_is_a_clear_error(tiny_target, tiny_draft):
    llm = Llama(tiny_target, speculative=SpecConfig(tiny_draft), **KW)
    try:
        with pytest.raises(ValueError):
            llm.sample(temp=0)
        with pytest.raises(ValueError):
            llm.eval([10**6])
    finally:
        llm.close()


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


@pytest.mark.gpu
def test_verbose_false_prints_nothing(tiny_target, tiny_draft):
    code = (f"from llama_dflash import Llama, SpecConfig\n"
            # flash attention on: with it off the class warns once by design (issue 43), which is not a log
            f"llm = Llama({tiny_target!r}, speculative=SpecConfig({tiny_draft!r}), n_ctx=128, verbose=False,\n"
            f"            flash_attn=True, n_gpu_layers={DEVICE_LAYERS})\n"  # offloaded (target and draft) where the build can
            f"llm.create_completion('the dog', max_tokens=4, temperature=0)\n"
            f"llm.close()\n")
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and proc.stdout == ""


def test_tiny_context_works_or_refuses_cleanly(tiny_target, tiny_draft):
    """n_ctx=8 (smaller than the draft's block): same output as the reference, no abort."""
    code = (f"import llama_cpp\nfrom llama_dflash import Llama, SpecConfig\n"
            f"ref = llama_cpp.Llama({tiny_target!r}, n_ctx=8, verbose=False)\n"
            f"a = ref.create_completion('the dog', max_tokens=4, temperature=0)['choices'][0]['text']\n"
            f"llm = Llama({tiny_target!r}, speculative=SpecConfig({tiny_draft!r}, draft_n_max=4), n_ctx=8, verbose=False)\n"
            f"b = llm.create_completion('the dog', max_tokens=4, temperature=0)['choices'][0]['text']\n"
            f"assert a == b, (a, b)\nprint('ok')\n")
    proc = _run(code)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def test_overflowing_grammar_is_refused_in_a_subprocess(tiny_target, tiny_draft):
    code = (f"import llama_cpp\nfrom llama_dflash import Llama, SpecConfig\n"
            f"llm = Llama({tiny_target!r}, speculative=SpecConfig({tiny_draft!r}), n_ctx=128, verbose=False)\n"
            f"g = llama_cpp.LlamaGrammar(_grammar='root ::= ' + '(' * 60000 + '\"a\"' + ')' * 60000)\n"
            f"try:\n    llm.create_completion('the', max_tokens=2, grammar=g)\n"
            f"except ValueError as e:\n    print('refused', e)\n")
    proc = _run(code)
    assert proc.returncode == 0 and "refused" in proc.stdout, proc.stderr[-2000:]


def test_nan_penalty_with_grammar_cannot_abort(tiny_target, tiny_draft):
    """The reference process aborts (grammar accepts a masked token); ours raises first."""
    code = (f"import llama_cpp\nfrom llama_dflash import Llama, SpecConfig\n"
            f"llm = Llama({tiny_target!r}, speculative=SpecConfig({tiny_draft!r}), n_ctx=128, verbose=False)\n"
            f"g = llama_cpp.LlamaGrammar.from_string('root ::= \"the\" | \"a\"', verbose=False)\n"
            f"try:\n    llm.create_completion('the', max_tokens=4, grammar=g, presence_penalty=float('nan'))\n"
            f"except ValueError as e:\n    print('refused', e)\n"
            f"print(llm.create_completion('the', max_tokens=4, grammar=g, temperature=0)['choices'][0]['text'])\n")
    proc = _run(code)
    assert proc.returncode == 0 and "refused" in proc.stdout, proc.stderr[-2000:]





def test_bad_token_in_a_later_chunk_leaves_the_cache_right(tiny_target, tiny_draft):
    """A token prompt longer than n_batch with an out-of-range id in its second chunk is refused
    before anything is decoded; the next request that shares the previous prefix is right."""
    kw = {**KW, "logits_all": True, "n_batch": 16, "n_ubatch": 16}
    ref = llama_cpp.Llama(tiny_target, **kw)
    llm = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=4), **kw)
    try:
        text = "the dog " * 12
        toks = ref.tokenize(text.encode())
        assert len(toks) > 16
        first = _text(llm.create_completion(text, max_tokens=8, temperature=0))
        bad = toks[:20] + [10**7] + toks[21:]
        with pytest.raises(ValueError, match="vocabulary"):
            llm.create_completion(bad, max_tokens=4, temperature=0, echo=True, logprobs=1)
        again = llm.create_completion(text, max_tokens=8, temperature=0, echo=True, logprobs=1)
        expected = ref.create_completion(text, max_tokens=8, temperature=0, echo=True, logprobs=1)
        assert _text(again) == _text(expected) and _text(again).endswith(first)
        assert again["choices"][0]["logprobs"]["tokens"] == expected["choices"][0]["logprobs"]["tokens"]
    finally:
        _close(ref, llm)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["lfm2", "qwen3next"])
def test_hybrid_targets_roll_back_through_checkpoints(tiny_dir, arch):
    """Recurrent/hybrid targets: the reference's cut fails, our eval restores checkpoints."""
    from llama_dflash.tiny_qwen3next import write_tiny_qwen3next
    from llama_dflash.writer import write_random_draft, write_tiny_target

    if arch == "lfm2":
        target = write_tiny_target(str(tiny_dir / "hl_lfm2.gguf"), arch="lfm2", n_layer=4, seed=11)
    else:
        target = write_tiny_qwen3next(str(tiny_dir / "hl_qwen3next.gguf"), seed=1)
    draft = write_random_draft(str(tiny_dir / f"hl_{arch}_draft.gguf"), target, block_size=9, seed=12)
    ref = llama_cpp.Llama(target, **KW)
    toks = ref.tokenize(PROMPT.encode())
    g = ref.generate(toks, temp=0)
    seq = toks + [next(g) for _ in range(64)]
    g.close()
    llm = Llama(target, speculative=SpecConfig(draft, draft_n_max=4), **KW)
    llm.speculator.use_proposer(ScriptedProposer(llm.speculator.draft, Oracle(seq, ref.n_vocab())))
    try:
        assert llm.speculator.rewinder.mode == "checkpoint"
        for call in (dict(temperature=0), dict(temperature=0.8, seed=5)):
            expected = _text(ref.create_completion(PROMPT, max_tokens=24, **call))
            assert _text(llm.create_completion(PROMPT, max_tokens=24, **call)) == expected, call
        assert llm.last_stats.checkpoint_restores > 0 or llm.last_stats.rollbacks == 0
        with pytest.raises(ValueError, match="checkpoint"):
            Llama(target, speculative=SpecConfig(draft, rollback="native"), **KW)
    finally:
        _close(ref, llm)


def _write_lora(path: str, n_embd: int = 64, rank: int = 4, seed: int = 0) -> str:
    """A LoRA adapter GGUF for the tiny llama fixture: low-rank updates of every attn_q/ffn_up."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(rank))
    for layer in range(4):
        for name, n_out in (("attn_q", n_embd), ("ffn_up", 128)):
            base = f"blk.{layer}.{name}.weight"
            w.add_tensor(base + ".lora_a", rng.standard_normal((rank, n_embd)).astype(np.float32))
            w.add_tensor(base + ".lora_b", rng.standard_normal((n_out, rank)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_lora_applies_to_the_target(tiny_target, tiny_draft, tmp_path):
    lora = _write_lora(str(tmp_path / "lora.gguf"))
    ref, ours = _variants(tiny_target, tiny_draft, lora_path=lora, lora_scale=0.7)
    try:
        call = dict(max_tokens=24, temperature=0)
        expected = _text(ref.create_completion(PROMPT, **call))
        plain = llama_cpp.Llama(tiny_target, **KW)
        assert _text(plain.create_completion(PROMPT, **call)) != expected, "the adapter changes nothing"
        plain.close()
        for llm in ours:
            assert _text(llm.create_completion(PROMPT, **call)) == expected, llm.speculative
    finally:
        _close(ref, ours)
