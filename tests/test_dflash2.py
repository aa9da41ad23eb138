"""DFlash2 drafts: no logits, a selector lattice walked on the CPU, as llama.cpp's driver does.

The lattice is recomputed here in numpy from the block's own logits and hidden states and the
selector tensors of the file, then walked by an independent loop; the proposer must agree.
Every test runs on the draft our test writer makes and on the same draft exported to the Hugging
Face DFlash2 layout and converted back by llama.cpp's own `convert_hf_to_gguf.py`.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from llama_cpp import llama_cpp as ll

from dflash2_fixture import write_dflash2_draft
from hf_converter import convert, hf_converter  # noqa: F401  (fixture)
from _equivalence import assert_same_tokens
from llama_dflash import LlamaDFlashDecoding, SpecConfig, TargetConfig
from llama_dflash import _bindings as ext
from llama_dflash.generate import prefill
from llama_dflash.inspect import read_gguf, validate_pair
from llama_dflash.proposers import selector_walk
from llama_dflash.train.hf_export import export_hf
from llama_dflash.train.hf_target import write_target_dir
from spec_common import N_TOKENS, check_every_accepted_length, ordinary_reference

BLOCK = 8
TOP_K = 4


@pytest.fixture(scope="module", params=["writer", pytest.param("converter", marks=pytest.mark.slow)])
def dflash2_draft(request, tiny_dir, tiny_target):
    ours = write_dflash2_draft(str(tiny_dir / "dflash2.gguf"), tiny_target, block_size=BLOCK, top_k=TOP_K, seed=21)
    if request.param == "writer":
        return ours
    converter = request.getfixturevalue("hf_converter")
    hf, target = str(tiny_dir / "dflash2-hf"), str(tiny_dir / "target-hf")
    cfg = export_hf(ours, hf)
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    assert cfg["dflash_config"]["selector_top_k"] == TOP_K
    write_target_dir(tiny_target, target)
    return convert(converter, hf, target, str(tiny_dir / "dflash2-converted.gguf"))


@pytest.fixture(scope="module")
def reference(tiny_target):
    return ordinary_reference(TargetConfig(tiny_target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1))


def _engine(config, draft, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "backend draft sampling unavailable" for DFlash2
        return LlamaDFlashDecoding(config, SpecConfig(draft, **kw))


def _prefilled(eng, prompt):
    eng.target.clear()
    eng._dflash.clear()
    prefill(eng.target, prompt[:-1], eng._dflash.inject)
    eng._dflash.flush()
    return int(prompt[-1]), len(prompt) - 1


def _tensors(path):
    from gguf import GGUFReader

    return {t.name: np.array(t.data) for t in GGUFReader(path, "r").tensors}


def _raw_block(p, id_last, n_past, n_block):
    """Decode a block with logits and hidden states on every row; (logits, hidden, lattice), cache clean."""
    ll.llama_set_embeddings(p.ctx.ptr, True)
    p.batch.set_block(id_last, p.mask, n_block, n_past)
    try:
        assert p.batch.decode(p.ctx.ptr) == 0
        logits = np.stack([np.array(p._logits(i)) for i in range(n_block)])
        hidden = np.stack([np.ctypeslib.as_array(ll.llama_get_embeddings_ith(p.ctx.ptr, i), shape=(p.n_embd,)).copy()
                           for i in range(n_block)])
        lat = ext.llama_get_embeddings_nextn(p.ctx.ptr)
        lattice = np.ctypeslib.as_array(lat, shape=(n_block, p.n_embd)).copy()
    finally:
        ll.llama_set_embeddings(p.ctx.ptr, False)
        p.ctx.seq_rm(0, n_past, -1)
    return logits, hidden, lattice


def _reference_lattice(t, logits, hidden, id_last, cand):
    """scores[i][p, j] = succ[cand_i[j]] . (prev[pred_p] * gate_i) + logit_i[cand_i[j]], gate_i = H @ h_i;
    predecessors: the anchor for slot 1, slot i-1's candidates after that."""
    prev, succ, gate_w = t["selector_predecessor.weight"], t["selector_successor.weight"], t["selector_hidden.weight"]
    scores = {}
    for i in range(1, len(logits)):
        gate = gate_w @ hidden[i]
        preds = [id_last] * TOP_K if i == 1 else [int(c) for c in cand[i - 1]]
        s = np.empty((TOP_K, TOP_K), dtype=np.float64)
        for pi, pred in enumerate(preds):
            s[pi] = succ[cand[i]] @ (prev[pred] * gate) + logits[i][cand[i]]
        scores[i] = s
    return scores


