"""Cost of one draft block relative to one ordinary target decode, for several draft files.

Why a separate script: on a shared CPU whole-run timings swing by 5x; here the two operations
are timed interleaved, one right after the other, and the medians compared, and besides wall time
the process's CPU time is measured (with --threads 1 it is the work itself, whatever else runs). The draft block is exactly what the engine runs per step (DFlashProposer.propose:
one decode of the block, candidates read off its slots, block K/V removed).

    python bench/draft_cost.py --threads 1 --draft-tokens 4 DRAFT.gguf [DRAFT2.gguf ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROMPT = ("<|im_start|>user\nWrite a Python function that checks whether a number is prime, then explain "
          "step by step how it works and list three test cases.<|im_end|>\n<|im_start|>assistant\n")


def measure(target: str, draft: str, *, k: int, reps: int, threads: int, backend_sampling: bool = True) -> dict:
    from llama_dflash.config import SpecConfig, TargetConfig
    from llama_dflash.engine import LlamaDFlashDecoding
    from llama_dflash.target import TargetContext

    cfg = TargetConfig(model=target, n_ctx=512, n_threads=threads)
    eng = LlamaDFlashDecoding(cfg, SpecConfig(draft_model=draft, draft_n_max=k,
                                                     backend_sampling=backend_sampling))
    plain = TargetContext(eng._model, cfg)
    try:
        prompt = eng._model.tokenize(PROMPT)
        L = len(prompt)
        eng.target.decode(prompt, 0, logits="last")
        prop = eng._dflash
        prop.inject(eng.target.layer_features(), 0)
        plain.decode(prompt, 0, logits="last")
        tok = prompt[-1]
        wall: dict[str, list[float]] = {"dec": [], "drf": []}
        cpu: dict[str, list[float]] = {"dec": [], "drf": []}
        for r in range(reps + 3):
            w0, c0 = time.perf_counter(), time.process_time()
            plain.decode([tok], L, logits="last")
            w1, c1 = time.perf_counter(), time.process_time()
            plain.seq_rm(L)
            w2, c2 = time.perf_counter(), time.process_time()
            prop.propose(tok, L, k)
            w3, c3 = time.perf_counter(), time.process_time()
            if r >= 3:  # warm-up
                wall["dec"].append(w1 - w0)
                wall["drf"].append(w3 - w2)
                cpu["dec"].append(c1 - c0)
                cpu["drf"].append(c3 - c2)
        med = {f"{kind}_{op}": statistics.median(v) for kind, d in (("wall", wall), ("cpu", cpu)) for op, v in d.items()}
        return {"draft": os.path.basename(draft), "bytes": os.path.getsize(draft),
                "decode_ms": round(med["wall_dec"] * 1e3, 3), "draft_block_ms": round(med["wall_drf"] * 1e3, 3),
                "ratio": round(med["wall_drf"] / med["wall_dec"], 3),
                "cpu_decode_ms": round(med["cpu_dec"] * 1e3, 3), "cpu_draft_block_ms": round(med["cpu_drf"] * 1e3, 3),
                "cpu_ratio": round(med["cpu_drf"] / max(1e-9, med["cpu_dec"]), 3)}
    finally:
        plain.close()
        eng.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("drafts", nargs="+")
    p.add_argument("--model", help="target GGUF (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--draft-tokens", type=int, default=4)
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-backend-sampling", action="store_true", help="draft candidates picked on the CPU")
    p.add_argument("--json", help="write the rows as JSON")
    args = p.parse_args()
    from llama_dflash._llama import set_verbose
    from llama_dflash.defaults import smollm2_path

    set_verbose(False)
    target = args.model or smollm2_path()
    rows = []
    print(f"{'draft':<36} {'MB':>5} | wall: {'decode':>7} {'block':>7} {'ratio':>6} | cpu: {'decode':>7} "
          f"{'block':>7} {'ratio':>6}")
    for d in args.drafts:
        r = measure(target, d, k=args.draft_tokens, reps=args.reps, threads=args.threads,
                    backend_sampling=not args.no_backend_sampling)
        rows.append(r)
        print(f"{r['draft'][:36]:<36} {r['bytes'] / 1e6:>5.1f} | ms    {r['decode_ms']:>7.2f} {r['draft_block_ms']:>7.2f} "
              f"{r['ratio']:>6.3f} | ms   {r['cpu_decode_ms']:>7.2f} {r['cpu_draft_block_ms']:>7.2f} {r['cpu_ratio']:>6.3f}",
              flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"draft_tokens": args.draft_tokens, "threads": args.threads, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
