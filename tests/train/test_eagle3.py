"""EAGLE-3 training (`--algorithm eagle3`): the training-time test computes what llama.cpp's eagle3
graph computes when its C++ driver drafts, the batches label what greedy verification accepts,
training learns, and the exported GGUF drafts in llama.cpp exactly what the PyTorch head drafts."""

import json
import os

import numpy as np
import pytest
import torch

from llama_dflash.train.ar_export import export_ar, load_ar_weights, parity_ar
from llama_dflash.train.data import GREEDY_FILE, FeatureCache, build_cache
from llama_dflash.train.eagle3 import Eagle3Model, Eagle3Shape
from llama_dflash.train.model import load_target_head
from llama_dflash.train.objectives import Eagle3Objective, ar_proxy_acceptance, make_ttt_batch
from llama_dflash.train.trainer import TrainConfig, train

LAYERS = [1, 2, 3]


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # a busy 2-core machine: more threads only contend
    yield
    torch.set_num_threads(n)


def _head(target, *, vocab=None, seed=0, **kw):
    torch.manual_seed(seed)
    emb, head = load_target_head(target)
    shape = Eagle3Shape(n_embd=64, n_head=4, n_head_kv=2, n_ff=128, target_layers=LAYERS, **kw)
    return Eagle3Model(shape, emb, head, vocab=vocab)


