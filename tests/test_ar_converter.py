"""Drafts made by llama.cpp's own converter from the Hugging Face layouts load and run (issue 44 item 1).

An EAGLE-3 head (full and reduced draft vocabulary) and a classic llama draft are written in the
layouts `convert_hf_to_gguf.py` reads (tests/hf_ar_layouts.py), from the rigged fixtures of
tests/test_ar_drafts.py, and converted with `--target-model-dir`.  Each converted file is
detected as what it is, drafts the same steps as `llama-speculative-simple` on the same file,
keeps the greedy output, and where nothing but the layout changed (the full-vocabulary head, the
llama) drafts exactly what the fixture it came from drafts.  A head converted for layers the target
does not have is refused naming the field (llama.cpp's driver aborts the process on it).
"""

from __future__ import annotations

import numpy as np
import pytest

from cpp_steps import StepRecorder, steps_within_budget
from hf_ar_layouts import gguf_tensors, write_hf_eagle3, write_hf_llama, write_target_dir_for
from hf_converter import convert, hf_converter  # noqa: F401  (fixture)
from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, TargetConfig
from llama_dflash.bench.cpp_reference import run_cpp_reference
from llama_dflash.draft_models import Eagle3Info, SimpleDraftInfo, resolve_draft
from llama_dflash.errors import IncompatibleModelError
from llama_dflash.inspect import read_gguf
from llama_dflash.testing.ar_drafts import write_rigged_eagle3, write_rigged_simple_draft
from llama_dflash.testing.targets import write_target
from test_ar_drafts import N_PREDICT, PROMPT, SEED, _cpp_binary

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def converted(tmp_path_factory, hf_converter):
    root = tmp_path_factory.mktemp("arconv")
    fx = write_target(str(root / "llama.gguf"), "llama", seed=SEED)
    head = write_rigged_eagle3(str(root / "eagle3.gguf"), fx)
    simple = write_rigged_simple_draft(str(root / "simple.gguf"), fx)
    tdir = write_target_dir_for(fx.path, str(root / "target-hf"))
    half = range(0, fx.rig.token_embd.shape[0], 2)
    out = {"target": fx.path, "head": head, "simple-source": simple}
    for name, write in (("eagle3", lambda d: write_hf_eagle3(head, fx.path, d)),
                        ("eagle3-d2t", lambda d: write_hf_eagle3(head, fx.path, d, keep=half)),
                        ("eagle3-deep", lambda d: write_hf_eagle3(head, fx.path, d, aux_layers=[0, 2, 7])),
                        ("simple", lambda d: write_hf_llama(simple, fx.path, d))):
        out[name] = convert(hf_converter, write(str(root / f"{name}-hf")), tdir, str(root / f"{name}-conv.gguf"))
    return out


def _cfg(path: str) -> TargetConfig:
    return TargetConfig(path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)


def _steps(target: str, draft: str, kind: str) -> tuple[list[tuple[int, int]], list[int]]:
    with LlamaDFlashDecoding(_cfg(target), SpecConfig(draft, spec_type=kind, draft_n_max=4)) as eng:
        recorder = StepRecorder(eng.proposer)
        eng.use_proposer(recorder)
        res = eng.generate(eng.tokenize(PROMPT), N_PREDICT)
    return recorder.steps, res.tokens


def test_the_converted_files_are_what_they_were_written_from(converted):
    target = read_gguf(converted["target"])
    head, reduced, simple = (resolve_draft(target, converted[n]) if n != "simple" else
                             resolve_draft(target, converted[n], "simple") for n in ("eagle3", "eagle3-d2t", "simple"))
    assert isinstance(head, Eagle3Info) and isinstance(reduced, Eagle3Info) and isinstance(simple, SimpleDraftInfo)
    assert head.target_layers == tuple(int(x) for x in read_gguf(converted["head"]).get("eagle3.target_layers"))
    assert head.reduced_vocab == target.n_vocab and reduced.reduced_vocab == (target.n_vocab + 1) // 2
    # the layout round trip: the decoder comes back as written (q/k permuted there and back); the
    # converter adds the head over the draft vocabulary (d2t, output) the rigged file borrowed
    a, b = gguf_tensors(converted["head"]), gguf_tensors(converted["eagle3"])
    assert set(b) - set(a) == {"d2t", "output.weight"} and all(np.array_equal(a[k], b[k]) for k in a)
    a, b = gguf_tensors(converted["simple-source"]), gguf_tensors(converted["simple"])
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name,kind", [("eagle3", "draft-eagle3"), ("eagle3-d2t", "draft-eagle3"),
                                       ("simple", "draft-simple")])
def test_converted_drafts_take_the_cpp_drivers_steps(converted, name, kind):
    binary = _cpp_binary()
    if binary is None:
        pytest.skip("llama-speculative-simple not built (bench/build_cpp_reference.sh, or set LLAMA_SPECULATIVE_SIMPLE)")
    ours, tokens = _steps(converted["target"], converted[name], kind)
    cpp = run_cpp_reference(binary, converted["target"], converted[name], PROMPT, n_predict=N_PREDICT, draft_n_max=4,
                            draft_p_min=0.0, n_ctx=512, n_batch=64, n_ubatch=64, threads=1, repack=False,
                            spec_types=[kind], timeout=300, timed=False)
    theirs = steps_within_budget(cpp.steps, N_PREDICT)
    assert len(theirs) > 5 and ours[: len(theirs)] == theirs
    accepted, drafted = sum(a for a, _ in theirs), sum(d for _, d in theirs)
    assert 0 < accepted < drafted
    with OrdinaryDecoding(_cfg(converted["target"])) as o:
        assert tokens == o.generate(o.tokenize(PROMPT), N_PREDICT).tokens
    if name != "eagle3-d2t":  # only the layout changed: the same drafts as the file it was written from
        source = converted["head"] if kind == "draft-eagle3" else converted["simple-source"]
        assert ours == _steps(converted["target"], source, kind)[0]


def test_a_head_converted_for_other_layers_is_refused(converted):
    with pytest.raises(IncompatibleModelError) as exc:
        LlamaDFlashDecoding(_cfg(converted["target"]), SpecConfig(converted["eagle3-deep"], spec_type="draft-eagle3"))
    assert exc.value.field == "eagle3.target_layers" and exc.value.found == [0, 2, 7]
