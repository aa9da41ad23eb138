"""The multi-sequence engine (issue 30): many sequences in one context, one decode per step, requests
joining and leaving between steps; every greedy answer equals the prompt's answer decoded alone."""

from __future__ import annotations

import threading

import llama_cpp
import pytest

from llama_dflash._llama import Model
from llama_dflash.batched import BatchedEngine, EngineClosed, physical_cores
from llama_dflash.config import SpecConfig
from llama_dflash.sampling import SamplingParams

TEXTS = ["the quick brown fox", "hello world and", "a b c d e f g a b c d e f g a b c", "once upon a time there was",
         "one two three one two three one two", "lazy dog is the"]
MAX = 40


@pytest.fixture(scope="module")
def prompts(tiny_target):
    model = Model(tiny_target)
    try:
        return [model.tokenize(t) for t in TEXTS]
    finally:
        model.close()


def _engine(path, **kw):
    kw.setdefault("n_seq", 4)
    return BatchedEngine(path, n_ctx_seq=256, n_batch=64, n_threads=1, **kw)


def _reference(path, prompts, max_tokens=MAX):
    """llama-cpp-python's own greedy generation, one prompt at a time (flash attention on)."""
    llm = llama_cpp.Llama(path, n_ctx=256, n_batch=64, n_threads=1, flash_attn=True, verbose=False)
    try:
        out = []
        for p in prompts:
            toks = []
            for t in llm.generate(p, temp=0.0, repeat_penalty=1.0):
                toks.append(t)
                if llama_cpp.llama_vocab_is_eog(llm._model.vocab, t) or len(toks) >= max_tokens:
                    break
            out.append(toks)
        return out
    finally:
        llm.close()


@pytest.fixture(scope="module")
def reference(tiny_target, prompts):
    return _reference(tiny_target, prompts)


def test_batch_equals_each_prompt_alone(tiny_target, prompts, reference):
    assert any(len(r) == MAX for r in reference) and len({tuple(r) for r in reference}) == len(reference)
    with _engine(tiny_target, n_seq=3) as engine:  # 6 prompts on 3 slots: later ones join as others leave
        together = engine.generate(prompts, max_tokens=MAX)
        stats = engine.stats()
    assert together == reference
    assert stats["mean_batch_sequences"] > 1.5  # the steps really carried several sequences
    assert stats["active"] == 0 and stats["waiting"] == 0


def test_answer_unchanged_by_company_joining_mid_generation(tiny_target, prompts, reference):
    with _engine(tiny_target) as engine:
        seq = engine.submit(prompts[3], max_tokens=MAX)
        others = []
        for step in range(30):
            engine.step()
            if step in (2, 7, 11):  # companions join while it runs, at other positions
                others.append(engine.submit(prompts[step % 3], max_tokens=MAX))
        while not (seq.done and all(o.done for o in others)):
            engine.step()
    assert seq.output == reference[3] and seq.finish_reason == "length"
    assert [o.output for o in others] == [reference[2], reference[1], reference[2]]


@pytest.mark.parametrize("spec_type", ["lookup", "ngram-simple"])
def test_speculation_per_sequence_keeps_the_answers(tiny_target, prompts, reference, spec_type):
    spec = SpecConfig(spec_type=spec_type, draft_n_max=4,
                      **({"ngram_size_n": 2, "ngram_size_m": 4} if spec_type == "ngram-simple" else {}))
    with _engine(tiny_target, spec=spec) as engine:
        seqs = [engine.submit(p, max_tokens=MAX) for p in prompts]
        while not all(s.done for s in seqs):
            engine.step()
    assert [s.output for s in seqs] == reference
    drafted = sum(s.stats.drafted for s in seqs)
    assert drafted > 0  # the repetitive prompts gave the drafters something
    summary = seqs[2].stats.summary()
    assert summary["algorithm"] == spec_type and summary["generated_tokens"] == len(reference[2])
    assert summary["accepted"] <= summary["verified"] == summary["drafted"]
    if spec_type == "lookup":
        assert sum(s.stats.accepted for s in seqs) > 0
        assert sum(s.stats.rollbacks for s in seqs) > 0  # rejected rows were cut per sequence


def test_seeded_sampling_does_not_depend_on_the_batch(tiny_target, prompts):
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, seed=1234)
    with _engine(tiny_target) as engine:
        alone = engine.generate([prompts[0]], max_tokens=MAX, params=params)[0]
        together = engine.generate(prompts[:3] + [prompts[0]], max_tokens=MAX,
                                   params=[params, SamplingParams(), SamplingParams(temperature=1.0, seed=7),
                                           params])
        other_seed = engine.generate([prompts[0]], max_tokens=MAX,
                                     params=SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05,
                                                           seed=99))[0]
    assert together[0] == alone and together[3] == alone
    assert other_seed != alone  # the seed does matter: the check above is not vacuous


