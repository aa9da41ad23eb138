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
            res = eng.generate(prompt, len(ref), ignore_eos=True)
            assert res.tokens == ref
            s = res.stats
            runs.append((s.drafted, s.accepted, s.draft_steps, list(s.accepted_per_position)))
    assert runs[0] == runs[1]
    assert runs[0][0] > 0
