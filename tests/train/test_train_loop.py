"""Training against a reduced vocabulary, held-out evaluation with early stopping and the best
checkpoint, resuming, and the PyTorch acceptance proxy."""

import os

import numpy as np
import pytest
import torch

from llama_dflash.train.data import build_cache
from llama_dflash.train.export import export_draft, parity_check
from llama_dflash.train.model import DraftModel, load_target_head
from llama_dflash.train.proxy import proxy_acceptance
from llama_dflash.train.trainer import EarlyStop, TrainConfig, block_loss, make_batch, train
from llama_dflash.train.vocab import choose_vocab, count_tokens
from llama_dflash.writer import DraftShape


@pytest.fixture(scope="module")
def cache(tiny_target, tmp_path_factory):
    return build_cache(str(tmp_path_factory.mktemp("c") / "d"), tiny_target,
                       ["the cat is on the mat", "a b c d e f", "the dog and the", "x y z w"],
                       target_layers=[1, 3], max_new_tokens=24, progress=False)


def _model(target, vocab=None, block=5, seed=0, n_layer=1):
    torch.manual_seed(seed)
    emb, head = load_target_head(target)
    shape = DraftShape(n_embd=64, n_layer=n_layer, n_head=4, n_head_kv=2, block_size=block, target_layers=[1, 3])
    return DraftModel(shape, emb, head, vocab=vocab)


def test_reduced_vocab_labels_training_and_parity(tiny_target, cache, tmp_path):
    emb, _ = load_target_head(tiny_target)
    counts = count_tokens(len(emb), [cache.seqs[i].tokens for i in range(len(cache))])
    vocab = choose_vocab(counts, 24)
    m = _model(tiny_target, vocab)
    assert m.head.shape == (24, 64)
    t2d = m.head_rows(torch.arange(len(emb))).numpy()  # target id -> head row, -100 outside
    assert (t2d[vocab] == np.arange(24)).all() and (np.delete(t2d, vocab) == -100).all()
    # the batch labels are target ids; the model maps them to head rows, tokens outside ignored
    red = make_batch(cache, [0, 1, 2], 5, 4, 3, np.random.default_rng(0))
    lf = red[-1]
    lr = m.head_rows(lf).numpy()
    lf = lf.numpy()
    keep = lf >= 0
    assert (lr[keep] == np.where(t2d[lf[keep]] >= 0, t2d[lf[keep]], -100)).all() and (lr[~keep] == -100).all()
    assert (lr[keep] == -100).any() and (lr[keep] >= 0).any()  # the fixture has tokens on both sides
    with torch.no_grad():
        first = float(block_loss(m, red, 2.0)[0])
    train(m, cache, TrainConfig(steps=30, lr=3e-3, batch_size=4, anchors_per_seq=6, checkpoint_every=0),
          mask_id=3, train_ids=list(range(len(cache))), progress=False)
    with torch.no_grad():
        assert float(block_loss(m, red, 2.0)[0]) < first
    # exported with d2t, llama.cpp drafts exactly what the PyTorch model drafts
    out = export_draft(m, str(tmp_path / "r.gguf"), target_path=tiny_target, mask_token_id=3, vocab=vocab)
    seqs = [(cache.get(i)[0], cache.get(i)[1].astype(np.float32)) for i in range(2)]
    res = parity_check(m, out, tiny_target, seqs, anchors_per_seq=6, vocab=vocab)
    assert res["agreement"] >= 0.99 and res["slots"] >= 40, res


def test_early_stop_bookkeeping():
    es = EarlyStop(patience=2)
    assert es.update(10, 0.1) and es.update(20, 0.3)
    assert not es.update(30, 0.3) and not es.should_stop  # ties do not improve
    assert not es.update(40, 0.2) and es.should_stop
    assert (es.best, es.best_step) == (0.3, 20)
    again = EarlyStop.from_dict(es.to_dict(), 2)
    assert again.to_dict() == es.to_dict() and again.should_stop
    assert not EarlyStop(0).should_stop


