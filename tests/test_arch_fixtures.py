"""Our arch fixtures against llama.cpp's ground truth, and llama.cpp's own random models through
our engine (issue 41).

`test-llama-archs -a ARCH -o DIR` (built by bench/build_cpp_reference.sh) writes a random model of
an architecture with the layout llama.cpp's saver gives it: the reference for
`llama_dflash.testing.targets`, and a source of targets our writers did not make.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess

import pytest

from cpp_steps import StepRecorder, steps_within_budget
from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, TargetConfig
from llama_dflash.bench.cpp_reference import run_cpp_reference
from llama_dflash.errors import UnsupportedTargetError
from llama_dflash.inspect import read_gguf
from llama_dflash.testing.targets import write_target
from llama_dflash.writer import write_random_draft

BIN = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                   "llama-cpp-reference", "build", "bin")
GROUND_TRUTH = ("qwen35", "qwen35moe", "muse-glimmer", "nemotron_h")
PROMPT = "the quick brown fox and the lazy dog is"


def _binary(name: str) -> str:
    path = os.path.join(BIN, name)
    if not os.access(path, os.X_OK):
        pytest.skip(f"{name} not built (bench/build_cpp_reference.sh)")
    return path


@pytest.fixture(scope="module")
def llama_cpp_models(tmp_path_factory):
    """arch -> the model test-llama-archs writes for it (qwen4exp included)."""
    tool = _binary("test-llama-archs")
    out = {}
    for arch in (*GROUND_TRUTH, "qwen4exp"):
        d = tmp_path_factory.mktemp(arch)
        r = subprocess.run([tool, "-a", f"^{arch}$", "-o", str(d)], capture_output=True, text=True, timeout=300)
        files = glob.glob(str(d / "*.gguf"))
        assert r.returncode == 0 and len(files) == 1, r.stderr[-2000:]
        out[arch] = files[0]
    return out


# test-llama-archs writes every optional tensor the loader knows (scales, biases); a fused
# gate/up expert tensor is the same as separate gate and up ones to the loader
_OPTIONAL = re.compile(r"\.(scale|input_scale|bias)$")
_SAME = {"ffn_gate_up_exps.weight": ("ffn_gate_exps.weight", "ffn_up_exps.weight")}


def _layer_names(path: str, layer: int) -> set[str]:
    info = read_gguf(path)
    prefix = f"blk.{layer}."
    names = set()
    for name in info.tensor_names:
        if name.startswith(prefix) and not _OPTIONAL.search(name):
            short = name[len(prefix):]
            names.update(_SAME.get(short, (short,)))
    return names


@pytest.mark.parametrize("arch", GROUND_TRUTH)
def test_our_layouts_are_llama_cpps(arch, llama_cpp_models, tmp_path):
    """Layer for layer (the first layers of both follow the same kind pattern), our fixture has
    the tensors llama.cpp's own saver writes for the architecture, apart from optional ones."""
    ours = write_target(str(tmp_path / "t.gguf"), arch).path
    theirs = llama_cpp_models[arch]
    n = read_gguf(theirs).n_layer
    for layer in range(n):
        assert _layer_names(ours, layer) == _layer_names(theirs, layer), f"blk.{layer}"
    globals_ = {t for t in read_gguf(theirs).tensor_names if not t.startswith("blk.") and not _OPTIONAL.search(t)}
    assert globals_ <= read_gguf(ours).tensor_names


@pytest.mark.parametrize("arch", GROUND_TRUTH)
def test_llama_cpps_random_models_run_with_the_cpp_drivers_counts(arch, llama_cpp_models, tmp_path):
    """A target we did not write (llama.cpp's test tokenizer, its saver's metadata) with a draft:
    greedy output as ordinary decoding, the C++ driver's steps."""
    target = llama_cpp_models[arch]
    draft = write_random_draft(str(tmp_path / "d.gguf"), target, seed=3)
    cfg = TargetConfig(target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
    with OrdinaryDecoding(cfg) as o:
        ref = o.generate(o.tokenize(PROMPT), 32).tokens
    with LlamaDFlashDecoding(cfg, SpecConfig(draft, draft_n_max=4)) as eng:
        rec = StepRecorder(eng.proposer)
        eng.use_proposer(rec)
        res = eng.generate(eng.tokenize(PROMPT), 32)
    assert res.tokens == ref
    cpp = run_cpp_reference(_binary("llama-speculative-simple"), target, draft, PROMPT, n_predict=32, draft_n_max=4,
                            draft_p_min=0.0, n_ctx=256, n_batch=64, n_ubatch=64, threads=2, repack=False,
                            timeout=300, timed=False)
    theirs = steps_within_budget(cpp.steps, 32)
    assert len(theirs) > 3 and rec.steps[: len(theirs)] == theirs


def test_a_qwen4exp_target_gets_a_clear_refusal_for_a_draft(llama_cpp_models, tmp_path):
    """qwen4exp always carries hyper-connections (llama.cpp refuses a count <= 1), so its layer
    inputs are wider than n_embd: llama.cpp's C++ driver aborts on such a pair; we refuse it,
    naming the field and what works instead."""
    target = llama_cpp_models["qwen4exp"]
    draft = write_random_draft(str(tmp_path / "d.gguf"), target, seed=3)
    cfg = TargetConfig(target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
    with pytest.raises(UnsupportedTargetError, match=r"qwen4exp\.hyper_connection\.count.*n-gram"):
        LlamaDFlashDecoding(cfg, SpecConfig(draft, draft_n_max=4))