def _reference_walk(scores, cand, p_min=0.0):
    """The walk written out plainly: (tokens, probability of each choice)."""
    tokens, probs, pred = [], [], 0
    for i in sorted(scores):
        row = scores[i][pred]
        best = int(np.argmax(row))
        prob = float(1.0 / np.exp(row - row[best]).sum())
        if p_min > 0 and prob < p_min:
            break
        tokens.append(int(cand[i][best]))
        probs.append(prob)
        pred = best
    return tokens, probs


def test_fixture_is_detected_as_dflash2(dflash2_draft, tiny_target, tiny_config):
    info = validate_pair(read_gguf(tiny_target), read_gguf(dflash2_draft))
    assert info.is_dflash2 and info.algorithm == "dflash"
    names = set(_tensors(dflash2_draft))
    assert {"selector_hidden.weight", "selector_predecessor.weight", "selector_successor.weight",
            "blk.0.attn_conv_base", "blk.0.attn_conv_proj.weight",
            "blk.0.ffn_conv_base", "blk.0.ffn_conv_proj.weight"} <= names
    with _engine(tiny_config, dflash2_draft) as eng:
        p = eng._dflash
        assert p.selector_top_k == TOP_K
        assert not p.backend_sampling_active and "lattice" in p.backend_sampling_reason


def test_lattice_and_walk_match_numpy(tiny_config, dflash2_draft, reference):
    """The lattice llama.cpp packs equals the numpy recomputation, and propose() walks it like the
    plain reference loop; the walk is not the per-slot argmax of the logits (the selector matters)."""
    prompt, _ = reference
    t = _tensors(dflash2_draft)
    with _engine(tiny_config, dflash2_draft, draft_n_max=BLOCK - 1) as eng:
        p = eng._dflash
        id_last, n_past = _prefilled(eng, prompt)
        walks, argmaxes = [], []
        for step in range(4):  # a few anchors: the prompt's last token and some others
            anchor = id_last if step == 0 else int(prompt[step])
            logits, hidden, lattice = _raw_block(p, anchor, n_past, BLOCK)
            cand = {}
            for i in range(1, BLOCK):
                ids = lattice[i, :TOP_K]
                assert np.all(ids == np.round(ids))
                cand[i] = ids.astype(np.int64)
                top = np.sort(logits[i])[::-1][:TOP_K]
                np.testing.assert_allclose(np.sort(logits[i][cand[i]])[::-1], top, rtol=1e-6)
            scores = _reference_lattice(t, logits, hidden, anchor, cand)
            for i in range(1, BLOCK):
                got = lattice[i, TOP_K : TOP_K + TOP_K * TOP_K].reshape(TOP_K, TOP_K)
                np.testing.assert_allclose(got, scores[i], rtol=1e-4, atol=1e-4)
            expect, _ = _reference_walk(scores, cand)
            assert selector_walk(lattice, TOP_K) == expect
            assert p.propose(anchor, n_past, BLOCK - 1) == expect
            assert p.pos_max() == n_past - 1
            walks.append(expect)
            argmaxes.append([int(np.argmax(logits[i])) for i in range(1, BLOCK)])
        assert any(w != a for w, a in zip(walks, argmaxes))


def test_p_min_cuts_on_selector_probabilities(tiny_config, dflash2_draft, reference):
    prompt, _ = reference
    t = _tensors(dflash2_draft)
    with _engine(tiny_config, dflash2_draft, draft_n_max=BLOCK - 1) as eng:
        p = eng._dflash
        id_last, n_past = _prefilled(eng, prompt)
        logits, hidden, lattice = _raw_block(p, id_last, n_past, BLOCK)
        cand = {i: lattice[i, :TOP_K].astype(np.int64) for i in range(1, BLOCK)}
        scores = _reference_lattice(t, logits, hidden, id_last, cand)
        full, probs = _reference_walk(scores, cand)
        cuts = set()
        for p_min in sorted({pr + 1e-4 for pr in probs if pr + 1e-4 < 1} | {min(probs) / 2}):
            expect, _ = _reference_walk(scores, cand, p_min)
            p.p_min = p_min
            assert p.propose(id_last, n_past, BLOCK - 1) == expect, p_min
            cuts.add(len(expect))
        assert len(cuts) >= 3  # the fixture cuts at several slots


