"""--init-from-draft: a draft GGUF's weights back into a DraftModel, vocabulary rows matched by
token id, clear refusals of other shapes; through the CLI the run starts where the draft was."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from llama_dflash.train.export import export_draft
from llama_dflash.train.model import DraftModel, load_target_head
from llama_dflash.train.warm_start import init_from_draft
from llama_dflash.writer import DraftShape


def _model(target, vocab=None, layers=1, block=4, seed=0):
    torch.manual_seed(seed)
    emb, head = load_target_head(target)
    shape = DraftShape(n_embd=64, n_layer=layers, n_head=4, n_head_kv=2, block_size=block, target_layers=[1, 3],
                       markov_rank=16, confidence_head=True)
    m = DraftModel(shape, emb, head, vocab=vocab)
    with torch.no_grad():  # trained-looking weights everywhere, markov_w2 included (it starts at zero)
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return m


def test_f32_draft_loads_back_exactly(tiny_target, tmp_path):
    vocab = np.arange(10, 60)
    src = _model(tiny_target, vocab, seed=1)
    path = export_draft(src, str(tmp_path / "d.gguf"), target_path=tiny_target, mask_token_id=3, vocab=vocab)
    dst = _model(tiny_target, vocab, seed=2)
    res = init_from_draft(dst, path, tiny_target)
    assert res["markov_rows"] == len(vocab)
    a, b = src.export_weights(), dst.export_weights()
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_another_vocabulary_matches_markov_rows_by_token(tiny_target, tmp_path):
    old = np.arange(10, 60)
    src = _model(tiny_target, old, seed=1)
    path = export_draft(src, str(tmp_path / "d.gguf"), target_path=tiny_target, mask_token_id=3, vocab=old)
    new = np.arange(40, 90)  # 20 tokens shared with the old vocabulary
    dst = _model(tiny_target, new, seed=2)
    assert init_from_draft(dst, path, tiny_target)["markov_rows"] == 20
    w_old, w_new = src.markov_w2.detach().numpy(), dst.markov_w2.detach().numpy()
    for r, t in enumerate(new):
        if t < 60:
            np.testing.assert_array_equal(w_new[r], w_old[t - 10])
        else:
            assert not w_new[r].any()  # new to the vocabulary: plain DFlash for it
    np.testing.assert_array_equal(src.fc.weight.detach().numpy(), dst.fc.weight.detach().numpy())


def test_other_shapes_are_refused_clearly(tiny_target, tmp_path):
    vocab = np.arange(10, 60)
    path = export_draft(_model(tiny_target, vocab), str(tmp_path / "d.gguf"), target_path=tiny_target,
                        mask_token_id=3, vocab=vocab)
    with pytest.raises(ValueError, match="shape differs|no blk.1"):
        init_from_draft(_model(tiny_target, vocab, layers=2), path, tiny_target)
    with pytest.raises(ValueError, match="block size 4"):
        init_from_draft(_model(tiny_target, vocab, block=5), path, tiny_target)


def test_cli_starts_from_the_draft(tiny_target, tmp_path):
    def train(out, *a):
        return subprocess.run([sys.executable, "-m", "llama_dflash.cli", "train", "--model", tiny_target,
                               "--output", str(tmp_path / out), "--workdir", str(tmp_path / "w" / out),
                               "--algorithm", "dspark", "--markov-rank", "16", "--block-size", "4",
                               "--target-layers", "1,3", "--data", "prompts", "--n-prompts", "3", "--max-new-tokens", "8",
                               "--skip-eval", "--no-progress", "--threads", "1", *a],
                              capture_output=True, text=True, timeout=240)

    r = train("first.gguf", "--steps", "3", "--lr", "1e-2")
    assert r.returncode == 0, r.stderr
    first = str(tmp_path / "first.gguf")
    r = train("x.gguf", "--init-from-draft", str(tmp_path / "missing.gguf"))
    assert r.returncode == 2 and "draft not found" in r.stderr
    r = train("x.gguf", "--init-from-draft", first, "--init-from-target")
    assert r.returncode == 2 and "exclude each other" in r.stderr
    r = train("x.gguf", "--init-from-draft", first, "--block-size", "5")
    assert r.returncode == 2 and "block size 4" in r.stderr and "Traceback" not in r.stderr
    # one step at a negligible rate: the new draft is the one it started from
    r = train("second.gguf", "--init-from-draft", first, "--steps", "1", "--lr", "1e-12")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["init_from_draft"] == first
    from llama_dflash.train.draftfile import read_draft_tensors

    a, b = read_draft_tensors(first), read_draft_tensors(str(tmp_path / "second.gguf"))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], atol=1e-6, err_msg=k)
