"""`llama-dflash doctor TARGET [DRAFT...]`: will this pair work here, and what must a draft do to pay?

In seconds and without decoding a sequence, it answers what a user otherwise learns from a failed
or disappointing run:

* every check the engine makes on the files (`inspect`: the target's structure and keys llama.cpp
  asserts on, each draft against the target), as "pass" or the exact field with a fix;
* what the target is: architecture, recurrent/hybrid (how a rejected draft is rolled back),
  sliding-window attention, MTP heads, vocabulary, which layers a draft can read;
* which speculators apply to it and which do not, with why (`bench.compare.applicable_speculators`,
  the list `bench --compare-speculators` measures);
* the backend and offload this llama.cpp build can do;
* after a short cost probe (a few target decodes of k+1 rows against single decodes, and a draft
  block where a draft fits), the break-even tau per draft length: a step that drafts k tokens
  costs `c(k)` ordinary decodes, so a draft must average more than `c(k)` tokens per step to pay.

Nothing here decodes a sequence: the probe decodes a short fixed prompt and times single batches.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

from .draft_models import (AnyDraftInfo, SimpleDraftInfo, check_vocab_files, draft_summary, guess_algorithm,
                           resolve_draft)
from .errors import DFlashError, IncompatibleModelError, UnsupportedTargetError
from .inspect import (LAYER_INPUT_ARCHS, RS_ROLLBACK_ARCHS, GGUFInfo, check_gguf_file, target_layer_limit,
                      validate_target)
from .proposers.factory import draft_model_ceiling

__all__ = ["Check", "Diagnosis", "diagnose", "format_diagnosis", "PROBE_PROMPT"]

#: what the cost probe decodes before timing (any text: only the batch shapes matter)
PROBE_PROMPT = "The quick brown fox jumps over the lazy dog. " * 4
MAX_PROBE_K = 8


@dataclass
class Check:
    """One check: `status` "pass" or "fail"; on a failure the field, what was found and a fix."""

    subject: str
    status: str
    detail: str
    fix: str = ""


@dataclass
class Diagnosis:
    target: str
    facts: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    applies: list[dict[str, str]] = field(default_factory=list)
    not_applicable: list[dict[str, str]] = field(default_factory=list)
    backend: dict[str, Any] = field(default_factory=dict)
    break_even: list[dict[str, Any]] = field(default_factory=list)  # per k: step cost in ordinary decodes
    probe: dict[str, Any] = field(default_factory=dict)  # how the probe went, or why it did not run

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "ok": self.ok, "facts": self.facts, "checks": [asdict(c) for c in self.checks],
                "speculators": {"apply": self.applies, "do_not_apply": self.not_applicable},
                "backend": self.backend, "break_even": self.break_even, "probe": self.probe}


# ---- the checks -------------------------------------------------------------------------------------

def _fix(err: DFlashError, draft: bool) -> str:
    """What to do about a failed check, from the field it names."""
    f = getattr(err, "field", "") or ""
    if isinstance(err, UnsupportedTargetError) or (not draft and f == "general.architecture"):
        return ("this architecture cannot hand its layer inputs to a DFlash/DSpark draft or an EAGLE-3 head: use "
                "the n-gram types or lookup (--spec-type ngram-mod, lookup, auto), a classic draft model "
                "(draft-simple), or draft-mtp where the file has an MTP head")
    if draft and ("embedding_length" in f or "token" in f or "vocab" in f or "d2t" in f or "target_layers" in f):
        return ("the draft was made for another target: use the draft trained for this one, or train one "
                "(llama-dflash train --target THIS.gguf, see docs/training.md)")
    if draft and f == "general.architecture":
        return ("this is not a draft doctor can use here (dflash, eagle3, or a classic draft model): pass it as the "
                "target, or give a DFlash/DSpark draft, an EAGLE-3 head or a model with the target's vocabulary")
    return ("the file does not hold what llama.cpp expects there: convert it again with llama.cpp's "
            "convert_hf_to_gguf.py from the same llama-cpp-python release")


def _failed(subject: str, err: Exception, draft: bool) -> Check:
    if isinstance(err, IncompatibleModelError):
        detail = f"{err.field} is {err.found!r}, expected {err.expected}"
        return Check(subject, "fail", detail, _fix(err, draft))
    return Check(subject, "fail", str(err), _fix(err, draft) if isinstance(err, DFlashError) else "")


def _describe(info: GGUFInfo) -> dict[str, Any]:
    """What the header says about the target (the loaded model adds recurrent/hybrid)."""
    from .proposers.mtp import mtp_layers

    arch = info.architecture
    swa = info.get(f"{arch}.attention.sliding_window")
    facts: dict[str, Any] = {
        "file": info.basename, "architecture": arch, "name": info.name, "file_type": info.file_type,
        "layers": info.n_layer, "n_embd": info.n_embd, "vocabulary": info.n_vocab, "context_train": info.n_ctx_train,
        "sliding_window": int(swa) if isinstance(swa, int) and not isinstance(swa, bool) and swa > 0 else None,
        "mtp_heads": mtp_layers(info),
        "layer_extraction": arch in LAYER_INPUT_ARCHS,
    }
    if facts["layer_extraction"]:
        facts["draft_layer_ids"] = [0, target_layer_limit(info)]
    return facts


def _model_facts(model: Any) -> dict[str, Any]:
    from llama_cpp import llama_cpp as ll

    return {"recurrent": bool(ll.llama_model_is_recurrent(model.ptr)), "hybrid": bool(ll.llama_model_is_hybrid(model.ptr))}


def _rollback(facts: dict[str, Any]) -> str:
    if not (facts.get("recurrent") or facts.get("hybrid")):
        return "cut (attention cache: a rejected draft is removed by position)"
    if facts["architecture"] in RS_ROLLBACK_ARCHS:
        return "native (llama.cpp's per-token recurrent snapshots), checkpoint + replay as the fallback"
    return "checkpoint + replay (the recurrent state is saved before each verification)"


# ---- the cost probe ---------------------------------------------------------------------------------

def _median_seconds(fn: Any, repeats: int) -> float:
    times = []
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        fn()
        if r:  # the first round warms the batch shape up
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _probe_verify(ordinary: Any, prompt: list[int], ks: Sequence[int], repeats: int) -> tuple[float, dict[int, float]]:
    """(one decode, {k: verify of k+1 rows}) timed on a cache holding the prompt, cleared and decoded
    again before every timing: works on recurrent caches too, which cannot be cut at a position."""
    target = ordinary.target
    n_past, tok = len(prompt), prompt[-1]

    def timed(rows: int) -> float:
        def once() -> None:
            target.decode([tok] * rows, n_past, logits="all" if rows > 1 else "last")
            target.logits_row(0)

        times = []
        for r in range(repeats + 1):
            target.clear()
            target.decode(prompt, 0, logits="none")
            t0 = time.perf_counter()
            once()
            if r:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    try:
        one = timed(1)
        return one, {k: timed(k + 1) for k in ks}
    finally:
        target.clear()


def _break_even(ordinary: float, verify: dict[int, float], draft: dict[int, float]) -> list[dict[str, Any]]:
    rows = []
    for k in sorted(verify):
        v = verify[k] / ordinary
        d = draft.get(k)
        row: dict[str, Any] = {"k": k, "verify_cost": v, "token_drafter_tau": max(1.0, v)}
        if d is not None:
            row["draft_cost"] = d / ordinary
            row["draft_model_tau"] = max(1.0, v + d / ordinary)
        rows.append(row)
    return rows


# ---- all of it --------------------------------------------------------------------------------------

def diagnose(target: str, drafts: Sequence[str] = (), *, probe: bool = True, n_gpu_layers: int = -1,
             n_threads: Optional[int] = None, repeats: int = 3) -> Diagnosis:
    """Check `target` (and each of `drafts` against it) and, with `probe`, time the break-even tau.

    Raises only for a target file that cannot be read at all (missing, not a file); every other
    problem is a failed `Check`."""
    from .bench.backend import backend_info
    from .bench.compare import applicable_speculators

    if not os.path.isfile(target):
        raise FileNotFoundError(f"no such file: {target}")
    diag = Diagnosis(target)
    try:
        info = check_gguf_file(target)
    except DFlashError as err:
        diag.checks.append(_failed(f"target {os.path.basename(target)}", err, draft=False))
        return diag
    diag.checks.append(Check(f"target {info.basename}", "pass",
                             "the file's structure, tensors and the keys llama.cpp asserts on"))
    diag.facts = _describe(info)
    try:
        validate_target(info)
        diag.checks.append(Check("DFlash/DSpark target", "pass",
                                 f"{info.architecture} exposes its layer inputs: a draft can attach"))
    except DFlashError as err:
        # not a failure of the pair: the token-only speculators still apply
        why = (f"{info.architecture}'s llama.cpp graph exposes no layer inputs for a draft to read"
               if info.architecture not in LAYER_INPUT_ARCHS else str(getattr(err, "expected", err)))
        diag.facts["dflash_target"] = why
        diag.not_applicable.append({"name": "draft-dflash, draft-dspark, DFlash2 drafts", "reason": why})
        diag.not_applicable.append({"name": "draft-eagle3", "reason": why})
    valid: list[AnyDraftInfo] = []
    for path in drafts:
        label = f"draft {os.path.basename(path)}"
        try:
            d = resolve_draft(info, path, guess_algorithm(path))
            if isinstance(d, SimpleDraftInfo):  # llama.cpp's vocabulary rule, on the loaded vocabularies
                check_vocab_files(info.path, path)
        except (DFlashError, OSError) as err:
            diag.checks.append(_failed(label, err, draft=True))
            continue
        valid.append(d)
        diag.checks.append(Check(label, "pass", draft_summary(d)))
    cands, skipped = applicable_speculators(target, [d.path for d in valid])
    diag.applies = [{"name": c.name, "spec_type": ",".join(c.spec.spec_types)} for c in cands]
    diag.not_applicable += [{"name": n, "reason": why} for n, why in skipped if not any(
        os.path.basename(p) == n for p in drafts)]  # a misfit draft is a failed check above already
    be = backend_info()
    diag.backend = {"summary": be.summary(), "gpu_offload": be.gpu_offload,
                    "offload": ("all layers on the GPU" if n_gpu_layers < 0 else f"{n_gpu_layers} layers on the GPU")
                    if be.gpu_offload and n_gpu_layers != 0 else "CPU only" +
                    ("" if be.gpu_offload else " (this build has no GPU backend: see docs/gpus.md)")}
    _load_and_probe(diag, info, valid, probe=probe and diag.ok, n_gpu_layers=n_gpu_layers, n_threads=n_threads,
                    repeats=repeats)
    return diag


def _load_and_probe(diag: Diagnosis, info: GGUFInfo, drafts: list[AnyDraftInfo], *, probe: bool, n_gpu_layers: int,
                    n_threads: Optional[int], repeats: int) -> None:
    from ._llama import Model
    from .bench.probe import probe_step_costs
    from .config import SpecConfig, TargetConfig
    from .engine import LlamaDFlashDecoding, OrdinaryDecoding

    t0 = time.perf_counter()
    model = Model(info.path, n_gpu_layers=n_gpu_layers)
    try:
        diag.facts.update(_model_facts(model))
        diag.facts["rollback"] = _rollback(diag.facts)
        if not probe:
            diag.probe = {"ran": False, "why": "--no-probe" if diag.ok else "a check failed"}
            return
        cfg = TargetConfig(info.path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=n_threads,
                           n_gpu_layers=n_gpu_layers)
        k_max = min(MAX_PROBE_K, max([draft_model_ceiling(d) for d in drafts], default=4))
        ks = list(range(1, k_max + 1))
        with OrdinaryDecoding(cfg, model=model) as ordinary:
            prompt = ordinary.tokenize(PROBE_PROMPT)[:48]
            draft_costs: dict[int, float] = {}
            costs = None
            attention = not (diag.facts.get("recurrent") or diag.facts.get("hybrid"))
            if drafts and attention:
                # the bench's own probe: verify and draft block timed in the same rounds
                first = drafts[0]
                with LlamaDFlashDecoding(cfg, SpecConfig(first.path, spec_type=first.kind,
                                                         draft_n_max=draft_model_ceiling(first)), model=model) as dec:
                    costs = probe_step_costs(dec, prompt, ks, repeats=repeats, ordinary=ordinary)
            if costs is not None and costs.ordinary:
                one, verify, draft_costs = costs.ordinary, costs.verify, costs.draft
                how = f"verify and draft block of {os.path.basename(drafts[0].path)} timed in the same rounds"
            else:
                one, verify = _probe_verify(ordinary, prompt, ks, repeats)
                how = "target verification timed" + (" (recurrent target: the draft block is not timed)"
                                                     if drafts else "")
        diag.break_even = _break_even(one, verify, draft_costs)
        diag.probe = {"ran": True, "how": how, "ordinary_decode_ms": 1e3 * one, "repeats": repeats,
                      "seconds": time.perf_counter() - t0}
    finally:
        model.close()


# ---- text -------------------------------------------------------------------------------------------

def _yes(v: Any) -> str:
    return "yes" if v else "no"


def format_diagnosis(diag: Diagnosis) -> str:
    f = diag.facts
    lines = [f"llama-dflash doctor: {os.path.basename(diag.target)}", ""]
    if f:
        kind = "hybrid: attention + recurrent" if f.get("hybrid") else "recurrent" if f.get("recurrent") \
            else "attention only"
        lines += ["target",
                  f"  architecture      {f['architecture']} ({kind}), {f['layers']} layers, n_embd {f['n_embd']}, "
                  f"{f['file_type']}",
                  f"  vocabulary        {f['vocabulary']} tokens; trained context {f['context_train']}",
                  f"  sliding window    {f['sliding_window'] or 'none'}",
                  f"  MTP heads         {f['mtp_heads'] or 'none'}",
                  "  layer extraction  " + (f"yes: a draft may read layer ids {f['draft_layer_ids'][0]}.."
                                            f"{f['draft_layer_ids'][1]}" if f["layer_extraction"] else
                                            f"no: {f.get('dflash_target', 'llama.cpp exposes no layer inputs')}")]
        if "rollback" in f:
            lines.append(f"  rollback          {f['rollback']}")
        lines.append("")
    lines.append("checks")
    for c in diag.checks:
        lines.append(f"  {'pass' if c.status == 'pass' else 'FAIL'}  {c.subject}: {c.detail}")
        if c.fix:
            lines.append(f"        fix: {c.fix}")
    if diag.applies or diag.not_applicable:
        lines += ["", "speculators (--spec-type)"]
        for a in diag.applies:
            lines.append(f"  applies       {a['name']}")
        for n in diag.not_applicable:
            lines.append(f"  does not     {n['name']}: {n['reason']}")
    if diag.backend:
        lines += ["", "backend", f"  {diag.backend['summary']}", f"  offload: {diag.backend['offload']}"]
    if diag.break_even:
        p = diag.probe
        lines += ["", f"break-even on this machine (one ordinary decode {p['ordinary_decode_ms']:.2f} ms; {p['how']})",
                  "  a step that drafts k tokens costs c(k) ordinary decodes: a speculator pays where its tau "
                  "(tokens per step) is above c(k)",
                  f"  {'k':>3} {'verify k+1':>11} {'draft block':>12} {'tau to pay':>11}"]
        for r in diag.break_even:
            d = r.get("draft_cost")
            tau = r.get("draft_model_tau", r["token_drafter_tau"])
            never = "  (above k+1: no draft of this length can pay)" if tau >= r["k"] + 1 else ""
            lines.append(f"  {r['k']:>3} {r['verify_cost']:>11.2f} {f'{d:.2f}' if d is not None else '-':>12} "
                         f"{tau:>11.2f}{never}")
        first = diag.break_even[0]
        tau1 = first.get("draft_model_tau", first["token_drafter_tau"])
        who = "a draft" if "draft_model_tau" in first else "a speculator"
        lines.append(f"  {who} must average {tau1:.2f} tokens per step at k=1 to pay here"
                     + (" (at most 2 are possible at k=1)" if tau1 >= 2 else "")
                     + ("; n-gram types and lookup draft for almost nothing: the verify column is their bar"
                        if "draft_model_tau" in first else ""))
    elif diag.probe:
        lines += ["", f"break-even: not measured ({diag.probe.get('why', '')})"]
    lines += ["", "verdict: " + ("ok" if diag.ok else "a check failed: see the fix above")]
    return "\n".join(lines)