def test_cancel_frees_the_slot_and_limits(tiny_target, prompts, reference):
    with _engine(tiny_target, n_seq=1) as engine:
        first = engine.submit(prompts[1], max_tokens=MAX)
        second = engine.submit(prompts[2], max_tokens=5)
        for _ in range(3):
            engine.step()
        assert not first.done and not second.done and engine.n_waiting == 1
        first.cancel()
        while not second.done:
            engine.step()
        assert first.finish_reason == "cancelled" and 0 < len(first.output) < MAX
        assert first.output == reference[1][:len(first.output)]
        assert second.finish_reason == "length" and second.output == reference[2][:5]
        assert engine.submit(prompts[0], max_tokens=0).finish_reason == "length"
        with pytest.raises(ValueError, match="slot holds"):
            engine.submit(list(range(1, 300)), max_tokens=4)
        with pytest.raises(ValueError, match="outside the vocabulary"):
            engine.submit([10 ** 7], max_tokens=4)


def test_context_of_a_slot_ends_the_generation(tiny_target, prompts):
    with BatchedEngine(tiny_target, n_seq=2, n_ctx_seq=32, n_batch=64, n_threads=1) as engine:
        out = engine.submit(prompts[0], max_tokens=1000)
        while not out.done:
            engine.step()
    assert out.finish_reason in ("length", "stop")
    if out.finish_reason == "length":
        assert len(prompts[0]) + len(out.output) == min(32, engine.n_ctx_seq)


def test_background_loop_streams_tokens(tiny_target, prompts, reference):
    engine = _engine(tiny_target)
    engine.start()
    try:
        got: dict[int, list[int]] = {}

        def client(i: int) -> None:
            got[i] = list(engine.submit(prompts[i], max_tokens=MAX).tokens(timeout=30))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [got[i] for i in range(len(prompts))] == reference
    finally:
        engine.close()
    with pytest.raises(EngineClosed):
        engine.submit(prompts[0])


def test_refusals(tiny_target, tiny_draft, tmp_path):
    with pytest.raises(ValueError, match="does not run spec_type auto"):
        _engine(tiny_target, spec=SpecConfig(tiny_draft, spec_type="auto"))
    with pytest.raises(ValueError, match="n_seq"):
        _engine(tiny_target, n_seq=0)
    from llama_dflash.tiny_qwen3next import write_tiny_qwen3next

    hybrid = write_tiny_qwen3next(str(tmp_path / "q3n.gguf"))
    with pytest.raises(ValueError, match="cannot draft for recurrent or hybrid"):
        _engine(hybrid, spec=SpecConfig(spec_type="ngram-simple"))
    assert physical_cores() >= 1


def test_hybrid_target_batched_ordinarily_equals_each_prompt_alone(tmp_path):
    """A hybrid target (gated delta net + attention): one recurrent state per sequence, every
    greedy answer equal to the prompt's answer decoded alone; requests that reuse a slot start
    from a clean state (no prefix of a recurrent state can be kept)."""
    from llama_dflash.config import TargetConfig
    from llama_dflash.engine import OrdinaryDecoding
    from llama_dflash.tiny_qwen3next import write_tiny_qwen3next

    hybrid = write_tiny_qwen3next(str(tmp_path / "q3n.gguf"), n_embd=64)
    prompts = [[1, 279, 293, 290, 276], [1, 306, 294, 288], [1, 279, 293, 290, 276, 306], [1, 288, 288, 279],
               [1, 279, 293]]  # the third and last share a prefix with the first: no reuse may leak
    with OrdinaryDecoding(TargetConfig(hybrid, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)) as alone:
        refs = [alone.generate(p, 24).tokens for p in prompts]
    assert len({tuple(r) for r in refs}) > 1 and max(len(r) for r in refs) > 4
    with BatchedEngine(hybrid, n_seq=2, n_ctx_seq=256, n_batch=64, n_threads=1) as engine:
        assert not engine.prefix_reuse
        seqs = [engine.submit(p, max_tokens=24) for p in prompts]
        engine.start()
        outs = [list(s.tokens(timeout=120)) for s in seqs]
        assert engine.stats()["cached_tokens"] == 0
    assert outs == refs


