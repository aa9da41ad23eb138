"""Trained EAGLE-3 and draft-simple files through llama.cpp's own tools (issue 44 item 2):

* the Hugging Face export, converted back by the vendored `convert_hf_to_gguf.py --target-model-dir`,
  holds the same tensors and keys as the direct GGUF export, and drafts the same tokens:
  `llama-speculative-simple` counts the same accepted and drafted tokens, step for step;
* the C++ driver's EAGLE-3 steps equal a PyTorch simulation of its loop with the trained head
  (seed at the row before the last verified token, the deferred boundary, own tokens fed back):
  the function trained is the function llama.cpp runs.

Drafts trained briefly on a tiny random target, so acceptance lies strictly between 0 and 1.
"""

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: hf_converter

from hf_converter import convert, hf_converter  # noqa: E402,F401  (fixture)
from llama_dflash.train.ar_eval import driver_acceptance, driver_run, find_driver  # noqa: E402
from llama_dflash.train.ar_export import export_ar  # noqa: E402
from llama_dflash.train.data import build_cache, extract_features  # noqa: E402
from llama_dflash.train.eagle3 import Eagle3Model, Eagle3Shape  # noqa: E402
from llama_dflash.train.hf_export import export_hf  # noqa: E402
from llama_dflash.train.hf_target import write_target_dir  # noqa: E402
from llama_dflash.train.model import load_target_head  # noqa: E402
from llama_dflash.train.objectives import Eagle3Objective, SimpleObjective  # noqa: E402
from llama_dflash.train.trainer import TrainConfig, train  # noqa: E402

LAYERS = [1, 2, 3]
PROMPTS = ["the cat is on the mat", "a b c d e f", "the dog and the", "x y z w", "is the house of the",
           "and the big dog", "of the cat and", "the mat is"]
TEST_PROMPTS = ["the quick brown fox and the lazy dog is", "a cat and a dog of the"]
needs_driver = pytest.mark.skipif(find_driver() is None, reason="llama-speculative-simple not built "
                                  "(bench/build_cpp_reference.sh, or set LLAMA_SPECULATIVE_SIMPLE)")


@pytest.fixture(scope="module")
def drafts(tiny_target, tmp_path_factory):
    """{"eagle3": path, "simple": path, "model": the trained Eagle3Model}: a few steps of training each."""
    from llama_dflash.inspect import read_gguf
    from llama_dflash.train.simple import SimpleDraft, init_from_target, simple_shape_from_target
    from llama_dflash.train.vocab import choose_vocab, count_tokens

    d = tmp_path_factory.mktemp("ar")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cache = build_cache(str(d / "data"), tiny_target, PROMPTS, target_layers=LAYERS, max_new_tokens=32,
                            progress=False)
        ids = list(range(len(cache)))
        torch.manual_seed(0)
        emb, head = load_target_head(tiny_target)
        vocab = choose_vocab(count_tokens(316, [s.tokens for s in cache.seqs]), 96, [2])
        e3 = Eagle3Model(Eagle3Shape(n_embd=64, n_head=4, n_head_kv=2, n_ff=128, target_layers=LAYERS), emb, head,
                         vocab=vocab)
        train(e3, cache, TrainConfig(steps=25, lr=3e-3, batch_size=4, checkpoint_every=0), train_ids=ids,
              progress=False, objective=Eagle3Objective(steps=3, chains=8))
        simple = SimpleDraft(simple_shape_from_target(read_gguf(tiny_target), 1), emb, head)
        init_from_target(simple, tiny_target, [3])
        train(simple, cache, TrainConfig(steps=10, lr=1e-3, batch_size=4, checkpoint_every=0), train_ids=ids,
              progress=False, objective=SimpleObjective())
    finally:
        torch.set_num_threads(n)
    return {"eagle3": export_ar(e3.eval(), str(d / "e3.gguf"), target_path=tiny_target, name="e3"),
            "simple": export_ar(simple.eval(), str(d / "simple.gguf"), target_path=tiny_target, name="simple"),
            "model": e3}


@pytest.fixture(scope="module")
def target_dir(tiny_target, tmp_path_factory):
    return write_target_dir(tiny_target, str(tmp_path_factory.mktemp("tdir") / "target"))


@pytest.fixture(scope="module", params=["eagle3", "simple"])
def converted(request, drafts, target_dir, hf_converter, tmp_path_factory):  # noqa: F811
    d = tmp_path_factory.mktemp("conv")
    cfg = export_hf(drafts[request.param], str(d / "hf"))
    out = convert(hf_converter, str(d / "hf"), target_dir, str(d / "converted.gguf"))
    return request.param, drafts[request.param], out, cfg


def _reader(path):
    from gguf import GGUFReader

    return GGUFReader(path, "r")


def test_same_tensors_and_keys(converted):
    kind, original, conv, cfg = converted
    assert cfg["architectures"] == (["LlamaForCausalLMEagle3"] if kind == "eagle3" else ["LlamaForCausalLM"])
    a, b = _reader(original), _reader(conv)
    ta, tb = {t.name: np.array(t.data) for t in a.tensors}, {t.name: np.array(t.data) for t in b.tensors}
    assert set(ta) == set(tb)
    for k in ta:
        np.testing.assert_array_equal(ta[k], tb[k], err_msg=k)
    arch = "eagle3" if kind == "eagle3" else "llama"
    keys = {k for k in a.fields if k.startswith(arch + ".")}
    # the converter writes head sizes for llama too; everything we write it writes the same
    assert keys <= set(b.fields)
    for k in keys:
        assert a.fields[k].contents() == b.fields[k].contents(), k
    for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
              "tokenizer.ggml.add_bos_token"):
        assert a.fields[k].contents() == b.fields[k].contents(), k


