"""`llama-dflash export`: reduced draft vocabulary (own head + d2t) and quantized drafts."""

import json
import subprocess
import sys

import numpy as np
import pytest

from llama_dflash.writer import tensor_payload, write_random_draft

N_KEEP = 200


def _export(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "llama_dflash.cli", "export", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def full_draft(tiny_target, tmp_path_factory):
    """Shares the target's head through ctx_other (what the shipped draft does)."""
    return write_random_draft(str(tmp_path_factory.mktemp("fd") / "full.gguf"), tiny_target, block_size=8, seed=5)


@pytest.fixture(scope="module")
def vocab_text(tmp_path_factory):
    p = tmp_path_factory.mktemp("vt") / "text.txt"
    p.write_text("the cat and the dog is on the mat of the house and the cat is big\n" * 3)
    return str(p)


def _tensors(path):
    from gguf import GGUFReader

    return {t.name: t for t in GGUFReader(path, "r").tensors}


def test_choose_vocab_keeps_forced_then_frequent_then_low_ids():
    from llama_dflash.train.vocab import choose_vocab, coverage

    counts = np.array([0, 5, 0, 9, 1, 0, 0, 2])
    assert choose_vocab(counts, 3).tolist() == [1, 3, 7]
    assert choose_vocab(counts, 4, always=[6]).tolist() == [1, 3, 6, 7]
    assert choose_vocab(counts, 6).tolist() == [0, 1, 2, 3, 4, 7]  # unseen: lowest ids first
    assert coverage(counts, np.array([1, 3])) == pytest.approx(14 / 17)
    with pytest.raises(ValueError):
        choose_vocab(counts, 0)
    with pytest.raises(ValueError):
        choose_vocab(counts, 1, always=[2, 5])


def test_tensor_payload_types():
    from gguf import GGMLQuantizationType as Q

    m = np.ones((8, 64), dtype=np.float32)
    assert tensor_payload(m, "q8_0")[1] == Q.Q8_0
    assert tensor_payload(m, "q4_0")[1] == Q.Q4_0
    assert tensor_payload(m, "f16")[0].dtype == np.float16
    assert tensor_payload(np.ones((8, 40), dtype=np.float32), "q4_0")[0].dtype == np.float16  # not 32-divisible
    assert tensor_payload(np.ones(64, dtype=np.float32), "q8_0")[0].dtype == np.float32  # norms stay f32
    assert tensor_payload(np.ones((1, 64), dtype=np.float32), "q8_0")[0].dtype == np.float32  # conf_proj
    with pytest.raises(ValueError):
        tensor_payload(m, "q5_k")


def _blocks(target, draft, prompt_text, anchors, n):
    """Draft tokens of blocks at `anchors` over the target's real features."""
    from llama_dflash.config import SpecConfig, TargetConfig
    from llama_dflash.engine import LlamaDFlashDecoding

    eng = LlamaDFlashDecoding(TargetConfig(model=target, n_ctx=128, n_threads=1),
                              SpecConfig(draft_model=draft, draft_n_max=n))
    try:
        toks = eng._model.tokenize(prompt_text)
        eng.target.decode(toks, 0, logits="last")
        feats = eng.target.layer_features()
        out = []
        for a in anchors:
            eng._dflash.clear()
            eng._dflash.inject(feats[:a], 0)
            out.append(eng._dflash.propose(int(toks[a]), a, n))
        return out
    finally:
        eng.close()


def test_reduced_draft_proposes_what_the_full_draft_does_on_kept_tokens(tiny_target, full_draft, vocab_text, tmp_path):
    out = tmp_path / "reduced.gguf"
    r = _export(full_draft, str(out), "--model", tiny_target, "--reduce-vocab", str(N_KEEP), "--vocab-text", vocab_text)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["reduced_vocab"] == N_KEEP and rep["coverage_of_counted"] == 1.0
    t = _tensors(str(out))
    keep = set(np.array(t["d2t"].data).tolist())
    assert len(keep) == N_KEEP and t["output.weight"].data.shape[0] == N_KEEP
    assert 2 in keep  # EOS always kept
    text = "the cat and the dog is on the mat of the house"
    anchors = [3, 5, 7, 9]
    full = _blocks(tiny_target, full_draft, text, anchors, 7)
    red = _blocks(tiny_target, str(out), text, anchors, 7)
    compared = 0
    for fb, rb in zip(full, red):
        assert len(fb) == len(rb) == 7
        for f_tok, r_tok in zip(fb, rb):
            assert r_tok in keep
            if f_tok in keep:  # same head rows: same argmax whenever it is kept
                assert r_tok == f_tok
                compared += 1
    assert compared >= 3


@pytest.mark.parametrize("wtype", ["f16", "q8_0", "q4_0"])
def test_quantized_reduced_draft_gives_ordinary_output(tiny_target, full_draft, vocab_text, tmp_path, wtype):
    from gguf import GGMLQuantizationType as Q

    from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, TargetConfig

    out = tmp_path / f"{wtype}.gguf"
    r = _export(full_draft, str(out), "--model", tiny_target, "--reduce-vocab", "64", "--vocab-text", vocab_text,
                "--quantize", wtype)
    assert r.returncode == 0, r.stderr
    t = _tensors(str(out))
    want = {"f16": Q.F16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0}[wtype]
    assert t["blk.0.attn_q.weight"].tensor_type == want and t["output.weight"].tensor_type == want
    assert t["blk.0.attn_norm.weight"].tensor_type == Q.F32
    cfg = TargetConfig(tiny_target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    with OrdinaryDecoding(cfg) as o:
        prompt = o.tokenize("the quick brown fox and the lazy dog is")
        ref = o.generate(prompt, 32, ignore_eos=True).tokens
    with LlamaDFlashDecoding(cfg, SpecConfig(draft_model=str(out), draft_n_max=4)) as eng:
        res = eng.generate(prompt, 32, ignore_eos=True)
    assert res.tokens == ref
    assert res.stats.drafted > 0


def test_export_refuses_bad_input(tiny_target, full_draft, tmp_path):
    r = _export(full_draft, str(tmp_path / "o.gguf"), "--model", tiny_target, "--reduce-vocab", "0")
    assert r.returncode == 2 and "--reduce-vocab" in r.stderr and "Traceback" not in r.stderr
    r = _export(full_draft, str(tmp_path / "o.gguf"), "--model", tiny_target, "--reduce-vocab", "100000")
    assert r.returncode == 2 and "--reduce-vocab" in r.stderr
    r = _export(full_draft, full_draft, "--model", tiny_target)
    assert r.returncode == 2 and "another file" in r.stderr
    r = _export(tiny_target, str(tmp_path / "o.gguf"), "--model", tiny_target)  # not a draft
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = _export(str(tmp_path / "missing.gguf"), str(tmp_path / "o.gguf"), "--model", tiny_target)
    assert r.returncode == 2 and "not found" in r.stderr
    r = _export(full_draft, str(tmp_path / "o.gguf"), "--model", tiny_target, "--quantize", "q5_k")
    assert r.returncode == 2
    assert not (tmp_path / "o.gguf").exists()


def test_train_writes_reduced_quantized_draft(cycle_target, tmp_path):
    from gguf import GGMLQuantizationType as Q

    prompts = tmp_path / "p.txt"
    letters = "abcdefghijklmnopqrstuvwxyz"
    prompts.write_text("\n".join(" ".join(letters[(i + k) % 26] for k in range(3)) for i in range(26)) + "\n")
    out = tmp_path / "draft.gguf"
    r = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "train", "--model", cycle_target, "--output", str(out),
                        "--prompts", str(prompts), "--n-prompts", "24", "--eval-prompts", "2", "--max-new-tokens", "40",
                        "--block-size", "4", "--steps", "200", "--batch-size", "4", "--anchors-per-seq", "8",
                        "--lr", "1e-2", "--threads", "1", "--workdir", str(tmp_path / "w"), "--no-progress",
                        "--reduce-vocab", "40", "--quantize", "q8_0"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["reduced_vocab"] == 40 and rep["weight_type"] == "q8_0"
    t = _tensors(str(out))
    assert len(t["d2t"].data) == 40 and t["output.weight"].tensor_type == Q.Q8_0
    assert rep["parity"]["agreement"] >= 0.99
    assert min(rep["eval"]["acceptance_per_position"]) >= 0.7, rep["eval"]


@pytest.mark.parametrize("kind", ["dflash", "dspark_d2t"])
def test_hf_export_layout(tiny_target, tmp_path, kind):
    """config.json + model.safetensors in the z-lab layout: every tensor there, values unchanged,
    target_layer_ids = GGUF target_layers - 1, d2t as offsets."""
    from llama_dflash.inspect import read_gguf
    from llama_dflash.train.draftfile import read_draft_tensors
    from llama_dflash.train.hf_export import hf_tensor_name, read_safetensors

    kw = dict(markov_rank=8, confidence_head=True, draft_vocab=48) if kind == "dspark_d2t" else {}
    draft = write_random_draft(str(tmp_path / "d.gguf"), tiny_target, block_size=8, seed=7, n_layer=2, **kw)
    out = tmp_path / "hf"
    r = _export(draft, "--model", tiny_target, "--hf-output", str(out))
    assert r.returncode == 0, r.stderr
    cfg = json.loads((out / "config.json").read_text())
    info = read_gguf(draft)
    assert cfg["architectures"] == ["DSparkDraftModel" if kw else "DFlashDraftModel"]
    assert cfg["dflash_config"]["target_layer_ids"] == [x - 1 for x in info.get("dflash.target_layers")]
    assert cfg["dflash_config"]["mask_token_id"] == info.get("tokenizer.ggml.mask_token_id")
    assert cfg["num_hidden_layers"] == 2 and cfg["hidden_size"] == 64 and cfg["block_size"] == 8
    st = read_safetensors(str(out / "model.safetensors"))
    src = read_draft_tensors(draft)
    assert set(st) == {hf_tensor_name(k) for k in src}
    assert "model.layers.1.mlp.down_proj.weight" in st and "model.fc.weight" in st
    for k, arr in src.items():
        got = st[hf_tensor_name(k)]
        if k == "d2t":
            assert cfg["draft_vocab_size"] == 48
            assert (got + np.arange(48) == arr).all()
        else:
            assert got.shape == arr.shape and np.array_equal(got, arr)
    if kw:
        assert cfg["markov_rank"] == 8 and cfg["sample_from_anchor"] is True
        assert st["model.markov_head.markov_w1.weight"].shape == (316, 8)


def test_hf_export_needs_an_output(tiny_target, full_draft):
    r = _export(full_draft, "--model", tiny_target)
    assert r.returncode == 2 and "--hf-output" in r.stderr