@pytest.mark.parametrize("n_draft", [1, 3, 7])
def test_greedy_output_matches_ordinary(tiny_config, dflash2_draft, reference, n_draft):
    prompt, ref = reference
    with _engine(tiny_config, dflash2_draft, draft_n_max=n_draft) as eng:
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
        assert_same_tokens(res.tokens, ref, prompt=prompt, config=tiny_config)
        assert res.stats.drafted > 0 and res.stats.draft_steps > 0
        assert eng.target.pos_max() == eng._dflash.pos_max()
    with _engine(tiny_config, dflash2_draft, draft_n_max="auto") as eng:
        assert_same_tokens(eng.generate(prompt, N_TOKENS, ignore_eos=True).tokens, ref,
                           prompt=prompt, config=tiny_config)


def test_every_accepted_length(tiny_config, dflash2_draft, reference):
    prompt, ref = reference
    with _engine(tiny_config, dflash2_draft, draft_n_max=5) as eng:
        s = check_every_accepted_length(eng, prompt, ref, 5).stats
        assert s.rollbacks > 0


def test_walk_reads_from_slot_one_and_stops_at_the_block():
    """A hand-made lattice: slot 0 is never read, the predecessor index carries over."""
    k, e = 2, 8
    lat = np.zeros((3, e), dtype=np.float32)
    lat[0, :2] = [99, 98]
    lat[1, :2] = [10, 11]
    lat[1, 2:6] = [0.0, 1.0, 0.0, 1.0]  # after the anchor: candidate 1 (id 11)
    lat[2, :2] = [20, 21]
    lat[2, 2:6] = [5.0, 0.0, 0.0, 3.0]  # after candidate 1: row [0, 3] -> candidate 1 (id 21)
    assert selector_walk(lat, k) == [11, 21]
    assert selector_walk(lat, k, p_min=0.8) == []  # slot 1: softmax(0, 1) at 1 is 0.73
    assert selector_walk(lat, k, p_min=0.7) == [11, 21]


def test_algorithm_dflash2_names_the_file_kind(dflash2_draft, tiny_draft, tiny_target, tiny_config, reference):
    """algorithm="dflash2" (the preview example's --algorithm dflash2) runs a DFlash2 draft, and
    refuses a plain DFlash one before llama.cpp sees it."""
    from llama_dflash.errors import IncompatibleModelError

    info = validate_pair(read_gguf(tiny_target), read_gguf(dflash2_draft), "dflash2")
    assert info.is_dflash2
    with pytest.raises(IncompatibleModelError, match="selector"):
        validate_pair(read_gguf(tiny_target), read_gguf(tiny_draft), "dflash2")
    prompt, ref = reference
    with _engine(tiny_config, dflash2_draft, algorithm="dflash2", draft_n_max=3) as eng:
        assert_same_tokens(eng.generate(prompt, len(ref), ignore_eos=True).tokens, ref,
                           prompt=prompt, config=tiny_config)


def test_example_takes_algorithm_dflash2(dflash2_draft, tiny_draft, tiny_target):
    import json
    import subprocess
    import sys

    def run(draft, out):
        return subprocess.run(
            [sys.executable, "-m", "examples.high_level_api.high_level_api_dflash_dspark_speculative",
             "--algorithm", "dflash2", "--model", tiny_target, "--draft-model", draft, "--draft-tokens", "3",
             "--max-tokens", "8", "--runs", "1", "--warmup-tokens", "0", "--raw-prompt", "--prompt", "a b c",
             "--n-ctx", "256", "--n-batch", "64", "--n-ubatch", "64", "--no-cost-probe", "--json", out],
            capture_output=True, text=True, timeout=300, cwd=__file__.rsplit("/tests/", 1)[0])

    out = str(dflash2_draft) + ".json"
    ok = run(dflash2_draft, out)
    assert ok.returncode == 0, ok.stderr
    spec = json.load(open(out))["speculative"]["stats"]
    assert spec["generated_tokens"] == 8 and spec["verification_steps"] > 0
    bad = run(tiny_draft, out)
    assert bad.returncode == 2 and "selector" in bad.stderr and "Traceback" not in bad.stderr