@needs_driver
@pytest.mark.parametrize("n_max", [1, 4])
def test_converted_drafts_the_same(converted, tiny_target, n_max):
    kind, original, conv, _ = converted
    runs = []
    for draft in (original, conv):
        steps = [driver_run(tiny_target, draft, p, n_predict=40, n_max=n_max, threads=1, n_ctx=256).steps
                 for p in TEST_PROMPTS]
        runs.append(steps)
    assert runs[0] == runs[1]
    res = driver_acceptance(tiny_target, original, TEST_PROMPTS, n_predict=40, n_max=n_max, threads=1, n_ctx=256)
    assert res["spec_type"] == ("draft-eagle3" if kind == "eagle3" else "draft-simple")
    assert 0 < res["accepted"] < res["drafted"], res


def _simulate(model, target, prompt_text, *, n_predict, n_max, n_ctx=256):
    """The C++ driver's greedy loop (examples/speculative-simple) with the PyTorch head drafting:
    (accepted, drafted) per verification step."""
    from llama_dflash._llama import Model
    from llama_dflash.config import TargetConfig
    from llama_dflash.engine import OrdinaryDecoding
    from llama_dflash.target import TargetContext

    cfg = TargetConfig(target, n_ctx=n_ctx, n_threads=1)
    with OrdinaryDecoding(cfg) as o:
        prompt = o.tokenize(prompt_text)
        gen = o.generate(prompt, n_predict + n_max + 2).tokens
    seq = list(prompt) + list(gen)
    m = Model(target)
    tc = TargetContext(m, cfg, extract_layers=LAYERS)
    try:
        feats = torch.from_numpy(np.array(extract_features(tc, seq), dtype=np.float32))
        eog = set(m.eog_tokens())
    finally:
        tc.close()
        m.close()
    steps = []
    n_past, produced = len(prompt) - 1, 0
    while True:
        cap = max(0, min(n_ctx - n_past - 2, n_predict - produced - 1))
        k = n_max if cap == 0 else min(n_max, cap)  # a cap of 0 reaches llama.cpp as "no limit"
        drafts = model.chain(feats, seq, n_past - 1, k)[0]  # seed (id_last, g) at the row before id_last
        acc = 0
        while acc < k and n_past + 1 + acc < len(seq) and drafts[acc] == seq[n_past + 1 + acc]:
            acc += 1
        steps.append((acc, k))
        ids = seq[n_past + 1:n_past + 2 + acc]
        produced += len(ids)
        n_past += len(ids)
        if any(t in eog for t in ids) or produced > n_predict:
            return steps


@needs_driver
@pytest.mark.parametrize("n_max", [1, 3, 5])
def test_cpp_driver_steps_are_the_pytorch_head(drafts, tiny_target, n_max):
    model = drafts["model"]
    for prompt in TEST_PROMPTS:
        want = _simulate(model, tiny_target, prompt, n_predict=40, n_max=n_max)
        got = driver_run(tiny_target, drafts["eagle3"], prompt, n_predict=40, n_max=n_max, threads=1, n_ctx=256).steps
        assert got == want, prompt
    assert 0 < sum(a for a, _ in got) < sum(d for _, d in got)


@needs_driver
@pytest.mark.parametrize("kind", ["eagle3", "simple"])
def test_replay_takes_the_drivers_steps(drafts, tiny_target, kind):
    """bench/heldout_drafts.py --replay: the driver's loop replayed on the target's greedy answers,
    the EAGLE-3 head or the classic draft run by llama.cpp incrementally (Eagle3Reference.propose,
    SimpleReference.propose), takes the driver's steps (up to the driver's budget edge). DSpark/DFlash
    drafts replay through the engine's own proposer, whose steps the engine's C++ parity tests
    already hold to the driver's."""
    from llama_dflash.train.replay import greedy_answers, replay_acceptance

    draft = drafts[kind]
    answers = greedy_answers(tiny_target, TEST_PROMPTS, n_predict=48, layers=[0, 1, 2, 3], n_threads=1, n_ctx=256)
    n_max, budget = 3, 40
    for prompt, answer in zip(TEST_PROMPTS, answers):
        rep = replay_acceptance(tiny_target, draft, [answer], n_max=n_max, feature_layers=[0, 1, 2, 3], n_threads=1)
        want = driver_run(tiny_target, draft, prompt, n_predict=budget, n_max=n_max, threads=1, n_ctx=256).steps
        n, kept = 0, []
        for a, d in want:  # the steps well inside the driver's budget
            if n + n_max + 1 >= budget:
                break
            kept.append((a, d))
            n += a + 1
        assert len(kept) >= 5 and rep["steps_list"][:len(kept)] == kept, prompt
        assert 1.0 <= rep["tau"] <= 1 + n_max
