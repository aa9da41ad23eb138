"""`draft-simple` (a classic draft model) and `draft-eagle3` (an EAGLE-3 head), issue 44 items 1 and 4.

On a rigged llama target with a rigged classic draft and EAGLE-3 head (`llama_dflash.testing`:
both follow the target's successor map and depend on more than the last token, so acceptance is
partial by construction and a draft fed the wrong rows drafts differently):

* the same steps as llama.cpp's `llama-speculative-simple --spec-type X` -- the same tokens drafted
  and accepted at every verification -- at draft tokens 1, 4 and 7, with and without --ignore-eos;
  the output is ordinary greedy decoding; acceptance strictly between 0 and 1;
* greedy identity alone, in chains (with the n-gram types, the lookup and the target's MTP head),
  under `auto`, in the drop-in `Llama` against `llama_cpp.Llama` (state saved and restored), the
  `generate` and `bench` CLIs, `serve` and the batched engine (`serve --parallel N`);
* files that cannot work are refused with an error naming the field, before llama.cpp sees them
  (and as one line with exit code 2 in the CLI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache

import llama_cpp
import numpy as np
import pytest

from cpp_steps import StepRecorder, steps_within_budget
from llama_dflash import Llama, LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, SpeculativeType, TargetConfig
from llama_dflash.bench.cpp_reference import run_cpp_reference
from llama_dflash.errors import IncompatibleModelError, UnsupportedTargetError
from llama_dflash.testing.ar_drafts import write_rigged_eagle3, write_rigged_simple_draft
from llama_dflash.testing.targets import write_target
from llama_dflash.writer import write_tiny_target

PROMPT = "the quick brown fox and the lazy dog is"
N_PREDICT = 64
SEED = 5  # a llama fixture whose greedy path has no near-tie (a batched verification rounds differently)
KINDS = ("draft-simple", "draft-eagle3")


def _cpp_binary():
    path = os.environ.get("LLAMA_SPECULATIVE_SIMPLE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "llama-cpp-reference", "build", "bin", "llama-speculative-simple")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("ar")
    fx = write_target(str(root / "llama.gguf"), "llama", seed=SEED)
    return {"target": fx.path, "fx": fx, "root": root,
            "draft-simple": write_rigged_simple_draft(str(root / "simple.gguf"), fx),
            "draft-eagle3": write_rigged_eagle3(str(root / "eagle3.gguf"), fx)}


def _cfg(path: str) -> TargetConfig:
    return TargetConfig(path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)


@pytest.fixture(scope="module")
def ordinary(files):
    @lru_cache(maxsize=None)
    def get(ignore_eos: bool, path: str = "") -> tuple[int, ...]:
        with OrdinaryDecoding(_cfg(path or files["target"])) as eng:
            return tuple(eng.generate(eng.tokenize(PROMPT), N_PREDICT, ignore_eos=ignore_eos).tokens)

    return get


# ---- the C++ driver's counts ------------------------------------------------------------------------

@pytest.mark.parametrize("ignore_eos", [False, True], ids=["eos", "ignore-eos"])
@pytest.mark.parametrize("k", [1, 4, 7])
@pytest.mark.parametrize("kind", KINDS)
def test_same_steps_as_the_cpp_driver(files, ordinary, kind, k, ignore_eos):
    binary = _cpp_binary()
    if binary is None:
        pytest.skip("llama-speculative-simple not built (bench/build_cpp_reference.sh, or set LLAMA_SPECULATIVE_SIMPLE)")
    spec = SpecConfig(spec_type=kind, draft_model=files[kind], draft_n_max=k)
    with LlamaDFlashDecoding(_cfg(files["target"]), spec) as eng:
        recorder = StepRecorder(eng.proposer)
        eng.use_proposer(recorder)
        res = eng.generate(eng.tokenize(PROMPT), N_PREDICT, ignore_eos=ignore_eos)
        stats = eng.last_stats
    cpp = run_cpp_reference(binary, files["target"], files[kind], PROMPT, n_predict=N_PREDICT, draft_n_max=k,
                            draft_p_min=0.0, n_ctx=512, n_batch=64, n_ubatch=64, threads=1, repack=False,
                            ignore_eos=ignore_eos, spec_types=[kind], timeout=300, timed=False)
    theirs = steps_within_budget(cpp.steps, N_PREDICT)
    assert len(theirs) > 5, theirs
    assert recorder.steps[: len(theirs)] == theirs
    assert tuple(res.tokens) == ordinary(ignore_eos)
    accepted, drafted = sum(a for a, _ in theirs), sum(d for _, d in theirs)
    assert 0 < accepted < drafted, "acceptance must be partial: accepted rows and rejections both"
    assert stats.rollbacks > 0 and stats.algorithm == kind


def test_p_min_cuts_drafts_as_the_cpp_driver_does(files):
    """With p_min the drafts stop at the first position whose top-10 probability is below it."""
    binary = _cpp_binary()
    if binary is None:
        pytest.skip("llama-speculative-simple not built (bench/build_cpp_reference.sh, or set LLAMA_SPECULATIVE_SIMPLE)")
    for kind in KINDS:
        spec = SpecConfig(spec_type=kind, draft_model=files[kind], draft_n_max=7, draft_p_min=0.3)
        with LlamaDFlashDecoding(_cfg(files["target"]), spec) as eng:
            recorder = StepRecorder(eng.proposer)
            eng.use_proposer(recorder)
            eng.generate(eng.tokenize(PROMPT), N_PREDICT)
        cpp = run_cpp_reference(binary, files["target"], files[kind], PROMPT, n_predict=N_PREDICT, draft_n_max=7,
                                draft_p_min=0.3, n_ctx=512, n_batch=64, n_ubatch=64, threads=1, repack=False,
                                spec_types=[kind], timeout=300, timed=False)
        theirs = steps_within_budget(cpp.steps, N_PREDICT)
        assert recorder.steps[: len(theirs)] == theirs, kind
        drafted = [d for _, d in theirs]
        assert 0 < sum(drafted) and any(0 < d < 7 for d in drafted), kind  # cut by p_min, not by n_max


# ---- greedy identity everywhere ---------------------------------------------------------------------

@pytest.mark.parametrize("spec_type", ["ngram-simple,draft-simple", "lookup,draft-eagle3", "auto,draft-simple",
                                       "auto,draft-eagle3"])
def test_chains_and_auto_keep_the_greedy_output(files, ordinary, spec_type):
    kind = next(k for k in KINDS if k in spec_type)
    spec = SpecConfig(files[kind], spec_type=spec_type, draft_n_max=4)
    with LlamaDFlashDecoding(_cfg(files["target"]), spec) as eng:
        assert eng.speculator_names[-1] == kind
        res = eng.generate(eng.tokenize(PROMPT), N_PREDICT)
        stats = eng.last_stats
    assert tuple(res.tokens) == ordinary(False)
    assert stats.algorithm == spec_type
    assert stats.speculators[kind]["draft_calls"] > 0


@pytest.mark.parametrize("kind", KINDS)
def test_with_the_mtp_head_on_a_hybrid_target(tmp_path, kind):
    """draft-simple and draft-eagle3 come before draft-mtp in llama.cpp's priority; the MTP head
    joins either, on a qwen35 target (gated delta net: rolled back natively)."""
    fx = write_target(str(tmp_path / "qwen35.gguf"), "qwen35", mtp=True)
    draft = (write_rigged_simple_draft if kind == "draft-simple" else write_rigged_eagle3)(str(tmp_path / "d.gguf"), fx)
    with OrdinaryDecoding(_cfg(fx.path)) as o:
        ref = o.generate(o.tokenize(PROMPT), N_PREDICT).tokens
    spec_type = f"draft-mtp,{kind}"
    with LlamaDFlashDecoding(_cfg(fx.path), SpecConfig(draft, spec_type=spec_type, draft_n_max=4)) as eng:
        assert eng.speculator_names == (kind, "draft-mtp")
        res = eng.generate(eng.tokenize(PROMPT), N_PREDICT)
        stats = eng.last_stats
    assert res.tokens == ref
    assert 0 < stats.accepted < stats.drafted and stats.speculators[kind]["accepted"] > 0


@pytest.mark.parametrize("arch", ["mamba", "gemma3"])
def test_draft_simple_on_targets_without_layer_inputs(tmp_path, arch):
    """A classic draft needs no layer inputs: it drafts for any architecture llama.cpp runs --
    recurrent (mamba: rolled back through checkpoints) and sliding-window attention (gemma3) --
    with ordinary decoding's output; on gemma3 the C++ driver's steps.  (On recurrent targets the
    driver replays a partly accepted draft as the next step's draft: its steps are not ours.)
    The random models of llama.cpp's test-llama-archs share its dummy tokenizer, so a random qwen2
    is a draft for them."""
    from arch_targets import binary, repeat_prompt, write_arch_target

    if binary("test-llama-archs") is None:
        pytest.skip("test-llama-archs not built (run bench/build_cpp_reference.sh, or set LLAMA_CPP_BIN)")
    os.makedirs(tmp_path / "draft")
    draft = write_arch_target("qwen2", str(tmp_path / "draft"), seed=2)
    target = write_arch_target(arch, str(tmp_path))
    text, n = repeat_prompt("zzzzz"), 48
    cfg = TargetConfig(target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    with OrdinaryDecoding(cfg) as o:
        ref = o.generate(o.tokenize(text), n, ignore_eos=True).tokens
    with LlamaDFlashDecoding(cfg, SpecConfig(draft, spec_type="draft-simple", draft_n_max=4)) as eng:
        recorder = StepRecorder(eng.proposer)
        eng.use_proposer(recorder)
        res = eng.generate(eng.tokenize(text), n, ignore_eos=True)
        stats = eng.last_stats
    assert res.tokens == ref and stats.drafted > 0
    assert stats.rollback_mode == ("checkpoint" if arch == "mamba" else "kv")
    binary_cpp = _cpp_binary()
    if arch == "gemma3" and binary_cpp is not None:
        cpp = run_cpp_reference(binary_cpp, target, draft, text, n_predict=n, draft_n_max=4, draft_p_min=0.0, n_ctx=256,
                                n_batch=64, n_ubatch=64, threads=1, repack=False, ignore_eos=True,
                                spec_types=["draft-simple"], timeout=300, timed=False)
        theirs = steps_within_budget(cpp.steps, n)
        assert len(theirs) > 5 and recorder.steps[: len(theirs)] == theirs


def test_the_drop_in_llama_drafts_with_both(files):
    kw = dict(n_ctx=512, n_batch=64, n_threads=1, verbose=False, flash_attn=True)
    ref = llama_cpp.Llama(files["target"], **kw)
    want = ref.create_completion(PROMPT, max_tokens=48, temperature=0.0)["choices"][0]["text"]
    other = ref.create_completion(PROMPT + " and", max_tokens=16, temperature=0.0)["choices"][0]["text"]
    ref.close()
    for member, kind in ((SpeculativeType.DRAFT_SIMPLE, "draft-simple"), (SpeculativeType.DRAFT_EAGLE3, "draft-eagle3")):
        spec = SpecConfig(spec_type=member, draft_model_path=files[kind], draft_n_max=4)
        with Llama(files["target"], speculative=spec, **kw) as llm:
            out = llm.create_completion(PROMPT, max_tokens=48, temperature=0.0)
            preview = llm.last_speculative_stats
            state = llm.save_state()
            assert llm.create_completion(PROMPT + " and", max_tokens=16, temperature=0.0)["choices"][0]["text"] == other
            llm.load_state(state)
            assert llm.speculator.draft_end == state.n_tokens  # the draft's cache came back with the target's
            again = llm.create_completion(PROMPT, max_tokens=48, temperature=0.0)
            assert llm.last_speculative_stats["accepted"] > 0
        assert out["choices"][0]["text"] == want == again["choices"][0]["text"], kind
        assert out["speculative"]["algorithm"] == kind
        assert 0 < preview["accepted"] < preview["drafted"]


def test_generate_and_bench_clis(files, tmp_path):
    r = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "generate", "--model", files["target"],
                        "--draft-model", files["draft-eagle3"], "--spec-type", "draft-eagle3", "--draft-tokens", "4",
                        "--raw-prompt", "--prompt", PROMPT, "--max-tokens", "32", "--threads", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "draft-eagle3" in r.stderr and "accepted" in r.stderr
    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "bench", "--model", files["target"], "--draft-model",
                        files["draft-simple"], "--spec-type", "draft-simple", "--draft-tokens", "4", "--max-tokens",
                        "32", "--runs", "1", "--warmup-tokens", "4", "--raw-prompt", "--prompt", PROMPT, "--threads",
                        "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["comparison"]["output_tokens_match"]
    assert data["speculative"]["stats"]["accepted"] > 0


def test_serve_one_request_at_a_time_and_batched(files):
    """`serve` with each type (a request at a time: `llama_dflash.Llama`) answers as ordinary
    decoding; the batched engine (`serve --parallel N`) drafts for every slot and answers each
    prompt as it is answered alone, with prefix reuse and requests joining mid-generation."""
    from fastapi.testclient import TestClient

    from llama_dflash._llama import Model
    from llama_dflash.batched import BatchedEngine
    from llama_dflash.server.app import create_app

    kw = dict(n_ctx=512, n_batch=64, n_threads=1, verbose=False, flash_attn=True)
    body = {"prompt": PROMPT, "max_tokens": 32, "temperature": 0}
    answers = {}
    for name in ("plain", *KINDS):
        spec = None if name == "plain" else SpecConfig(files[name], spec_type=name, draft_n_max=4)
        llm = Llama(files["target"], speculative=spec, **kw)
        with TestClient(create_app(llm)) as client:
            r = client.post("/v1/completions", json=body)
        llm.close()
        assert r.status_code == 200, r.text
        answers[name] = r.json()
    for kind in KINDS:
        assert answers[kind]["choices"][0]["text"] == answers["plain"]["choices"][0]["text"]
        assert answers[kind]["timings"]["draft_n"] > 0 and answers[kind]["timings"]["draft_n_accepted"] > 0

    texts = [PROMPT, "hello world and the", "a b c d e f g a b c d", "once upon a time there was", "lazy dog is the"]
    model = Model(files["target"])
    prompts = [model.tokenize(t) for t in texts]
    model.close()
    with OrdinaryDecoding(TargetConfig(files["target"], n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1,
                                       flash_attn="on")) as o:
        ref = [o.generate(p, 40).tokens for p in prompts]
    for kind in KINDS:
        spec = SpecConfig(files[kind], spec_type=f"ngram-simple,{kind}", draft_n_max=4)
        with BatchedEngine(files["target"], n_seq=3, n_ctx_seq=256, n_batch=64, n_threads=1, spec=spec) as eng:
            assert eng.generate(prompts, max_tokens=40) == ref, kind  # 5 prompts on 3 slots
            seqs = [eng.submit(p, max_tokens=40) for p in prompts[::-1]]  # prefixes reused, prompt cache
            while not all(s.done for s in seqs):
                eng.step()
            assert [s.output for s in seqs] == ref[::-1], kind
            stats = eng.stats()
        assert stats["draft_blocks"] > 0 and stats["cached_tokens"] > 0 and stats["restored_tokens"] > 0, kind
        assert all(s.stats.accepted > 0 for s in seqs), kind  # drafting resumed on reused and restored prefixes


# ---- refusals --------------------------------------------------------------------------------------

def _simple(files, name, **kw) -> str:
    return write_rigged_simple_draft(str(files["root"] / f"{name}.gguf"), files["fx"], **kw)


def _eagle3(files, name, **kw) -> str:
    return write_rigged_eagle3(str(files["root"] / f"{name}.gguf"), files["fx"], **kw)


@pytest.mark.parametrize("edit,field", [
    (dict(token_edits={270: "zz"}), "tokenizer.ggml.tokens[270]"),
    (dict(extra_tokens=200), "tokenizer.ggml.tokens (vocabulary size)"),
    (dict(bos_token_id=3), "tokenizer.ggml.bos_token_id"),
])
def test_an_incompatible_vocabulary_is_refused_naming_the_field(files, edit, field):
    """llama.cpp's rule: texts equal from id 5, sizes within 128, the same BOS/EOS where added."""
    draft = _simple(files, "vocab-" + field.split(".")[-1].split(" ")[0].replace("[", "").replace("]", ""), **edit)
    with pytest.raises(IncompatibleModelError) as exc:
        LlamaDFlashDecoding(_cfg(files["target"]), SpecConfig(draft, spec_type="draft-simple"))
    assert exc.value.field == field and exc.value.path == draft


def test_small_vocabulary_differences_llama_cpp_allows_are_accepted(files, ordinary):
    """A draft with a few more tokens and a different text below id 5 drafts (llama.cpp's rule)."""
    draft = _simple(files, "vocab-ok", extra_tokens=16, token_edits={3: "<mask2>"})
    with LlamaDFlashDecoding(_cfg(files["target"]), SpecConfig(draft, spec_type="draft-simple", draft_n_max=4)) as eng:
        res = eng.generate(eng.tokenize(PROMPT), 32)
    assert tuple(res.tokens) == ordinary(False)[:32]


def test_eagle3_files_that_cannot_work_are_refused_naming_the_field(files):
    fx, e = files["fx"], files["fx"].n_embd
    cases = {
        "eagle3.target_layers": dict(target_layers=[0, 2]),
        "eagle3.block_count": dict(extra_keys={"eagle3.block_count": 2}),
        "eagle3.target_hidden_size": dict(extra_keys={"eagle3.target_hidden_size": e // 2}),
        "tensor fc.weight shape": dict(tensors={"fc.weight": np.zeros((e, 2 * e), np.float32)}),
        "tensor blk.0.attn_norm_2.weight": dict(tensors={"blk.0.attn_norm_2.weight": None}),
        "eagle3.attention.value_length": dict(extra_keys={"eagle3.attention.value_length": 64}),
    }
    for field, kw in cases.items():
        path = _eagle3(files, "bad-" + field.replace(" ", "-"), **kw)
        with pytest.raises(IncompatibleModelError) as exc:
            LlamaDFlashDecoding(_cfg(files["target"]), SpecConfig(path, spec_type="draft-eagle3"))
        assert exc.value.field == field and exc.value.path == path, field
    deep = _eagle3(files, "bad-layer", target_layers=[0, 1, fx.n_layer])
    with pytest.raises(IncompatibleModelError, match="eagle3.target_layers.*within 0..3"):
        LlamaDFlashDecoding(_cfg(files["target"]), SpecConfig(deep, spec_type="draft-eagle3"))


def test_wrong_kinds_of_files_are_refused(files, tmp_path):
    target = files["target"]
    # a classic draft model without --spec-type draft-simple: its type cannot be told from the file
    with pytest.raises(IncompatibleModelError, match="general.architecture.*draft-simple"):
        LlamaDFlashDecoding(_cfg(target), SpecConfig(files["draft-simple"]))
    # an EAGLE-3 head asked for as draft-simple (it needs a target to run)
    with pytest.raises(IncompatibleModelError, match="general.architecture is 'eagle3'"):
        LlamaDFlashDecoding(_cfg(target), SpecConfig(files["draft-eagle3"], spec_type="draft-simple"))
    # an EAGLE-3 head on a target whose graph hands over no layer inputs
    qwen2 = write_tiny_target(str(tmp_path / "qwen2.gguf"), arch="qwen2", n_embd=files["fx"].n_embd)
    with pytest.raises(UnsupportedTargetError, match="general.architecture is 'qwen2'"):
        LlamaDFlashDecoding(_cfg(qwen2), SpecConfig(files["draft-eagle3"], spec_type="draft-eagle3"))
    # a recurrent classic draft: its state cannot be cut back after a rejection
    lfm2 = write_tiny_target(str(tmp_path / "lfm2.gguf"), arch="lfm2")
    with pytest.raises(IncompatibleModelError, match="attention-only draft model"):
        LlamaDFlashDecoding(_cfg(target), SpecConfig(lfm2, spec_type="draft-simple"))


@pytest.mark.parametrize("args,words", [
    (["--spec-type", "draft-simple", "--draft-model", "VOCAB"], "tokenizer.ggml.tokens[270]"),
    (["--spec-type", "draft-eagle3", "--draft-model", "LAYERS"], "eagle3.target_layers"),
    (["--draft-model", "SIMPLE"], "draft-simple"),
])
def test_cli_refusals_are_one_line_and_exit_2(files, args, words):
    paths = {"VOCAB": _simple(files, "cli-vocab", token_edits={270: "zz"}),
             "LAYERS": _eagle3(files, "cli-layers", target_layers=[0, 2]), "SIMPLE": files["draft-simple"]}
    args = [paths.get(a, a) for a in args]
    r = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "generate", "--model", files["target"], *args,
                        "--prompt", PROMPT, "--max-tokens", "8"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and words in r.stderr


# ---- one table of every speculator -------------------------------------------------------------------

def test_compare_speculators_runs_both_kinds_side_by_side_per_workload(files):
    """`bench --compare-speculators` measures a classic draft and an EAGLE-3 head, alone and behind
    ngram-simple, with the cost model's verdict, and breaks tau / speedup down by workload."""
    from llama_dflash.bench.compare import applicable_speculators, compare_speculators, format_comparison

    cands, skipped = applicable_speculators(files["target"], [files["draft-simple"], files["draft-eagle3"]],
                                            draft_tokens=4, ngram_types=("lookup",))
    names = [c.name for c in cands]
    assert names == ["draft-simple (simple.gguf)", "ngram-simple,draft-simple (simple.gguf)",
                     "draft-eagle3 (eagle3.gguf)", "ngram-simple,draft-eagle3 (eagle3.gguf)", "lookup",
                     "auto,draft-simple"]
    assert [n for n, _ in skipped] == ["draft-mtp"]
    prompts = [PROMPT, "a b c d e f g a b c d e f g a b"]
    result = compare_speculators(_cfg(files["target"]), cands, prompts, max_tokens=24, warmup_tokens=0,
                                 labels=["prose", "copy"])
    table = format_comparison(result)
    data = result.to_dict()
    rows = {row["name"]: row for row in data["speculators"]}
    for name in names[:4]:
        assert rows[name]["output_matches"] and rows[name]["accepted"] > 0, name
        assert rows[name]["verdict"].split(":")[0] in ("pays", "even", "loses") and name in table
    assert set(data["by_workload"]) == {"prose", "copy"} and "by workload (tau / speedup):" in table
    assert data["by_workload"]["prose"]["draft-eagle3 (eagle3.gguf)"]["tau"] > 1.0


def test_doctor_reads_both_kinds(files):
    """`llama-dflash doctor TARGET DRAFT...` checks an EAGLE-3 head and a classic draft, lists them
    among the speculators that apply, and times the break-even with the first one's drafts."""
    from llama_dflash.doctor import diagnose, format_diagnosis

    diag = diagnose(files["target"], [files["draft-eagle3"], files["draft-simple"]], n_threads=1, repeats=1)
    assert diag.ok, format_diagnosis(diag)
    checks = {c.subject: c.detail for c in diag.checks}
    assert "EAGLE-3 head" in checks["draft eagle3.gguf"] and "draft-simple" in checks["draft simple.gguf"]
    applies = [a["name"] for a in diag.applies]
    assert "draft-eagle3 (eagle3.gguf)" in applies and "draft-simple (simple.gguf)" in applies
    assert diag.probe["ran"] and "eagle3.gguf" in diag.probe["how"] and diag.break_even[0]["draft_cost"] is not None
    other = _simple(files, "doctor-vocab", token_edits={270: "zz"})  # llama.cpp's rule, checked before a run
    bad = diagnose(files["target"], [other], probe=False)
    assert not bad.ok and any(c.status == "fail" and "tokenizer.ggml.tokens[270]" in c.detail for c in bad.checks)
