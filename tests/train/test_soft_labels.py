"""Distillation on the target's distribution: the top-k log-probabilities recomputed from the
cached inputs of the target's last layers match a full forward pass, resume after an
interruption, reach the batch behind each label, and enter the loss with the --distill weight."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from llama_dflash.train.data import SOFT_IDS_FILE, SOFT_LOGP_FILE, FeatureCache
from llama_dflash.train.dataset import MixConfig, build_mixed_cache
from llama_dflash.train.model import DraftModel
from llama_dflash.train.soft_labels import add_soft_labels
from llama_dflash.train.torchgen import TorchTarget
from llama_dflash.train.trainer import block_loss, make_batch
from llama_dflash.writer import DraftShape

LAYERS = [1, 3]  # the tiny target has 4 layers: the deepest tap leaves one layer to recompute


def _cfg(tokens):
    return MixConfig(answer_tokens=tokens, max_new_chat=8, max_new_raw=6, max_new_seed=6, seed_samples=1,
                     sampled_every=1, eval_fraction=0.3, eval_seqs=2, n_seq=3, n_ctx_seq=256,
                     topics=("bees", "cats", "rain", "ships"), builtin_prompts=10)


@pytest.fixture(scope="module")
def mix_root(tmp_path_factory, tiny_target):
    import textwrap

    root = tmp_path_factory.mktemp("soft")
    lib = root / "stdlib"
    lib.mkdir()
    (lib / "alpha.py").write_text(textwrap.dedent('''
        def add_numbers(a, b):
            """Add two numbers and return their sum."""
            return a + b
    '''))
    data = str(root / "mix")
    build_mixed_cache(data, tiny_target, _cfg(60), target_layers=LAYERS, wrap=lambda p: p, n_threads=1,
                      progress=False, stdlib_root=str(lib))
    return data


def _reference(target: TorchTarget, tokens: np.ndarray) -> torch.Tensor:
    """log-softmax of a full causal forward pass of the target over tokens."""
    n = len(tokens)
    t = torch.as_tensor(tokens, dtype=torch.long)[None]
    mask = torch.ones(n, n, dtype=torch.bool).tril()[None]
    logits, _ = target.forward(t, torch.arange(n)[None], mask)
    return torch.log_softmax(logits[0], dim=-1)


def test_logits_from_a_layer_input_match_the_full_forward(tiny_target):
    t = TorchTarget(tiny_target)
    toks = torch.arange(3, 15)[None]
    n = toks.shape[1]
    mask = torch.ones(n, n, dtype=torch.bool).tril()[None]
    full, taps = t.forward(toks, torch.arange(n)[None], mask, taps=[3])
    np.testing.assert_allclose(t.logits_from_layer(taps[0][0], 3).numpy(), full[0].numpy(), rtol=1e-4, atol=1e-4)
    rows = torch.tensor([2, 5, 11])
    np.testing.assert_allclose(t.logits_from_layer(taps[0][0], 3, rows).numpy(), full[0, rows].numpy(),
                               rtol=1e-4, atol=1e-4)


def test_soft_labels_are_the_targets_top_k_and_resume(mix_root, tiny_target):
    assert FeatureCache(mix_root).soft is None  # nothing computed yet
    st = add_soft_labels(mix_root, tiny_target, top_k=4, progress=False)
    c = FeatureCache(mix_root)
    assert c.soft is not None and c.soft[0].shape == (c.n_rows, 4)
    assert st["rows"] == sum(len(s.tokens) - max(0, s.prompt_len - 1) - 1 for s in c.seqs)
    # float16 features vs llama.cpp's own rows: the recomputed top-1 is the recorded greedy choice
    assert st["agree"] >= 0.95, st
    target = TorchTarget(tiny_target)
    ids, logp = c.soft
    for i in (0, 3, len(c.seqs) - 1):
        s = c.seqs[i]
        a, n = max(0, s.prompt_len - 1), len(s.tokens)
        rows = slice(s.offset + a, s.offset + n - 1)
        ref = _reference(target, s.tokens)[a:n - 1]
        got = torch.from_numpy(np.array(logp[rows], dtype=np.float32))
        # the stored log-probabilities are the reference's at the stored ids, best first
        want = ref.gather(-1, torch.from_numpy(np.array(ids[rows], dtype=np.int64)))
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=2e-2)
        assert (np.diff(got.numpy(), axis=-1) <= 1e-3).all()
        assert (ids[s.offset:s.offset + a] == -1).all() and (ids[s.offset + n - 1] == -1).all()  # no label there
    before = (np.array(ids), np.array(logp))

    # an interruption in the middle of a sequence: the partial sequence is recomputed, the rest kept
    cut = c.seqs[len(c.seqs) // 2].offset + 2
    for name, size in ((SOFT_IDS_FILE, 4), (SOFT_LOGP_FILE, 2)):
        with open(os.path.join(mix_root, name), "r+b") as f:
            f.truncate(cut * 4 * size)
    assert FeatureCache(mix_root).soft is None
    st2 = add_soft_labels(mix_root, tiny_target, top_k=4, progress=False)
    assert 0 < st2["rows"] < st["rows"]
    c2 = FeatureCache(mix_root)
    np.testing.assert_array_equal(np.array(c2.soft[0]), before[0])
    np.testing.assert_array_equal(np.array(c2.soft[1]), before[1])
    assert add_soft_labels(mix_root, tiny_target, top_k=4, progress=False)["rows"] == 0  # nothing left
    # another top-k starts over
    assert add_soft_labels(mix_root, tiny_target, top_k=2, progress=False)["rows"] == st["rows"]
    assert FeatureCache(mix_root).soft[0].shape == (c.n_rows, 2)
    add_soft_labels(mix_root, tiny_target, top_k=4, progress=False)


def test_batches_carry_the_distribution_behind_each_label(mix_root, tiny_target):
    add_soft_labels(mix_root, tiny_target, top_k=4, progress=False)
    c = FeatureCache(mix_root)
    ids, logp = c.soft
    idx = [i for i, s in enumerate(c.seqs) if len(s.tokens) - s.prompt_len >= 4][:3]
    for anchor_first in (False, True):
        shift = 1 if anchor_first else 0
        b = make_batch(c, idx, 4, 6, 3, np.random.default_rng(0), anchor_first=anchor_first, soft=True)
        assert len(b) == 7
        _, _, _, anc, labels, sid, slp = b
        assert sid.shape == labels.shape + (4,) and slp.dtype == torch.float32
        n_checked = 0
        for n, i in enumerate(idx):
            off = c.seqs[i].offset
            for m, a in enumerate(anc[n].tolist()):
                for j in range(4):
                    if labels[n, m, j] < 0:
                        assert (sid[n, m, j] == -1).all()
                        continue
                    row = off + a + j + shift - 1  # the row whose next token is the label
                    assert sid[n, m, j].tolist() == ids[row].tolist()
                    np.testing.assert_array_equal(slp[n, m, j].numpy(), logp[row].astype(np.float32))
                    n_checked += 1
        assert n_checked > 0
        assert len(make_batch(c, idx, 4, 6, 3, np.random.default_rng(0), anchor_first=anchor_first)) == 5


def _tiny_draft(vocab=None):
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((32, 16)).astype(np.float32)
    shape = DraftShape(n_embd=16, n_layer=1, n_head=2, n_head_kv=1, n_ff=32, block_size=3, target_layers=(1,),
                       rms_eps=1e-6, context_length=64)
    torch.manual_seed(0)
    return DraftModel(shape, emb, emb, vocab=vocab)


def _batch(labels, soft_ids, soft_logp):
    N, M, B = labels.shape
    feats = torch.randn(N, 6, 16, generator=torch.Generator().manual_seed(1))
    valid = torch.ones(N, 6, dtype=torch.bool)
    btoks = torch.full((N, M, B), 31, dtype=torch.long)
    btoks[..., 0] = 5
    anc = torch.full((N, M), 3, dtype=torch.long)
    return feats, valid, btoks, anc, labels, soft_ids, soft_logp


def test_distill_weight_mixes_label_and_distribution():
    m = _tiny_draft()
    labels = torch.tensor([[[-100, 7, 9]]])
    one_hot_ids = torch.tensor([[[[-1, -1], [7, 2], [9, 4]]]])
    one_hot_lp = torch.tensor([[[[0.0, 0.0], [0.0, -30.0], [0.0, -30.0]]]])
    hard = block_loss(m, _batch(labels, one_hot_ids, one_hot_lp)[:5], 2.0)[0]
    # a distribution all on the label is the label: any weight gives the same loss
    for w in (0.0, 0.5, 1.0):
        got = block_loss(m, _batch(labels, one_hot_ids, one_hot_lp), 2.0, distill=w)[0]
        assert float(got.detach()) == pytest.approx(float(hard.detach()), rel=1e-5)
    # a distribution that puts most of its mass elsewhere changes the loss in proportion to the weight
    other_lp = torch.tensor([[[[0.0, 0.0], [-3.0, -0.05], [-3.0, -0.05]]]])
    l0 = float(block_loss(m, _batch(labels, one_hot_ids, other_lp), 2.0, distill=0.0)[0])
    l5 = float(block_loss(m, _batch(labels, one_hot_ids, other_lp), 2.0, distill=0.5)[0])
    l1 = float(block_loss(m, _batch(labels, one_hot_ids, other_lp), 2.0, distill=1.0)[0])
    assert l0 == pytest.approx(float(hard), rel=1e-5) and l1 != pytest.approx(l0, rel=1e-3)
    assert l5 == pytest.approx((l0 + l1) / 2, rel=1e-5)
    # training on it moves the draft toward the distribution's favourite, not the label
    opt = torch.optim.Adam(m.parameters(), lr=5e-2)
    batch = _batch(labels, one_hot_ids, other_lp)
    for _ in range(60):
        opt.zero_grad()
        block_loss(m, batch, 2.0, distill=1.0)[0].backward()
        opt.step()
    with torch.no_grad():
        hid = m(*batch[:4], return_hidden=True)[0, 0]
        assert m.logits(hid[1]).argmax().item() == 2 and m.logits(hid[2]).argmax().item() == 4


def test_distribution_outside_a_reduced_head_is_renormalised():
    m = _tiny_draft(vocab=np.array([2, 7, 9, 20, 31]))
    labels = torch.tensor([[[-100, 7, 9]]])
    # 4 is not in the head: slot 2's distribution is all on 9 once renormalised; slot 1 keeps 7 vs 2
    ids = torch.tensor([[[[-1, -1], [7, 2], [4, 9]]]])
    lp = torch.tensor([[[[0.0, 0.0], [-0.1, -2.4], [-0.01, -5.0]]]])
    one_hot = torch.tensor([[[[0.0, 0.0], [0.0, -30.0], [0.0, -30.0]]]])
    ids_hot = torch.tensor([[[[-1, -1], [7, 2], [9, 4]]]])
    b = _batch(labels, ids, lp)
    l_soft = float(block_loss(m, b, 2.0, distill=1.0)[0])
    assert np.isfinite(l_soft)
    # slot 2 alone: the same as a one-hot on 9
    lab2 = torch.tensor([[[-100, -100, 9]]])
    a = float(block_loss(m, _batch(lab2, ids, lp), 2.0, distill=1.0)[0])
    h = float(block_loss(m, _batch(lab2, ids_hot, one_hot), 2.0, distill=1.0)[0])
    assert a == pytest.approx(h, rel=1e-5)


def _train(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "llama_dflash.cli", "train", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_cli_distill_end_to_end(tiny_target, tmp_path):
    args = ["--model", tiny_target, "--output", str(tmp_path / "d.gguf"), "--workdir", str(tmp_path / "w"),
            "--data-tokens", "120", "--eval-seqs", "2", "--n-seq", "4", "--threads", "1", "--no-progress",
            "--steps", "6", "--batch-size", "2", "--anchors-per-seq", "4", "--block-size", "4", "--eval-prompts", "0",
            "--algorithm", "dspark", "--train-vocab", "64", "--distill", "0.5", "--soft-top-k", "3"]
    r = _train(*args)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    c = FeatureCache(str(tmp_path / "w" / "mix"))
    assert c.soft is not None and c.soft[0].shape == (c.n_rows, 3)
    assert rep["distill"]["weight"] == 0.5 and rep["distill"]["top_k"] == 3
    assert rep["distill"]["computed"]["rows"] > 0 and rep["distill"]["computed"]["agree"] >= 0.9
    assert rep["train"]["steps"] == 6
    r2 = _train(*args)  # resumes: the distributions are there, nothing is recomputed
    assert r2.returncode == 0, r2.stderr
    assert json.loads(r2.stdout)["distill"]["computed"] is None
    # --data-only makes them with the data, for runs that share one data directory
    r3 = _train(*[a if a != str(tmp_path / "w") else str(tmp_path / "w2") for a in args], "--data-only")
    assert r3.returncode == 0, r3.stderr
    c3 = FeatureCache(str(tmp_path / "w2" / "mix"))
    assert c3.soft is not None and c3.soft[0].shape == (c3.n_rows, 3)
    assert os.path.isfile(tmp_path / "d.gguf")


@pytest.mark.parametrize("bad, msg", [(["--distill", "1.5"], "--distill"), (["--distill", "-0.1"], "--distill"),
                                      (["--distill", "0.5", "--soft-top-k", "0"], "--soft-top-k")])
def test_cli_refuses_bad_distill_options(tiny_target, tmp_path, bad, msg):
    r = _train("--model", tiny_target, "--output", str(tmp_path / "d.gguf"), *bad, timeout=120)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr


def test_train_refuses_distill_without_distributions(tiny_target, tmp_path):
    from llama_dflash.train.data import build_cache
    from llama_dflash.train.model import load_target_head
    from llama_dflash.train.trainer import TrainConfig, train

    cache = build_cache(str(tmp_path / "d"), tiny_target, ["the cat is", "a b c"], target_layers=LAYERS,
                        max_new_tokens=8, progress=False)
    emb, head = load_target_head(tiny_target)
    m = DraftModel(DraftShape(n_embd=64, n_layer=1, n_head=4, n_head_kv=2, block_size=4,
                              target_layers=LAYERS), emb, head)
    with pytest.raises(ValueError, match="add_soft_labels"):  # not a silent run on the labels alone
        train(m, cache, TrainConfig(steps=2, distill=0.5), mask_id=3, train_ids=[0, 1], progress=False)
    add_soft_labels(cache.root, tiny_target, top_k=2, progress=False)
    out = train(m, FeatureCache(cache.root), TrainConfig(steps=2, distill=0.5), mask_id=3, train_ids=[0, 1],
                progress=False)
    assert out["steps"] == 2
