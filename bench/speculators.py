"""Every speculative type side by side: llama.cpp's n-gram types, chains, our lookup and auto.

    . .venv/bin/activate && python bench/speculators.py [--tokens 128] [--prompts 3] [--json PATH]
        [--draft EAGLE3_OR_CLASSIC_DRAFT.gguf ...]

Each --draft (an EAGLE-3 head, a classic draft model with SmolLM2's vocabulary, another
DFlash/DSpark draft) joins the table as its type alone and behind ngram-simple (draft tokens 4).

SmolLM2-135M-Instruct with the shipped DSpark draft, greedy, on prompts the lookup was not tuned
on: the held-out copy-heavy set (edit a function, JSON->YAML, CSV->Markdown, repeat a paragraph
with changes, quote a document, repeat an earlier chat turn), the low-repetition prose workload
and the held-out open chat prompts (llama_dflash/drafts/heldout_chat.jsonl).  For every prompt
all configurations run one after another (interleaved: machine drift hits all of them alike);
outputs are checked against ordinary decoding (a mismatch names the first divergent token: on
this CPU a batched verification and a single-row decode round differently, and where the top two
logits nearly tie the two paths part -- with flash attention on or off, repacked or not).  The table: per workload and configuration,
tau (tokens per verification step), the decode-loop speedup over ordinary decoding (prompt
processing excluded on both sides; the ratio of summed decode seconds over the same tokens),
and the median of the per-prompt ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig  # noqa: E402
from llama_dflash.bench.cli import chat_wrap  # noqa: E402
from llama_dflash.bench.copy_workloads import CONTROL_WORKLOAD, COPY_HEAVY_HELDOUT  # noqa: E402
from llama_dflash.bench.workloads import load_prompt_file, workload_prompts  # noqa: E402
from llama_dflash.config import TargetConfig  # noqa: E402
from llama_dflash.defaults import default_draft_path, smollm2_path  # noqa: E402

#: name -> SpecConfig keywords (the draft file is added where a type needs it)
CONFIGS: dict[str, dict] = {
    "ngram-simple": dict(spec_type="ngram-simple"),
    "ngram-map-k": dict(spec_type="ngram-map-k"),
    "ngram-map-k4v": dict(spec_type="ngram-map-k4v"),
    "ngram-mod": dict(spec_type="ngram-mod"),
    "ngram-cache": dict(spec_type="ngram-cache"),
    "lookup": dict(spec_type="lookup"),
    "draft (auto k)": dict(spec_type="draft-dspark", draft_n_max="auto"),
    "ngram-map-k+draft": dict(spec_type="ngram-map-k,draft-dspark", draft_n_max=4),
    "ngram-simple+draft": dict(spec_type="ngram-simple,draft-dspark", draft_n_max=4),
    "lookup+draft": dict(spec_type="lookup,draft-dspark", draft_n_max=4),
    "auto": dict(spec_type="auto,draft-dspark"),
}


def _draft_kind(target: str, draft: str) -> str:
    """A draft file's speculative type: its own (dflash, eagle3), else a classic draft model."""
    from llama_dflash.draft_models import guess_algorithm, resolve_draft
    from llama_dflash.inspect import check_target_file

    return resolve_draft(check_target_file(target), draft, guess_algorithm(draft)).kind