def _perturb(m, scale=0.05, seed=1):
    """Random weights whose argmaxes move (a fresh head's first logits are nearly flat)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        m.output_norm.weight.fill_(1.0)
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return m


@pytest.fixture(scope="module")
def cache(tiny_target, tmp_path_factory):
    return build_cache(str(tmp_path_factory.mktemp("e3") / "d"), tiny_target,
                       ["the cat is on the mat", "a b c d e f", "the dog and the", "x y z w"],
                       target_layers=LAYERS, max_new_tokens=24, progress=False)


@pytest.mark.parametrize("kw", [{}, {"norm_before_residual": True, "norm_before_fc": True}])
def test_ttt_rows_are_the_runtime_chain(tiny_target, kw):
    """Step k of the training-time test at position c + k is, row for row, the k-th draft row that
    llama.cpp's driver computes from the seed at c (its own tokens fed back) -- the mask, the shifted
    pre-norm states and the RoPE positions included."""
    m = _perturb(_head(tiny_target, **kw))
    L, c, n = 24, 6, 5
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(1, L, m.shape.n_feat, generator=g)
    toks = torch.randint(0, 316, (L,), generator=g).tolist()
    drafted, states = m.chain(feats[0], toks, c, n)
    toks = toks[:c + 2] + drafted + toks[c + 2 + n:]  # the chain's own tokens are the fed ones
    outs = m.ttt(feats, torch.tensor(toks)[None], torch.ones(1, L, dtype=torch.bool), n)
    for k in range(n):
        torch.testing.assert_close(outs[k][0, c + k], states[k], rtol=1e-4, atol=1e-5)
    # rows after the chain's end see nothing of later positions (causal): changing them changes nothing
    toks2 = toks[:c + n + 1] + [(t + 1) % 316 for t in toks[c + n + 1:]]
    feats2 = feats.clone()
    feats2[0, c + n:] += 1.0
    outs2 = m.ttt(feats2, torch.tensor(toks2)[None], torch.ones(1, L, dtype=torch.bool), n)
    for k in range(n):
        torch.testing.assert_close(outs2[k][0, c + k], outs[k][0, c + k])
    # the sparse form the trainer runs: the same rows for the chosen seeds, padding included
    feats3, toks3 = torch.cat([feats, feats.flip(1)]), torch.tensor([toks, toks[::-1]])
    valid = torch.ones(2, L, dtype=torch.bool)
    valid[1, 17:] = False
    full = m.ttt(feats3, toks3, valid, n)
    seeds = torch.tensor([[0, c, 9, 13], [2, 5, c, 11]])
    out0, chains = m.ttt_chains(feats3, toks3, valid, seeds, n)
    torch.testing.assert_close(out0[valid], full[0][valid])
    for b in range(2):
        for j in range(4):
            for k in range(1, n):
                torch.testing.assert_close(chains[b, j, k - 1], full[k][b, seeds[b, j] + k], rtol=1e-4, atol=1e-5)


def _fake_cache(root, seqs, width=192):
    """A cache by hand: (tokens, prompt_len, greedy choices or None) per sequence."""
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "meta.json"), "w") as f:
        json.dump({"width": width, "n_embd": 64, "target_layers": LAYERS, "model": "x"}, f)
    off = 0
    greedy = []
    with open(os.path.join(root, "seqs.jsonl"), "w") as f:
        for toks, plen, choice in seqs:
            f.write(json.dumps({"tokens": toks, "prompt_len": plen, "offset": off}) + "\n")
            g = np.full(len(toks), -1, dtype=np.int32)
            if choice is not None:
                g[:len(choice)] = choice
            greedy.append(g)
            off += len(toks)
    np.zeros((off, width), dtype=np.float16).tofile(os.path.join(root, "features.f16"))
    np.concatenate(greedy).tofile(os.path.join(root, GREEDY_FILE))
    return FeatureCache(root)


def test_ttt_batch_labels_follow_greedy_chains(tmp_path):
    # sequence 0: greedy; sequence 1: sampled, the token at position 6 (10+6) is not the greedy choice there
    toks0 = list(range(10, 22))
    toks1 = list(range(30, 42))
    choice1 = [t + 1 for t in toks1[:-1]]
    choice1[5] = 99  # after row 5 the target would have written 99, the sample is toks1[6] = 36
    cache = _fake_cache(str(tmp_path / "c"), [(toks0, 4, None), (toks1, 3, choice1)])
    feats, tokens, valid, labels, ok = make_ttt_batch(cache, [0, 1], steps=3)
    assert tokens[0].tolist() == toks0 and valid[0].all() and feats.shape == (2, 12, 192)
    # step k at position p predicts the greedy choice after row p + 1, for every k
    assert labels[0, :10].tolist() == toks0[2:] and (labels[0, 10:] == -100).all()
    assert labels[1, 4] == 99 and labels[1, 3] == toks1[5]
    # seeds start at the row before the last prompt token: c >= plen - 2
    assert not ok[0, 0, :2].any() and ok[0, 0, 2:10].all() and not ok[0, 0, 10:].any()
    assert not ok[0, 2, :4].any() and ok[0, 2, 4:10].all()
    # sequence 1: a chain whose fed tokens include the detour (t_6 at row 5 -> fed at position 5) is unlabelled
    c_min = 1
    for k in range(3):
        for p in range(10):
            c = p - k
            crosses = c + 1 <= 5 <= p  # rows c+1..p feed t_{c+2}..t_{p+1}; row 5 feeds the sample t_6
            assert bool(ok[1, k, p]) == (c >= c_min and not crosses), (k, p)


def test_training_learns_and_llama_cpp_drafts_the_same(tiny_target, cache, tmp_path):
    from llama_dflash.train.vocab import choose_vocab, count_tokens

    counts = count_tokens(316, [cache.seqs[i].tokens for i in range(len(cache))])
    vocab = choose_vocab(counts, 40)
    m = _head(tiny_target, vocab=vocab)
    obj = Eagle3Objective(steps=3, chains=6)
    batch = obj.batch(cache, [0, 1, 2, 3], np.random.default_rng(0))
    seeds = batch[5]
    for n, i in enumerate([0, 1, 2, 3]):  # chains start in the answer (the row before its first token on)
        sq = cache.seqs[i]
        assert seeds.shape == (4, 6) and (seeds[n] >= sq.prompt_len - 2).all() and (seeds[n] <= len(sq.tokens) - 3).all()
    with torch.no_grad():
        first = float(obj.loss(m, batch)[0])
    before = ar_proxy_acceptance(m, cache, [0, 1, 2, 3], n_read=3)
    summary = train(m, cache, TrainConfig(steps=40, lr=3e-3, batch_size=4, checkpoint_every=0),
                    train_ids=[0, 1, 2, 3], progress=False, objective=obj)
    with torch.no_grad():
        assert float(obj.loss(m, batch)[0]) < 0.5 * first
    assert summary["loss_end"] < summary["loss_start"]
    after = ar_proxy_acceptance(m, cache, [0, 1, 2, 3], n_read=3)
    assert after["mean_accepted"] > before["mean_accepted"] + 0.5, (before, after)
    # exported with its own head over the 40 tokens (d2t): llama.cpp drafts the same chains
    out = export_ar(m, str(tmp_path / "e3.gguf"), target_path=tiny_target, name="t")
    seqs = [(cache.get(i)[0], cache.get(i)[1].astype(np.float32)) for i in range(3)]
    res = parity_ar(m, out, tiny_target, seqs, anchors_per_seq=5, n_read=4)
    assert res["agreement"] == 1.0 and res["slots"] == 60, res
    # and the file starts a new run from these weights
    m2 = _head(tiny_target, vocab=vocab, seed=5)
    assert load_ar_weights(m2, out) == len(m.gguf_parameters())
    for (n, a), b in zip(m.gguf_parameters().items(), m2.gguf_parameters().values()):
        torch.testing.assert_close(a.detach(), b.detach(), msg=n)


@pytest.mark.parametrize("kw", [{"vocab": None}, {"norm_before_fc": True, "norm_before_residual": True},
                                {"weight_type": "q8_0"}])
def test_random_heads_match_llama_cpp(tiny_target, cache, tmp_path, kw):
    """Chains and pre-norm states from llama.cpp's eagle3 graph (encoder, decoder, d2t) on the same
    target features, for heads whose argmaxes depend on every part of the graph."""
    from llama_dflash.train.arwriter import write_eagle3
    from llama_dflash.train.draftfile import read_draft_tensors
    from llama_dflash.train.llamacpp_ref import Eagle3Reference

    kw = dict(kw)
    wtype = kw.pop("weight_type", "f32")
    vocab = np.arange(0, 316, 3) if "vocab" not in kw else kw.pop("vocab")
    m = _perturb(_head(tiny_target, vocab=vocab, **kw), seed=7)
    path = write_eagle3(str(tmp_path / "r.gguf"), m.shape, m.export_weights(), tokenizer_from=tiny_target,
                        weight_type=wtype)
    if wtype != "f32":  # the PyTorch side runs the rounded weights llama.cpp runs
        t = read_draft_tensors(path)
        with torch.no_grad():
            for n, p in m.gguf_parameters().items():
                p.copy_(torch.from_numpy(np.array(t[n])))
            m.head.copy_(torch.from_numpy(np.array(t["output.weight"])))
    toks, feats, _ = cache.get(0)
    feats = feats.astype(np.float32)
    f = torch.from_numpy(feats)
    with Eagle3Reference(tiny_target, path, n_ctx=128) as ref:
        assert ref.layers == LAYERS
        for c in (0, 3, 9, len(toks) - 3):
            a, ha = ref.chain(feats, toks, c, 5)
            b, hb = m.chain(f, toks, c, 5)
            assert a == b
            tol = 2e-3 if wtype == "f32" else 5e-2  # llama.cpp multiplies q8_0 weights by 8-bit activations
            np.testing.assert_allclose(ha, hb.numpy(), rtol=tol, atol=tol * float(np.abs(ha).max()))