@pytest.mark.slow
def test_smollm2_batch_equals_sequential():
    from llama_dflash.defaults import smollm2_path

    try:
        path = smollm2_path()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(str(exc))
    llm = llama_cpp.Llama(path, n_ctx=512, n_threads=2, flash_attn=True, verbose=False)
    chats = ["What is the capital of France?", "List three red fruits.", "Why is the sky blue?",
             "Write a haiku about the sea."]
    prompts = [llm.tokenize(f"<|im_start|>user\n{c}<|im_end|>\n<|im_start|>assistant\n".encode(), special=True)
               for c in chats]
    llm.close()
    ref = _reference_smol(path, prompts)
    with BatchedEngine(path, n_seq=4, n_ctx_seq=512, n_threads=2) as engine:
        together = engine.generate(prompts, max_tokens=48)
    assert together == ref


def _reference_smol(path, prompts):
    llm = llama_cpp.Llama(path, n_ctx=512, n_threads=2, flash_attn=True, verbose=False)
    try:
        out = []
        for p in prompts:
            toks = []
            for t in llm.generate(p, temp=0.0, repeat_penalty=1.0):
                toks.append(t)
                if llama_cpp.llama_vocab_is_eog(llm._model.vocab, t) or len(toks) >= 48:
                    break
            out.append(toks)
        return out
    finally:
        llm.close()


# ---- prefix reuse ---------------------------------------------------------------------------------
def test_a_slot_reuses_the_prefix_its_last_request_left(tiny_target, prompts, reference):
    with _engine(tiny_target, n_seq=2) as engine:
        first = engine.generate([prompts[0], prompts[1]], max_tokens=MAX)
        again = engine.submit(prompts[1], max_tokens=MAX)  # the slot that served prompts[1] is chosen
        longer = engine.submit(prompts[0] + first[0][:5], max_tokens=MAX - 5)  # its answer's start, continued
        while not (again.done and longer.done):
            engine.step()
        stats = engine.stats()
    assert first == reference[:2] and again.output == reference[1]
    assert again.stats.cached_tokens == len(prompts[1]) - 1  # all but the last token (its logits are needed)
    assert longer.stats.cached_tokens == len(prompts[0]) + 5 - 1
    assert longer.output == reference[0][5:]
    assert stats["cached_tokens"] == again.stats.cached_tokens + longer.stats.cached_tokens
    with _engine(tiny_target, n_seq=2, prefix_reuse=False) as engine:
        engine.generate([prompts[1]], max_tokens=MAX)
        cold = engine.submit(prompts[1], max_tokens=MAX)
        while not cold.done:
            engine.step()
    assert cold.stats.cached_tokens == 0 and cold.output == reference[1]


def test_rejected_rows_of_an_ended_request_do_not_stay_in_its_slot(tiny_target, prompts, reference):
    """A request that ends inside a verified draft leaves rows past its last token in the cache;
    the next request of the slot must not see them (it reuses only what the history says)."""
    spec = SpecConfig(spec_type="lookup", draft_n_max=6)
    with _engine(tiny_target, n_seq=1, spec=spec) as engine:
        cut = engine.generate([prompts[4]], max_tokens=7)[0]  # lookup drafts on the repetitive prompt
        full = engine.submit(prompts[4], max_tokens=MAX)
        while not full.done:
            engine.step()
        assert engine.ctx.pos_max(0) == len(full.history) - 1
    assert cut == reference[4][:7] and full.output == reference[4]


# ---- the draft model per sequence -----------------------------------------------------------------
def _record_batched(engine):
    """Wrap the engine's draft so every proposal is recorded per request: {Sequence_: [(pos, tokens)]}."""
    seen: dict = {}
    propose = engine.draft.propose

    def wrapped(blocks):
        propose(blocks)
        by_slot = {s.seq_id: s for s in engine._active}
        for blk in blocks:
            seen.setdefault(by_slot[blk.seq_id], []).append((blk.pos, list(blk.tokens)))

    engine.draft.propose = wrapped
    return seen


