"""Does the length of the decoded draft block change what the draft proposes?  (issue 12 item 2)

    . .venv/bin/activate && python bench/block_length.py [--tokens 96] [--prompts 3] [--threads 1]

Attention inside a DFlash block is non-causal, so every slot's prediction depends on how many
MASK slots follow it.  llama.cpp always decodes the block at n_max+1 tokens and truncates the
result afterwards; a shorter block (n+1 for n wanted tokens) is cheaper to decode.  This script
teacher-forces the target's own greedy continuation of the built-in prompts through the draft:
at every position it decodes the block at each length L in 2..block_size and compares slot j's
token with the continuation.  It prints, per block length, the conditional acceptance of each
slot (P(slot j right | slots < j right), what the speculative loop sees), the expected tokens
per step, and the median wall time of one block decode relative to one ordinary target decode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig
from llama_dflash.bench.cli import chat_wrap
from llama_dflash.bench.workloads import workload_prompts
from llama_dflash.config import TargetConfig
from llama_dflash.defaults import smollm2_path, trained_draft_path
from llama_dflash.generate import prefill


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=6, help="prompts per workload (structured, low-repetition)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--draft", default=None, help="draft GGUF (default: the shipped trained draft)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()

    path = smollm2_path()
    draft = args.draft or trained_draft_path()
    tcfg = TargetConfig(path, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=args.threads)
    ordinary = OrdinaryDecoding(tcfg)
    eng = LlamaDFlashDecoding(tcfg, SpecConfig(draft, draft_n_max="auto",
                                               draft_n_threads=args.threads, backend_sampling=False),
                              model=ordinary._model)
    p, target = eng._dflash, eng.target
    lengths = list(range(2, eng.draft_info.block_size + 1))
    n_slots = lengths[-1] - 1
    # hits[L][j]: positions where slots 0..j of a block of length L were all right; tried[L][j] likewise
    hits = {L: np.zeros(n_slots) for L in lengths}
    tried = {L: np.zeros(n_slots) for L in lengths}
    seconds: dict[int, list[float]] = {L: [] for L in lengths}
    # same[L][j]: positions where slot j of a block of length L proposes what the full block's slot j does
    same = {L: np.zeros(n_slots) for L in lengths}
    positions = 0
    t1: list[float] = []

    prompts = [p_ for wl in ("structured", "low-repetition") for p_ in workload_prompts(wl)[: args.prompts]]
    for text in prompts:
        prompt = ordinary.tokenize(chat_wrap(path, text))
        ref = ordinary.generate(prompt, args.tokens).tokens
        seq = list(prompt) + list(ref)
        target.clear()
        p.clear()
        prefill(target, prompt[:-1], p.inject)
        for n_past in range(len(prompt) - 1, len(seq) - 1):
            id_last = seq[n_past]
            p.flush()
            positions += 1
            blocks = {}
            for L in lengths:
                t0 = time.perf_counter()
                toks = p._draft_block(id_last, n_past, L)
                seconds[L].append(time.perf_counter() - t0)
                p.ctx.seq_rm(0, n_past, -1)
                blocks[L] = toks
                want = seq[n_past + 1 : n_past + L]
                for j in range(min(len(toks), len(want))):
                    tried[L][j] += 1
                    if toks[j] != want[j]:
                        break
                    hits[L][j] += 1
            for L in lengths:
                for j, tok in enumerate(blocks[L]):
                    same[L][j] += tok == blocks[lengths[-1]][j]
            t0 = time.perf_counter()
            target.decode((id_last,), n_past, logits="last")
            target.logits_row(0)
            t1.append(time.perf_counter() - t0)
            p.inject(target.layer_features(), n_past)

    base = statistics.median(t1)
    base20 = float(np.percentile(t1, 20))
    print(f"target {path.split('/')[-1]}, draft {draft.split('/')[-1]}, {len(prompts)} prompts x {args.tokens} "
          f"tokens = {positions} positions, threads {args.threads}; one ordinary decode = {base * 1e3:.2f} ms "
          f"(20th percentile {base20 * 1e3:.2f} ms)")
    print("conditional acceptance per slot (teacher-forced) | expected tokens/step if all n=L-1 drafted | "
          "block decode / ordinary decode (median, 20th percentile)")
    rows = {}
    for L in lengths:
        p_cond = [hits[L][j] / tried[L][j] if tried[L][j] else 0.0 for j in range(L - 1)]
        expected = 1.0 + sum(np.prod(p_cond[: j + 1]) for j in range(L - 1))
        cost = statistics.median(seconds[L]) / base
        cost20 = float(np.percentile(seconds[L], 20)) / base20
        rows[L] = {"p_cond": p_cond, "n": [int(x) for x in tried[L][: L - 1]], "expected_tokens": expected,
                   "block_cost": cost, "block_cost_p20": cost20,
                   "same_as_full": [float(x) / positions for x in same[L][: L - 1]]}
        print(f"L={L:2d}  " + " ".join(f"{x:.3f}" for x in p_cond).ljust(6 * n_slots) +
              f" | {expected:.3f} | {cost:.2f} {cost20:.2f}")
    print("slot-by-slot ratio of each L to the full block (L=%d):" % lengths[-1])
    full = rows[lengths[-1]]["p_cond"]
    for L in lengths[:-1]:
        print(f"L={L:2d}  " + " ".join(f"{a / b:.2f}" if b else "  - " for a, b in zip(rows[L]["p_cond"], full)))
    print("share of positions where slot j proposes the same token as in the full block:")
    for L in lengths[:-1]:
        print(f"L={L:2d}  " + " ".join(f"{x:.3f}" for x in rows[L]["same_as_full"]))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"t1_seconds": base, "lengths": rows}, fh, indent=1)
    eng.close()
    ordinary.close()


if __name__ == "__main__":
    main()
