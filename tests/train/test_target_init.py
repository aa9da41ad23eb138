"""--init-from-target: the draft starts as the target's deepest injected layer."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from llama_dflash.train.draftfile import load_target_head
from llama_dflash.train.model import DraftModel, rope_neox
from llama_dflash.train.target_init import _halves_order, init_from_target, last_feature, target_layer_weights
from llama_dflash.writer import DraftShape


def _rope_interleaved(x: np.ndarray, pos: int, theta: float) -> np.ndarray:
    """llama.cpp's "normal" rope: rotates pairs (2i, 2i+1) of each head."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d // 2) * 2.0 / d)
    c, s = np.cos(pos * inv), np.sin(pos * inv)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x1 * c + x0 * s
    return out


def _converter_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What a converter does to HF q/k rows (halves per head -> interleaved pairs)."""
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def test_halves_order_undoes_the_interleave_and_keeps_attention_scores():
    rng = np.random.default_rng(0)
    n_head, d, e = 3, 8, 12
    hf = rng.standard_normal((n_head * d, e))
    stored = _converter_permute(hf, n_head)
    np.testing.assert_array_equal(_halves_order(stored, n_head), hf)
    # q.k under interleaved rope on the stored rows == under NEOX rope on the restored rows
    xq, xk = rng.standard_normal(e), rng.standard_normal(e)
    for pq, pk in ((5, 2), (17, 3)):
        qi = _rope_interleaved((stored @ xq).reshape(n_head, d), pq, 10000.0)
        ki = _rope_interleaved((stored @ xk).reshape(n_head, d), pk, 10000.0)
        rest = _halves_order(stored, n_head)
        qn = rope_neox(torch.tensor((rest @ xq).reshape(1, n_head, d)), torch.tensor([pq]), 10000.0)[0].numpy()
        kn = rope_neox(torch.tensor((rest @ xk).reshape(1, n_head, d)), torch.tensor([pk]), 10000.0)[0].numpy()
        np.testing.assert_allclose((qi * ki).sum(-1), (qn * kn).sum(-1), rtol=1e-6, atol=1e-9)


def test_init_copies_the_deepest_layer_and_passes_its_feature_through(tiny_target):
    layers = [1, 3]
    src, idx = last_feature(layers)
    assert (src, idx) == (3, 1)
    shape = DraftShape(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128, block_size=4, target_layers=layers)
    emb, head = load_target_head(tiny_target)
    model = DraftModel(shape, emb, head)
    init_from_target(model, tiny_target, src, idx, noise=0.0)
    w = target_layer_weights(tiny_target, 3)
    for layer in model.layers:
        np.testing.assert_array_equal(layer.wv.weight.detach().numpy(), w["attn_v"])
        np.testing.assert_array_equal(layer.down.weight.detach().numpy(), w["ffn_down"])
        np.testing.assert_array_equal(layer.wq.weight.detach().numpy(), w["attn_q"])
    np.testing.assert_array_equal(model.output_norm.weight.detach().numpy(), w["output_norm"])
    # the context path sees exactly the deepest feature, normed as that layer's attention input
    feats = torch.randn(1, 5, 2 * 64)
    fused = model.enc_norm(model.fc(feats))
    x = feats[..., 64:]
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + shape.rms_eps) * torch.from_numpy(w["attn_norm"])
    torch.testing.assert_close(fused, ref)


def test_target_q_rows_are_restored_to_halves_order(tiny_target):
    from gguf import GGUFReader

    t = {x.name: x for x in GGUFReader(tiny_target, "r").tensors}
    stored = np.array(t["blk.2.attn_q.weight"].data, dtype=np.float32).reshape(-1, 64)
    np.testing.assert_array_equal(target_layer_weights(tiny_target, 2)["attn_q"], _halves_order(stored, 4))


def test_wrong_shapes_are_refused(tiny_target):
    shape = DraftShape(n_embd=64, n_layer=1, n_head=4, n_head_kv=2, n_ff=96, block_size=4, target_layers=[1, 3])
    emb, head = load_target_head(tiny_target)
    with pytest.raises(ValueError, match="feed-forward"):
        init_from_target(DraftModel(shape, emb, head), tiny_target, 3, 1)


def test_cli_trains_from_the_target_layer_with_llama_cpp_parity(tmp_path):
    from llama_dflash.writer import write_tiny_target

    target = write_tiny_target(str(tmp_path / "t.gguf"), n_embd=64, n_layer=4, n_ff=96)
    out = tmp_path / "d.gguf"
    r = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "train", "--model", target, "--output", str(out),
                        "--init-from-target", "--n-prompts", "6", "--eval-prompts", "1", "--max-new-tokens", "12",
                        "--block-size", "4", "--steps", "3", "--batch-size", "2", "--anchors-per-seq", "2",
                        "--threads", "1", "--workdir", str(tmp_path / "w"), "--no-progress", "--data", "prompts"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["parity"]["agreement"] >= 0.99
    from llama_dflash.inspect import read_gguf

    info = read_gguf(str(out))
    assert info.get("dflash.feed_forward_length") == 96  # the target's width, not 2 * n_embd
