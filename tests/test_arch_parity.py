"""The preview's own architectures, step for step against llama.cpp's C++ driver (issue 41).

For each architecture (qwen35 with its MTP block, qwen35moe with its MTP block, muse-glimmer,
nemotron_h, gemma4: `llama_dflash.testing.targets`) and each drafter (rigged DFlash, DSpark and
DFlash2 drafts: `llama_dflash.testing.drafts`; a reduced-vocabulary DSpark draft (`d2t`); DSpark
with its confidence head cutting blocks short (p_min 0.6); the target's MTP head where it has
one), at draft tokens 1, 4 and 7, with and without --ignore-eos:

* our loop takes the same steps as `llama-speculative-simple` -- the same tokens drafted and
  accepted at every verification (`cpp_steps`);
* the output is the ordinary greedy output;
* acceptance is strictly between 0 and 1, so accepted rows, partial cuts and rollbacks happened;
* on the hybrid targets (gated delta net, Mamba-2) with both rollback strategies: native
  recurrent snapshots and checkpoints with replay.
"""

from __future__ import annotations

import os
from functools import lru_cache

import pytest

from cpp_steps import StepRecorder, steps_within_budget
from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, TargetConfig
from llama_dflash.bench.cpp_reference import run_cpp_reference
from llama_dflash.testing.drafts import DRAFT_KINDS, write_rigged_draft
from llama_dflash.testing.targets import ARCHS, MTP_ARCHS, write_target


def _cpp_binary():
    path = os.environ.get("LLAMA_SPECULATIVE_SIMPLE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "llama-cpp-reference", "build", "bin", "llama-speculative-simple")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


PROMPT = "the quick brown fox and the lazy dog is"
N_PREDICT = 64
HYBRID = ("qwen35", "qwen35moe", "nemotron_h")
KINDS = {arch: DRAFT_KINDS + ("dspark-d2t", "dspark-pmin") + (("mtp",) if arch in MTP_ARCHS else ())
         for arch in ARCHS}
P_MIN = {"dspark-pmin": 0.6}
CASES = [(arch, kind, rollback) for arch in ARCHS for kind in KINDS[arch]
         for rollback in (("native", "checkpoint") if arch in HYBRID else ("auto",))]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("archs")

    @lru_cache(maxsize=None)
    def get(arch: str) -> tuple[str, dict[str, str]]:
        fx = write_target(str(root / f"{arch}.gguf"), arch, mtp=arch in MTP_ARCHS)
        drafts = {kind: write_rigged_draft(str(root / f"{arch}.{kind}.gguf"), fx, kind) for kind in DRAFT_KINDS}
        drafts["dspark-d2t"] = write_rigged_draft(str(root / f"{arch}.d2t.gguf"), fx, "dspark", draft_vocab=150)
        drafts["dspark-pmin"] = drafts["dspark"]
        return fx.path, drafts

    return get


def _config(path: str) -> TargetConfig:
    return TargetConfig(path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2)


def _spec(kind: str, drafts: dict[str, str], k: int, rollback: str) -> SpecConfig:
    if kind == "mtp":
        return SpecConfig(spec_type="draft-mtp", draft_n_max=k, rollback=rollback)
    return SpecConfig(drafts[kind], draft_n_max=k, rollback=rollback, draft_p_min=P_MIN.get(kind, 0.0))


@pytest.fixture(scope="module")
def ordinary(files):
    @lru_cache(maxsize=None)
    def get(arch: str, ignore_eos: bool) -> tuple[int, ...]:
        with OrdinaryDecoding(_config(files(arch)[0])) as eng:
            return tuple(eng.generate(eng.tokenize(PROMPT), N_PREDICT, ignore_eos=ignore_eos).tokens)

    return get


@pytest.fixture(scope="module")
def cpp(files):
    binary = _cpp_binary()
    if binary is None:
        pytest.skip("llama-speculative-simple not built (bench/build_cpp_reference.sh, or set LLAMA_SPECULATIVE_SIMPLE)")

    @lru_cache(maxsize=None)
    def get(arch: str, kind: str, k: int, ignore_eos: bool) -> tuple[tuple[int, int], ...]:
        target, drafts = files(arch)
        draft = None if kind == "mtp" else drafts[kind]
        types = ["draft-mtp"] if kind == "mtp" else None
        res = run_cpp_reference(binary, target, draft, PROMPT, n_predict=N_PREDICT, draft_n_max=k,
                                draft_p_min=P_MIN.get(kind, 0.0),
                                n_ctx=512, n_batch=64, n_ubatch=64, threads=2, repack=False, ignore_eos=ignore_eos,
                                spec_types=types, timeout=300, timed=False)
        return tuple(steps_within_budget(res.steps, N_PREDICT))

    return get


@pytest.mark.parametrize("ignore_eos", [False, True], ids=["eos", "ignore-eos"])
@pytest.mark.parametrize("k", [1, 4, 7])
@pytest.mark.parametrize("arch,kind,rollback", CASES)
def test_same_steps_as_the_cpp_driver(files, ordinary, cpp, arch, kind, rollback, k, ignore_eos):
    target, drafts = files(arch)
    with LlamaDFlashDecoding(_config(target), _spec(kind, drafts, k, rollback)) as eng:
        recorder = StepRecorder(eng.proposer)
        eng.use_proposer(recorder)
        res = eng.generate(eng.tokenize(PROMPT), N_PREDICT, ignore_eos=ignore_eos)
        stats = eng.last_stats
    theirs = cpp(arch, kind, k, ignore_eos)
    assert len(theirs) > 5, theirs
    assert recorder.steps[: len(theirs)] == list(theirs)
    assert tuple(res.tokens) == ordinary(arch, ignore_eos)
    accepted, drafted = sum(a for a, _ in theirs), sum(d for _, d in theirs)
    assert 0 < accepted < drafted, "acceptance must be partial: accepted rows and rejections both"
    assert stats.rollbacks > 0
    if arch in HYBRID:
        assert stats.rollback_mode == rollback