def _single_proposals(path, draft, prompt, k, max_tokens, **spec_kw):
    """What the single-sequence engine proposes for `prompt` alone: [(n_past, tokens)] and its output."""
    from llama_dflash import LlamaDFlashDecoding
    from llama_dflash.config import TargetConfig

    cfg = TargetConfig(path, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    with LlamaDFlashDecoding(cfg, SpecConfig(draft, draft_n_max=k, backend_sampling=False, **spec_kw)) as eng:
        got = []
        propose = eng._dflash.propose

        def wrapped(id_last, n_past, n, **kw):
            out = propose(id_last, n_past, n, **kw)
            got.append((n_past, list(out)))
            return out

        eng._dflash.propose = wrapped
        out = eng.generate(prompt, max_tokens).tokens
    return got, out


def _same_where_both_drafted(batched, single, i):
    """Proposals at the same position (same anchor, same history) are the same tokens.  The single
    engine drafts from the last prompt token before its first sample (as llama.cpp's C++ driver);
    the batched engine prefills the whole prompt first (as llama-server), so the first block of
    each differs in position, and later ones wherever acceptance made them step differently."""
    want = dict(single)
    common = [(pos, toks) for pos, toks in batched if pos in want]
    assert len(common) >= len(batched) // 2 and common, (i, [p for p, _ in batched], sorted(want))
    for pos, toks in common:
        n = min(len(toks), len(want[pos]))
        assert toks[:n] == want[pos][:n], (i, pos, toks, want[pos])


@pytest.fixture(scope="module")
def attentive(tiny_dir, tiny_target):
    """A random draft whose proposals depend on the features and the block (see test_adaptive)."""
    from llama_dflash.inspect import read_gguf
    from llama_dflash.writer import DraftShape, evenly_spread_layers, random_draft_weights, write_draft

    target = read_gguf(tiny_target)
    shape = DraftShape(n_embd=target.n_embd, n_head=4, n_head_kv=2, block_size=16,
                       target_layers=evenly_spread_layers(target.n_layer))
    weights = random_draft_weights(shape, target.n_vocab, seed=4, scale=0.2)
    return write_draft(str(tiny_dir / "batched_attentive.gguf"), shape, weights, tokenizer_from=tiny_target,
                       mask_token_id=3)


@pytest.fixture(scope="module")
def dspark_conf(tiny_dir, tiny_target):
    from llama_dflash.writer import write_random_draft

    return write_random_draft(str(tiny_dir / "batched_dspark.gguf"), tiny_target, block_size=8, markov_rank=8,
                              confidence_head=True, sample_from_anchor=True, seed=10)


@pytest.mark.parametrize("which,k,spec_kw", [("attentive", 4, {}), ("dspark", 5, {"draft_p_min": 0.3}),
                                             ("dspark", 7, {}), ("attentive", 4, {"backend_sampling": True}),
                                             ("dspark", 5, {"draft_p_min": 0.3, "backend_sampling": True})])
def test_draft_proposals_per_sequence_equal_the_single_engines(tiny_target, prompts, reference, attentive,
                                                               dspark_conf, which, k, spec_kw):
    """Four requests drafting together get, block for block, the proposals the single-sequence
    engine makes for each prompt alone: each slot's draft stream holds its own features at its own
    positions, and one decode of four blocks reads as four decodes of one (the DSpark Markov head
    and confidence cut included)."""
    draft = attentive if which == "attentive" else dspark_conf
    spec = SpecConfig(draft, draft_n_max=k, **{"backend_sampling": False, **spec_kw})
    backend = spec_kw.pop("backend_sampling", False)
    with _engine(tiny_target, n_seq=4, spec=spec) as engine:
        assert engine.draft.backend_sampling_active is backend  # top-k chains on the draft context, one per slot
        seen = _record_batched(engine)
        seqs = [engine.submit(p, max_tokens=MAX) for p in prompts]
        while not all(s.done for s in seqs):
            engine.step()
        stats = engine.stats()
    assert [s.output for s in seqs] == reference
    assert stats["draft_blocks"] < sum(len(v) for v in seen.values())  # blocks of several sequences per decode
    for i, seq in enumerate(seqs):
        single, out = _single_proposals(tiny_target, draft, prompts[i], k, MAX, **spec_kw)
        assert out == reference[i][:len(out)] and len(out) >= len(reference[i]) - 1  # (it leaves out an EOG)
        batched = seen.get(seq, [])
        _same_where_both_drafted(batched, single, i)
        assert seq.stats.draft_model_steps == sum(1 for _, toks in batched if toks) > 0
    assert sum(s.stats.drafted for s in seqs) > 0


def test_draft_with_prefix_reuse_and_company(tiny_target, prompts, reference, attentive):
    """A request on a slot whose cells another request left proposes what it proposes alone: the
    draft stream is cut where the target's is."""
    spec = SpecConfig(attentive, draft_n_max=3, backend_sampling=False)
    with _engine(tiny_target, n_seq=2, spec=spec) as engine:
        engine.generate([prompts[0] + reference[0][:10], prompts[2]], max_tokens=8)
        seen = _record_batched(engine)
        seq = engine.submit(prompts[0], max_tokens=MAX)  # shares its prompt with the first request's cells
        other = engine.submit(prompts[5], max_tokens=MAX)
        while not (seq.done and other.done):
            engine.step()
    assert seq.stats.cached_tokens == len(prompts[0]) - 1
    assert seq.output == reference[0] and other.output == reference[5]
    single, _ = _single_proposals(tiny_target, attentive, prompts[0], 3, MAX)
    _same_where_both_drafted(seen[seq], single, 0)


def test_adaptive_draft_lengths_learn_per_batch_width(tiny_target, prompts, reference, attentive):
    spec = SpecConfig(attentive, draft_n_max="auto", backend_sampling=False)
    with _engine(tiny_target, n_seq=3, spec=spec) as engine:
        out = engine.generate(prompts, max_tokens=MAX)
        stats = engine.stats()
    assert out == reference
    costs = stats["step_costs"]
    assert costs and all("0" in c for c in costs.values())  # the ordinary step was measured at each width
    assert any(len(c) > 1 for c in costs.values())  # and at least one draft length
    assert stats["draft_blocks"] > 0


def test_lookup_chained_with_the_draft(tiny_target, prompts, reference, attentive):
    spec = SpecConfig(attentive, spec_type="lookup,draft-dflash", draft_n_max=4, backend_sampling=False)
    with _engine(tiny_target, spec=spec) as engine:
        seqs = [engine.submit(p, max_tokens=MAX) for p in prompts]
        while not all(s.done for s in seqs):
            engine.step()
    assert [s.output for s in seqs] == reference
    model = sum(s.stats.draft_model_steps for s in seqs)
    assert 0 < model < sum(s.stats.verification_steps for s in seqs)  # both drafted, on different steps


def test_host_prompt_cache_restores_a_prompt_no_slot_holds(tiny_target, prompts, reference, attentive):
    """One slot, three prompts in turn: each evicts the last one's cells, which are saved to host
    memory first; asked again, a prompt's state is restored, not prefilled, and the answer and the
    draft's proposals (its stream is restored too) are the ones it gets alone."""
    spec = SpecConfig(attentive, draft_n_max=3, backend_sampling=False)
    with _engine(tiny_target, n_seq=1, spec=spec) as engine:
        for i in (0, 3, 5):
            assert engine.generate([prompts[i]], max_tokens=MAX) == [reference[i]]
        seen = _record_batched(engine)
        again = engine.submit(prompts[0], max_tokens=MAX)
        while not again.done:
            engine.step()
        stats = engine.stats()
    assert again.stats.cached_tokens == len(prompts[0]) - 1 and again.output == reference[0]
    assert stats["restored_tokens"] == len(prompts[0]) - 1 and stats["prompt_cache_entries"] >= 2
    single, _ = _single_proposals(tiny_target, attentive, prompts[0], 3, MAX)
    _same_where_both_drafted(seen[again], single, 0)
    with _engine(tiny_target, n_seq=1, cache_mib=0) as engine:
        for i in (0, 3, 0):
            out = engine.submit(prompts[i], max_tokens=MAX)
            while not out.done:
                engine.step()
        shared = next(j for j, (a, b) in enumerate(zip(prompts[0], prompts[3])) if a != b)  # (the BOS token)
        assert out.stats.cached_tokens == shared < 3 and out.output == reference[0]
        assert engine.stats()["prompt_cache_entries"] == 0
    with pytest.raises(ValueError, match="cache_mib"):
        _engine(tiny_target, cache_mib=-1)


def test_prompt_cache_limits_and_lookup():
    from llama_dflash.batched.prompt_cache import PromptCache

    cache = PromptCache(1000)
    buf = bytearray(300)
    cache.put([1, 2, 3, 4], buf)
    cache.put([1, 2, 9, 9, 9], buf)
    entry, n = cache.best([1, 2, 3, 4, 5])
    assert n == 4 and list(entry.tokens) == [1, 2, 3, 4]
    cache.put([1, 2, 3, 4, 5, 6], buf)  # supersedes its own prefix [1, 2, 3, 4]
    assert len(cache) == 2
    cache.put([7, 7], buf)
    cache.put([8, 8], buf)  # over 1000 bytes: the least recently used ([1, 2, 9, 9, 9]) goes
    assert len(cache) == 3 and cache.best([1, 2, 9])[1] == 2 and cache.nbytes <= 1000
    assert cache.best([5])[0] is None