def _workloads(n: int) -> dict[str, list]:
    copy = [p for cat, ps in COPY_HEAVY_HELDOUT.items() if cat != CONTROL_WORKLOAD for p in ps[:n]]
    chat_file = os.path.join(ROOT, "llama_dflash", "drafts", "heldout_chat.jsonl")
    return {"copy-heavy (held out)": copy, "low-repetition prose": workload_prompts("low-repetition")[: 2 * n],
            "open chat (held out)": load_prompt_file(chat_file)[: 2 * n]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=2, help="prompts per copy-heavy category (x2 for the others)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma list of " + ", ".join(CONFIGS))
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--draft", action="append", default=[], metavar="PATH",
                    help="another draft file (EAGLE-3, classic, DFlash/DSpark): its type alone and chained")
    args = ap.parse_args()

    path = smollm2_path()
    draft = default_draft_path(path)
    tcfg = TargetConfig(path, n_ctx=2048, n_batch=256, n_ubatch=256, n_threads=args.threads)
    ordinary = OrdinaryDecoding(tcfg)
    engines: dict[str, object] = {"ordinary": ordinary}
    for name in args.configs.split(","):
        kw = dict(CONFIGS[name])
        uses_draft = "draft" in kw["spec_type"] or kw["spec_type"].startswith("auto")
        engines[name] = LlamaDFlashDecoding(tcfg, SpecConfig(draft if uses_draft else None, **kw),
                                            model=ordinary._model)
    for extra in args.draft:
        kind = _draft_kind(path, extra)
        label = os.path.basename(extra)
        for spec_type in (kind, f"ngram-simple,{kind}"):
            engines[f"{spec_type} ({label})"] = LlamaDFlashDecoding(
                tcfg, SpecConfig(extra, spec_type=spec_type, draft_n_max=4), model=ordinary._model)
    results: dict[str, dict[str, dict]] = {}
    mismatches: list[str] = []
    t_start = time.perf_counter()
    for wl, prompts in _workloads(args.prompts).items():
        rows = results.setdefault(wl, {})
        for i, p in enumerate(prompts):
            tokens = ordinary.tokenize(chat_wrap(path, p))
            ref = None
            for name, eng in engines.items():
                res = eng.generate(tokens, args.tokens)
                s = res.stats
                if ref is None:
                    ref = res.tokens
                elif res.tokens != ref:
                    at = next((j for j, (x, y) in enumerate(zip(ref, res.tokens)) if x != y),
                              min(len(ref), len(res.tokens)))
                    mismatches.append(f"{wl} prompt {i + 1}: {name} (from token {at})")
                r = rows.setdefault(name, {"tokens": 0, "seconds": 0.0, "steps": 0, "accepted": 0,
                                           "drafted": 0, "ratios": []})
                loop = max(1e-9, s.total_seconds - s.prefill_seconds)
                r["tokens"] += len(res.tokens)
                r["seconds"] += loop
                r["steps"] += s.verification_steps
                r["accepted"] += s.accepted
                r["drafted"] += s.drafted
                r["last"] = loop
            base = rows["ordinary"]["last"]
            for name in engines:
                rows[name]["ratios"].append(base / rows[name]["last"])
            print(f"  {wl} {i + 1}/{len(prompts)} done ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr)
    for eng in engines.values():
        eng.close()

    out = {}
    for wl, rows in results.items():
        base = rows["ordinary"]
        print(f"\n[{wl}: {len(rows['ordinary']['ratios'])} prompts x {args.tokens} tokens]")
        width = max(20, *(len(name) for name in rows))
        print(f"  {'speculator':<{width}} {'tau':>5} {'accept':>7} {'speedup':>8} {'median':>7}")
        out[wl] = {}
        for name, r in rows.items():
            tau = r["tokens"] / r["steps"] if r["steps"] else 0.0
            acc = r["accepted"] / r["drafted"] if r["drafted"] else 0.0
            speed = (r["tokens"] / r["seconds"]) / (base["tokens"] / base["seconds"])
            med = statistics.median(r["ratios"])
            out[wl][name] = {"tau": tau, "acceptance": acc, "speedup": speed, "median_speedup": med,
                             "tokens": r["tokens"], "drafted": r["drafted"], "accepted": r["accepted"]}
            print(f"  {name:<{width}} {tau:5.2f} {acc:7.1%} {speed:7.3f}x {med:6.3f}x")
    print("\noutputs identical to ordinary decoding:", "yes" if not mismatches else "NO: " + "; ".join(mismatches))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"results": out, "mismatches": mismatches, "tokens": args.tokens}, fh, indent=1)


if __name__ == "__main__":
    main()
