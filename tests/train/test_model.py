import numpy as np
import torch

from llama_dflash.train.data import build_cache
from llama_dflash.train.export import export_draft, parity_check
from llama_dflash.train.model import DraftModel, load_target_head
from llama_dflash.train.trainer import TrainConfig, block_loss, make_batch, pick_mask_token, train
from llama_dflash.inspect import read_gguf
from llama_dflash.writer import DraftShape


def _model(target, layers=(1, 3), block=4, seed=0):
    torch.manual_seed(seed)
    emb, head = load_target_head(target)
    shape = DraftShape(n_embd=64, n_layer=1, n_head=4, n_head_kv=2, block_size=block, target_layers=list(layers))
    return DraftModel(shape, emb, head)


def test_a_few_steps_lower_the_loss(tiny_target, tmp_path):
    cache = build_cache(str(tmp_path / "d"), tiny_target, ["the cat is", "a b c"], target_layers=[1, 3],
                        max_new_tokens=16, progress=False)
    m = _model(tiny_target)
    rng = np.random.default_rng(0)
    batch = make_batch(cache, [0, 1], 4, 4, 3, rng)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=3e-3)
    first = float(block_loss(m, batch, 2.0)[0])
    for _ in range(15):
        loss = block_loss(m, batch, 2.0)[0]
        opt.zero_grad(); loss.backward(); opt.step()
    assert float(block_loss(m, batch, 2.0)[0]) < 0.8 * first


def test_export_loads_in_llama_cpp_and_matches_pytorch(tiny_target, tmp_path):
    cache = build_cache(str(tmp_path / "d"), tiny_target, ["the cat is on the mat", "a b c d e f"],
                        target_layers=[1, 3], max_new_tokens=20, progress=False)
    m = _model(tiny_target, block=5)
    train(m, cache, TrainConfig(steps=10, batch_size=2, anchors_per_seq=4, checkpoint_every=0), mask_id=3,
          train_ids=[0, 1], progress=False)
    out = export_draft(m, str(tmp_path / "draft.gguf"), target_path=tiny_target, mask_token_id=3)
    assert read_gguf(out).architecture == "dflash"
    seqs = [(cache.get(i)[0], cache.get(i)[1].astype(np.float32)) for i in range(2)]
    res = parity_check(m, out, tiny_target, seqs, anchors_per_seq=6)
    assert res["slots"] >= 40
    assert res["agreement"] >= 0.99, res


def test_mask_token_is_an_unused_special_token(tiny_target):
    info = read_gguf(tiny_target)
    assert pick_mask_token(info.tokens, used={5, 6}, reserved={0, 1, 2}) == 3
    assert pick_mask_token(info.tokens, used={3}, reserved={0, 1, 2}) is None  # no other special: CLI falls back
