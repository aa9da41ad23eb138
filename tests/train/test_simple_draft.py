"""`--algorithm simple`: a small llama distilled from the target for llama.cpp's draft-simple. The
PyTorch model computes llama.cpp's llama graph, starts as a shallow copy of the target, learns,
and the exported GGUF proposes what the PyTorch model proposes."""

import numpy as np
import pytest
import torch

from llama_dflash.inspect import read_gguf
from llama_dflash.train.ar_export import export_ar, parity_ar
from llama_dflash.train.data import build_cache
from llama_dflash.train.llamacpp_ref import SimpleReference
from llama_dflash.train.model import load_target_head
from llama_dflash.train.objectives import SimpleObjective, ar_proxy_acceptance, make_lm_batch
from llama_dflash.train.simple import SimpleDraft, init_from_target, simple_shape_from_target, spread_layers
from llama_dflash.train.trainer import TrainConfig, train


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _draft(target, n_layer, vocab=None, copy=True, seed=0):
    torch.manual_seed(seed)
    emb, head = load_target_head(target)
    info = read_gguf(target)
    m = SimpleDraft(simple_shape_from_target(info, n_layer), emb, head, vocab=vocab)
    if copy:
        init_from_target(m, target, spread_layers(info.n_layer, n_layer))
    return m


def test_spread_layers():
    assert spread_layers(30, 2) == [0, 29] and spread_layers(30, 4) == [0, 10, 19, 29]
    assert spread_layers(4, 8) == [0, 1, 2, 3] and spread_layers(30, 1) == [29]


def test_a_full_copy_is_the_target(tiny_target):
    """With every target layer copied the draft is the target: llama.cpp's own greedy tokens after
    every row of a text equal the PyTorch draft's (the rope order, GQA and norms are llama.cpp's)."""
    m = _draft(tiny_target, read_gguf(tiny_target).n_layer)
    toks = [1] + list(range(280, 300)) + [300, 266, 290]
    with SimpleReference(tiny_target, n_ctx=64) as ref:
        want = ref.argmax(toks)
    with torch.no_grad():
        t = torch.tensor(toks)[None]
        got = m.draft_ids(m(t, torch.ones_like(t, dtype=torch.bool))[0]).tolist()
    assert got == want


def test_training_learns_and_the_export_drafts_the_same(tiny_target, tmp_path):
    cache = build_cache(str(tmp_path / "d"), tiny_target, ["the cat is on the mat", "a b c d e f", "the dog and the"],
                        target_layers=[1, 3], max_new_tokens=24, progress=False)
    # batches: the target's greedy choice after every answer row (the row before the answer included)
    toks, valid, labels = make_lm_batch(cache, [0, 1])
    s0 = cache.seqs[0]
    L0 = len(s0.tokens)
    assert labels[0, s0.prompt_len - 1:L0 - 1].tolist() == s0.tokens[s0.prompt_len:].tolist()
    assert (labels[0, :s0.prompt_len - 1] == -100).all() and (labels[0, L0 - 1:] == -100).all()
    m = _draft(tiny_target, 1, vocab=np.arange(0, 316, 2), copy=False)
    obj = SimpleObjective()
    before = ar_proxy_acceptance(m, cache, [0, 1, 2], n_read=3)
    summary = train(m, cache, TrainConfig(steps=40, lr=3e-3, batch_size=3, checkpoint_every=0),
                    train_ids=[0, 1, 2], progress=False, objective=obj)
    assert summary["loss_end"] < 0.5 * summary["loss_start"]
    after = ar_proxy_acceptance(m, cache, [0, 1, 2], n_read=3)
    assert after["mean_accepted"] > before["mean_accepted"] + 0.5, (before, after)
    # the export keeps the whole vocabulary (draft-simple needs the target's) and parity is exact
    out = export_ar(m, str(tmp_path / "s.gguf"), target_path=tiny_target, name="s", weight_type="f16")
    info = read_gguf(out)
    assert info.architecture == "llama" and info.n_vocab == 316 and info.n_layer == 1
    assert info.tokens == read_gguf(tiny_target).tokens
    from llama_dflash.train.draftfile import read_draft_tensors

    t = read_draft_tensors(out)
    with torch.no_grad():  # the f16 file's weights on the PyTorch side too
        for n, p in m.gguf_parameters().items():
            p.copy_(torch.from_numpy(np.array(t[n])))
    seqs = [(cache.get(i)[0], cache.get(i)[1]) for i in range(3)]
    res = parity_ar(m, out, tiny_target, seqs)
    assert res["agreement"] >= 0.99 and res["slots"] > 60, res
