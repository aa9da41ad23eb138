"""Cost of one draft block relative to one ordinary target decode, for several draft files.

Why a separate script: on a shared CPU whole-run timings swing by 5x; here the two operations
are timed interleaved, one right after the other, and the medians compared, so contention hits
both alike. The draft block is exactly what the engine runs per step (DFlashProposer.propose:
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


def measure(target: str, draft: str, *, k: int, reps: int, threads: int) -> dict:
    from llama_dflash.config import SpecConfig, TargetConfig
    from llama_dflash.engine import LlamaDFlashDecoding
    from llama_dflash.target import TargetContext

    cfg = TargetConfig(model=target, n_ctx=512, n_threads=threads)
    eng = LlamaDFlashDecoding(cfg, SpecConfig(draft_model=draft, draft_n_max=k))
    plain = TargetContext(eng._model, cfg)
    try:
        prompt = eng._model.tokenize(PROMPT)
        L = len(prompt)
        eng.target.decode(prompt, 0, logits="last")
        prop = eng._dflash
        prop.inject(eng.target.layer_features(), 0)
        plain.decode(prompt, 0, logits="last")
        tok = prompt[-1]
        t_dec, t_drf = [], []
        for r in range(reps + 3):
            t0 = time.perf_counter()
            plain.decode([tok], L, logits="last")
            t1 = time.perf_counter()
            plain.seq_rm(L)
            t2 = time.perf_counter()
            prop.propose(tok, L, k)
            t3 = time.perf_counter()
            if r >= 3:  # warm-up
                t_dec.append(t1 - t0)
                t_drf.append(t3 - t2)
        dec, drf = statistics.median(t_dec), statistics.median(t_drf)
        return {"draft": os.path.basename(draft), "bytes": os.path.getsize(draft),
                "decode_ms": round(dec * 1e3, 3), "draft_block_ms": round(drf * 1e3, 3),
                "ratio": round(drf / dec, 3)}
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
    p.add_argument("--json", help="write the rows as JSON")
    args = p.parse_args()
    from llama_dflash._llama import set_verbose
    from llama_dflash.defaults import smollm2_path

    set_verbose(False)
    target = args.model or smollm2_path()
    rows = []
    print(f"{'draft':<44} {'MB':>6} {'decode ms':>10} {'block ms':>9} {'block/decode':>13}")
    for d in args.drafts:
        r = measure(target, d, k=args.draft_tokens, reps=args.reps, threads=args.threads)
        rows.append(r)
        print(f"{r['draft']:<44} {r['bytes'] / 1e6:>6.1f} {r['decode_ms']:>10.2f} {r['draft_block_ms']:>9.2f} "
              f"{r['ratio']:>13.3f}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"draft_tokens": args.draft_tokens, "threads": args.threads, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