def test_train_keeps_the_best_weights_and_stops_early(tiny_target, cache, tmp_path):
    m = _model(tiny_target)
    scores = iter([0.1, 0.5, 0.2, 0.3, 0.4, 0.9])
    snaps = []

    def evaluate(model):
        snaps.append({k: v.clone() for k, v in model.state_dict().items()})
        return {"mean_accepted": next(scores), "acceptance_per_position": [0.0]}

    ck = str(tmp_path / "ck.pt")
    s = train(m, cache, TrainConfig(steps=40, batch_size=2, anchors_per_seq=4, eval_every=5, patience=3),
              mask_id=3, train_ids=[0, 1, 2, 3], ckpt_path=ck, progress=False, evaluate=evaluate)
    assert s["stopped"] == "early stop" and s["best_step"] == 10 and len(s["evals"]) == 5
    assert abs(s["best_mean_accepted"] - 0.5) < 1e-9
    for k, v in m.state_dict().items():  # the model ends with the weights evaluated at step 10
        assert torch.equal(v, snaps[1][k]), k
    assert os.path.isfile(str(tmp_path / "ck.best.pt"))
    # a resumed run remembers it stopped and restores the best weights
    m2 = _model(tiny_target, seed=1)
    s2 = train(m2, cache, TrainConfig(steps=40, batch_size=2, anchors_per_seq=4, eval_every=5, patience=3),
               mask_id=3, train_ids=[0, 1, 2, 3], ckpt_path=ck, progress=False, evaluate=evaluate)
    assert s2["stopped"] == "early stop" and s2["best_step"] == 10
    for k, v in m2.state_dict().items():
        assert torch.equal(v, snaps[1][k]), k


def test_resume_continues_from_the_checkpoint(tiny_target, cache, tmp_path):
    ck = str(tmp_path / "ck.pt")
    cfg = dict(batch_size=2, anchors_per_seq=4, checkpoint_every=3, seed=0)
    a = _model(tiny_target)
    train(a, cache, TrainConfig(steps=6, **cfg), mask_id=3, train_ids=[0, 1, 2, 3], ckpt_path=ck, progress=False)
    assert torch.load(ck, weights_only=False)["step"] == 6
    s = train(_model(tiny_target, seed=5), cache, TrainConfig(steps=9, **cfg), mask_id=3, train_ids=[0, 1, 2, 3],
              ckpt_path=ck, progress=False)
    assert torch.load(ck, weights_only=False)["step"] == 9 and s["steps"] == 9


def test_a_checkpoint_of_another_draft_is_refused_naming_what_differs(tiny_target, cache, tmp_path):
    ck = str(tmp_path / "ck.pt")
    cfg = dict(batch_size=2, anchors_per_seq=4, checkpoint_every=3, seed=0)
    train(_model(tiny_target), cache, TrainConfig(steps=3, **cfg), mask_id=3, train_ids=[0, 1, 2, 3], ckpt_path=ck,
          progress=False)
    with pytest.raises(ValueError, match=r"ck.pt holds the checkpoint of another draft \(layers\.1\..* is missing"):
        train(_model(tiny_target, n_layer=2), cache, TrainConfig(steps=6, **cfg), mask_id=3, train_ids=[0, 1, 2, 3],
              ckpt_path=ck, progress=False)
    assert torch.load(ck, weights_only=False)["step"] == 3  # left as it was


def test_time_limit_stops_and_is_resumable(tiny_target, cache, tmp_path):
    ck = str(tmp_path / "ck.pt")
    s = train(_model(tiny_target), cache, TrainConfig(steps=10_000, batch_size=2, anchors_per_seq=4, max_seconds=0.5),
              mask_id=3, train_ids=[0, 1, 2, 3], ckpt_path=ck, progress=False)
    assert s["stopped"] == "time limit"
    ckd = torch.load(ck, weights_only=False)
    assert 0 < ckd["step"] < 10_000 and ckd["seconds"] >= 0.5


