"""The Hugging Face export round-trips through llama.cpp's own converter (issue 11 item 5).

Each draft GGUF is exported (`export_hf`), converted back by `convert_hf_to_gguf.py` with a target
directory rebuilt from the target GGUF's tokenizer (`write_target_dir`), and the converted draft
must hold the same tensors and propose, draft and accept exactly what the original does.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from hf_converter import convert, hf_converter  # noqa: F401  (fixture)
from llama_dflash import LlamaDFlashDecoding, SpecConfig, TargetConfig
from llama_dflash.generate import prefill
from llama_dflash.inspect import read_gguf, validate_pair
from llama_dflash.train.hf_export import export_hf
from llama_dflash.train.hf_target import write_target_dir
from llama_dflash.writer import write_random_draft
from spec_common import ordinary_reference

pytestmark = pytest.mark.slow

BLOCK = 8
DRAFTS = {  # name -> (write_random_draft arguments, expected HF architecture)
    "dflash": (dict(seed=2), "DFlashDraftModel"),
    "dflash_own_embd": (dict(seed=3, with_embeddings=True, n_layer=2), "DFlashDraftModel"),
    "dspark_conf": (dict(seed=10, markov_rank=8, confidence_head=True), "DSparkDraftModel"),
    "dspark_bonus": (dict(seed=5, markov_rank=8, confidence_head=True, sample_from_anchor=False), "DSparkDraftModel"),
    "dspark_noconf": (dict(seed=5, markov_rank=8), "DSparkDraftModel"),
    "d2t": (dict(seed=11, draft_vocab=48), "DSparkDraftModel"),
    "d2t_dspark": (dict(seed=11, draft_vocab=48, markov_rank=8, confidence_head=True), "DSparkDraftModel"),
}


@pytest.fixture(scope="module")
def target_dir(tiny_dir, tiny_target):
    return write_target_dir(tiny_target, str(tiny_dir / "roundtrip-target-hf"))


@pytest.fixture(scope="module")
def reference(tiny_target):
    return ordinary_reference(TargetConfig(tiny_target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1))


@pytest.fixture(scope="module", params=sorted(DRAFTS))
def pair(request, tiny_dir, tiny_target, target_dir, hf_converter):
    kw, arch = DRAFTS[request.param]
    name = request.param
    original = write_random_draft(str(tiny_dir / f"rt_{name}.gguf"), tiny_target, block_size=BLOCK, **kw)
    cfg = export_hf(original, str(tiny_dir / f"rt_{name}-hf"))
    assert cfg["architectures"] == [arch]
    converted = convert(hf_converter, str(tiny_dir / f"rt_{name}-hf"), target_dir,
                        str(tiny_dir / f"rt_{name}-converted.gguf"))
    return name, original, converted


def _tensors(path):
    from gguf import GGUFReader

    return {t.name: np.array(t.data) for t in GGUFReader(path, "r").tensors}


def _engine(config, draft, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LlamaDFlashDecoding(config, SpecConfig(draft, **kw))


def test_same_tensors_and_detection(pair, tiny_target):
    _, original, converted = pair
    a, b = _tensors(original), _tensors(converted)
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    target = read_gguf(tiny_target)
    ia, ib = validate_pair(target, read_gguf(original)), validate_pair(target, read_gguf(converted))
    for field in ("algorithm", "target_layers", "block_size", "mask_token_id", "sample_from_anchor",
                  "has_confidence_head", "has_token_embd", "has_output", "reduced_vocab", "is_dflash2"):
        assert getattr(ia, field) == getattr(ib, field), field


def _proposals(config, draft, prompt, **kw):
    with _engine(config, draft, draft_n_max=BLOCK - 1, **kw) as eng:
        p = eng._dflash
        eng.target.clear()
        p.clear()
        prefill(eng.target, prompt[:-1], p.inject)
        p.flush()
        n_past = len(prompt) - 1
        return [p.propose(int(anchor), n_past, BLOCK - 1) for anchor in prompt[-6:]]


@pytest.mark.parametrize("n_draft", [3, "auto"])
def test_same_proposals_and_acceptance(pair, tiny_config, reference, n_draft):
    name, original, converted = pair
    prompt, ref = reference
    kw = {"draft_p_min": 0.3} if "conf" in name and "noconf" not in name else {}
    assert _proposals(tiny_config, original, prompt, **kw) == _proposals(tiny_config, converted, prompt, **kw)
    runs = []
    for draft in (original, converted):
        with _engine(tiny_config, draft, draft_n_max=n_draft, **kw) as eng:
            controller = None
            if n_draft == "auto":
                # the adaptive controller on a fixed (GPU-like) cost curve: measured timings would
                # let the two runs pick different lengths on a busy machine
                from llama_dflash.adaptive import AdaptiveController, FixedCosts

                controller = AdaptiveController(eng.draft_info.max_draft_tokens, FixedCosts(
                    verify=lambda k: 0.010 + 0.0002 * k, draft=lambda k: 0.001 + 0.0001 * k))
            res = eng.generate(prompt, len(ref), ignore_eos=True, controller=controller)
            assert res.tokens == ref
            s = res.stats
            runs.append((s.drafted, s.accepted, s.draft_steps, list(s.accepted_per_position)))
    assert runs[0] == runs[1]
    assert runs[0][0] > 0


def test_shipped_smollm2_draft_round_trips(tmp_path, hf_converter):
    """The shipped draft (its reduced head and d2t go out as draft_vocab_size + offsets) through a target
    directory rebuilt from SmolLM2's byte-level BPE tokenizer: the same tokenizer comes back, and the
    converted draft (float32; the shipped one may be quantized) drafts and accepts exactly the same."""
    from llama_dflash import OrdinaryDecoding
    from llama_dflash.bench.cli import chat_wrap
    from llama_dflash.defaults import smollm2_path, trained_draft_path
    from llama_dflash.train.hf_target import _tokenizer_fields

    smol, shipped = smollm2_path(), trained_draft_path()
    if shipped is None:
        pytest.skip("no shipped SmolLM2 draft in this checkout")
    export_hf(shipped, str(tmp_path / "hf"))
    write_target_dir(smol, str(tmp_path / "target"))
    converted = convert(hf_converter, str(tmp_path / "hf"), str(tmp_path / "target"), str(tmp_path / "conv.gguf"))
    a, b = _tokenizer_fields(smol), _tokenizer_fields(converted)
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        assert a[key] == b[key], key
    cfg = TargetConfig(smol, n_ctx=512, n_batch=256, n_ubatch=256, n_threads=1)
    with OrdinaryDecoding(cfg) as o:
        prompt = o.tokenize(chat_wrap(smol, "Write a Python function that returns the n-th Fibonacci number."))
        ref = o.generate(prompt, 64, ignore_eos=True).tokens
    runs = []
    for draft in (shipped, converted):
        with _engine(cfg, draft, draft_n_max=4) as eng:
            res = eng.generate(prompt, 64, ignore_eos=True)
        assert res.tokens == ref
        runs.append((res.stats.drafted, res.stats.accepted, list(res.stats.accepted_per_position)))
    assert runs[0] == runs[1]
    assert runs[0][1] > 0


def test_target_dir_refuses_unknown_tokenizers(tmp_path, tiny_target):
    import gguf

    from llama_dflash.writer import copy_fields

    path = str(tmp_path / "wpm.gguf")
    w = gguf.GGUFWriter(path, "llama")
    copy_fields(w, tiny_target, lambda name: name.startswith("llama.") or
                (name.startswith("tokenizer.") and name != "tokenizer.ggml.model"))
    w.add_tokenizer_model("bert")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="'bert' cannot be rebuilt"):
        write_target_dir(path, str(tmp_path / "out"))


def test_cli_export_writes_what_the_converter_needs(tmp_path, tiny_target, tiny_draft, hf_converter):
    """`llama-dflash export --hf-output DIR --hf-target-dir DIR2 --model target.gguf draft.gguf`, then the
    converter: the same tensors come back; --hf-target-dir alone is a CLI error (exit 2)."""
    import subprocess
    import sys

    def export(*args):
        return subprocess.run([sys.executable, "-m", "llama_dflash.cli", "export", *args], capture_output=True,
                              text=True, timeout=120)

    hf, tgt = str(tmp_path / "hf"), str(tmp_path / "tgt")
    r = export(tiny_draft, "--model", tiny_target, "--hf-output", hf, "--hf-target-dir", tgt)
    assert r.returncode == 0, r.stderr
    converted = convert(hf_converter, hf, tgt, str(tmp_path / "conv.gguf"))
    a, b = _tensors(tiny_draft), _tensors(converted)
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
    r = export(tiny_draft, "--model", tiny_target, "--hf-target-dir", tgt)
    assert r.returncode == 2 and "--hf-target-dir needs --hf-output" in r.stderr
