"""DSpark training: Markov head + confidence head, exported and run by llama.cpp's dflash graph."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from llama_dflash.train.data import build_cache
from llama_dflash.train.export import export_draft, parity_check
from llama_dflash.train.model import DraftModel, load_target_head
from llama_dflash.train.trainer import TrainConfig, block_loss, make_batch, train
from llama_dflash.writer import DraftShape


def _dspark(target, block=4, rank=16, seed=0):
    torch.manual_seed(seed)
    emb, head = load_target_head(target)
    shape = DraftShape(n_embd=64, n_layer=1, n_head=4, n_head_kv=2, block_size=block, target_layers=[1, 3],
                       markov_rank=rank, confidence_head=True)
    return DraftModel(shape, emb, head)


def test_anchor_first_batch_labels_the_next_tokens(tiny_target, tmp_path):
    cache = build_cache(str(tmp_path / "d"), tiny_target, ["the cat is"], target_layers=[1, 3], max_new_tokens=12,
                        progress=False)
    toks = cache.get(0)[0]
    rng = np.random.default_rng(0)
    _, _, bt, anc, lab = make_batch(cache, [0], 4, 3, 3, np.random.default_rng(0), anchor_first=True)
    _, _, _, anc2, lab2 = make_batch(cache, [0], 4, 3, 3, rng)
    assert (anc == anc2).all()
    for m, a in enumerate(anc[0].tolist()):
        assert bt[0, m, 0] == toks[a]
        for j in range(4):
            want = toks[a + j + 1] if a + j + 1 < len(toks) else -100
            assert lab[0, m, j] == want  # DSpark slot j predicts a+j+1
        assert lab2[0, m, 0] == -100 and lab2[0, m, 1] == toks[a + 1]  # DFlash slot j predicts a+j


def test_markov_and_confidence_heads_learn_and_match_llama_cpp(tiny_target, tmp_path):
    cache = build_cache(str(tmp_path / "d"), tiny_target, ["the cat is on the mat", "a b c d e f", "the dog and"],
                        target_layers=[1, 3], max_new_tokens=24, progress=False)
    m = _dspark(tiny_target)
    batch = make_batch(cache, [0, 1, 2], 4, 6, 3, np.random.default_rng(1), anchor_first=True)
    first = float(block_loss(m, batch, 2.0)[0].detach())
    summary = train(m, cache, TrainConfig(steps=40, batch_size=3, anchors_per_seq=6, checkpoint_every=0, lr=3e-3),
                    mask_id=3, train_ids=[0, 1, 2], progress=False)
    assert summary["loss_end"] < 0.8 * summary["loss_start"]
    assert float(block_loss(m, batch, 2.0)[0].detach()) < first
    assert float(m.markov_w2.detach().abs().max()) > 0  # the Markov head moved off its zero start
    assert float(m.conf_proj.weight.detach().abs().max()) > 0
    # random Markov weights large enough to change argmaxes: parity must still hold
    with torch.no_grad():
        m.markov_w2.normal_(0, 2.0)
    out = export_draft(m, str(tmp_path / "dspark.gguf"), target_path=tiny_target, mask_token_id=3)
    from llama_dflash.inspect import read_gguf, validate_pair

    info = validate_pair(read_gguf(tiny_target), read_gguf(out))
    assert info.algorithm == "dspark" and info.has_confidence_head and info.anchor_first
    seqs = [(cache.get(i)[0], cache.get(i)[1].astype(np.float32)) for i in range(3)]
    res = parity_check(m, out, tiny_target, seqs, anchors_per_seq=8)
    assert res["slots"] >= 80
    assert res["agreement"] >= 0.99, res
    assert res["confidence_max_abs_diff"] < 1e-3, res
    # the chain matters: without the bias the greedy tokens differ somewhere
    with torch.no_grad():
        f = torch.from_numpy(seqs[0][1])[None]
        toks = seqs[0][0]
        anchors = torch.tensor([[2, 5, 8]])
        bt = torch.full((1, 3, 4), 3, dtype=torch.long)
        bt[0, :, 0] = torch.as_tensor(toks[[2, 5, 8]])
        hid = m(f, torch.ones(1, len(toks), dtype=torch.bool), bt, anchors, return_hidden=True)[0]
        with_bias = m.greedy_chain(hid, bt[0, :, 0])[0]
        plain = (hid @ m.head.T).argmax(-1)
    assert not torch.equal(with_bias, plain)


@pytest.mark.parametrize("vocab_args", [[], ["--train-vocab", "48"]], ids=["full-head", "reduced-head"])
def test_train_cli_dspark_end_to_end(cycle_target, tmp_path, vocab_args):
    prompts = tmp_path / "p.txt"
    letters = "abcdefghijklmnopqrstuvwxyz"
    prompts.write_text("\n".join(" ".join(letters[(i + k) % 26] for k in range(3)) for i in range(26)) + "\n")
    out = tmp_path / "dspark.gguf"
    r = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "train", "--algorithm", "dspark", "--markov-rank", "32",
                        "--model", cycle_target, "--output", str(out), "--prompts", str(prompts), "--n-prompts", "24",
                        "--eval-prompts", "2", "--max-new-tokens", "40", "--block-size", "4", "--steps", "200",
                        "--batch-size", "4", "--anchors-per-seq", "8", "--lr", "1e-2", "--threads", "1",
                        "--workdir", str(tmp_path / "w"), "--no-progress", *vocab_args],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["algorithm"] == "dspark"
    assert rep["reduced_vocab"] == (48 if vocab_args else None)
    assert rep["parity"]["agreement"] >= 0.99 and rep["parity"]["slots"] >= 40
    acc = rep["eval"]["acceptance_per_position"]
    assert len(acc) == 4 and min(acc) >= 0.85, rep["eval"]  # anchor-first: 4 draft tokens per block of 4


def test_dspark_with_a_reduced_vocabulary_trains_and_matches_llama_cpp(tiny_target, tmp_path):
    """markov_w1 stays over the target vocabulary (its input is the previous target token),
    markov_w2 and the head cover the reduced rows; llama.cpp scatters both through d2t."""
    from llama_dflash.inspect import read_gguf, validate_pair
    from llama_dflash.train.draftfile import read_draft_tensors
    from llama_dflash.train.vocab import choose_vocab, count_tokens

    cache = build_cache(str(tmp_path / "d"), tiny_target, ["the cat is on the mat", "a b c d e f", "the dog and"],
                        target_layers=[1, 3], max_new_tokens=24, progress=False)
    emb, head = load_target_head(tiny_target)
    counts = count_tokens(len(emb), [cache.seqs[i].tokens for i in range(len(cache))])
    vocab = choose_vocab(counts, 24)
    torch.manual_seed(0)
    shape = DraftShape(n_embd=64, n_layer=1, n_head=4, n_head_kv=2, block_size=4, target_layers=[1, 3],
                       markov_rank=16, confidence_head=True)
    m = DraftModel(shape, emb, head, vocab=vocab)
    assert m.markov_w1.shape == (len(emb), 16) and m.markov_w2.shape == (24, 16) and m.head.shape == (24, 64)
    batch = make_batch(cache, [0, 1, 2], 4, 6, 3, np.random.default_rng(1), anchor_first=True)
    ids = batch[-1]
    assert (m.head_rows(ids) == -100).logical_and(ids >= 0).any()  # some labels fall outside the head
    first = float(block_loss(m, batch, 2.0)[0].detach())
    train(m, cache, TrainConfig(steps=30, batch_size=3, anchors_per_seq=6, checkpoint_every=0, lr=3e-3),
          mask_id=3, train_ids=[0, 1, 2], progress=False)
    assert float(block_loss(m, batch, 2.0)[0].detach()) < first
    with torch.no_grad():
        m.markov_w2.normal_(0, 2.0)  # large enough to change argmaxes
    out = export_draft(m, str(tmp_path / "r.gguf"), target_path=tiny_target, mask_token_id=3, vocab=vocab)
    t = read_draft_tensors(out)
    assert t["markov_w1.weight"].shape == (len(emb), 16) and t["markov_w2.weight"].shape == (24, 16)
    assert (t["d2t"] == np.asarray(vocab)).all()
    np.testing.assert_allclose(t["markov_w2.weight"], m.markov_w2.detach().numpy(), rtol=1e-6)
    info = validate_pair(read_gguf(tiny_target), read_gguf(out))
    assert info.algorithm == "dspark"
    seqs = [(cache.get(i)[0], cache.get(i)[1].astype(np.float32)) for i in range(3)]
    res = parity_check(m, out, tiny_target, seqs, anchors_per_seq=8, vocab=vocab)
    assert res["slots"] >= 80 and res["agreement"] >= 0.99, res
    assert res["confidence_max_abs_diff"] < 1e-3, res