def test_proxy_is_the_cumulative_match_of_the_greedy_chain(tiny_target, cache, monkeypatch):
    """With a chain that is right at every slot the proxy gives 1 at every position; right only at
    the first slot: 1, 0, 0 (a later right slot after a wrong one does not count)."""
    m = _model(tiny_target)
    seqs = {i: torch.as_tensor(cache.get(i)[0]) for i in (0, 1)}
    state = {"mode": "right", "true": []}
    orig_forward = DraftModel.forward

    def spy_forward(self, features, ctx_valid, block_tokens, anchors, return_hidden=False):
        a = anchors[0]
        t = next(t for t in seqs.values() if len(t) == features.shape[1] and torch.equal(t[a], block_tokens[0, :, 0]))
        true = t[a[:, None] + 1 + torch.arange(3)]
        if state["mode"] != "right":
            true = torch.cat([true[:, :1], true[:, 1:2] + 1, true[:, 2:]], -1)  # slot 1 wrong, slot 2 right
        state["true"].append(true)
        return orig_forward(self, features, ctx_valid, block_tokens, anchors, return_hidden)

    monkeypatch.setattr(DraftModel, "forward", spy_forward)
    monkeypatch.setattr(DraftModel, "greedy_chain", lambda self, hid, at, vocab=None: (state["true"].pop(0), None, None))
    r = proxy_acceptance(m, cache, [0, 1], mask_id=3, n_read=3)
    assert r["acceptance_per_position"] == [1.0, 1.0, 1.0] and r["mean_accepted"] == 3.0 and r["anchors"] > 0
    state["mode"] = "first only"
    r = proxy_acceptance(m, cache, [0, 1], mask_id=3, n_read=3)
    assert r["acceptance_per_position"] == [1.0, 0.0, 0.0]


def test_time_limited_schedule_warms_up_for_its_share_of_the_time():
    from llama_dflash.train.trainer import _lr_at

    # --steps far beyond what --train-minutes allows: warm-up must not wait for 5% of the steps
    cfg = TrainConfig(steps=20_000, lr=1e-3, warmup=0.05, max_seconds=600.0)
    assert _lr_at(10, cfg, seconds=5.0) < 0.2e-3  # still warming up early on
    assert _lr_at(100, cfg, seconds=60.0) > 0.9e-3  # 10% of the time gone: at the peak (cosine barely started)
    assert _lr_at(200, cfg, seconds=600.0) == pytest.approx(1e-4)  # ends at the low rate
    # without a time limit the step count alone decides, as before
    plain = TrainConfig(steps=1000, lr=1e-3, warmup=0.05)
    assert _lr_at(24, plain) == pytest.approx(0.5e-3)
    assert _lr_at(49, plain) == pytest.approx(1e-3, rel=1e-4)


def test_batches_gathered_from_device_resident_features_equal_host_batches(tiny_target, tmp_path):
    """`FeatureCache.to_device` keeps the rows in one tensor and make_batch gathers from it: the same
    batch as the host path (here the tensor sits on the CPU; on CUDA it is the same indexing)."""
    from llama_dflash.train.data import FeatureCache

    c = build_cache(str(tmp_path / "d"), tiny_target, ["the cat is on the mat", "a b c d e f", "x y z w"],
                    target_layers=[1, 3], max_new_tokens=12, progress=False)
    host = make_batch(c, [2, 0, 1], 5, 4, 3, np.random.default_rng(7), anchor_first=True)
    dev = FeatureCache(c.root)
    assert not dev.to_device("cpu")  # only a GPU is worth the copy
    dev.device_features = torch.from_numpy(np.array(dev.features))
    gathered = make_batch(dev, [2, 0, 1], 5, 4, 3, np.random.default_rng(7), anchor_first=True)
    for a, b in zip(host, gathered):
        assert torch.equal(a, b)
    assert gathered[0].abs().sum() > 0 and not gathered[0][~gathered[1]].any()  # padding rows are zero
