"""Adaptive draft length vs ordinary and fixed k on SmolLM2 with a random draft.

    . .venv/bin/activate && python bench/adaptive.py [--tokens 128] [--runs 3] [--threads 2]

Runs interleaved (every config once per round), reports medians of tokens/s and the ratio
to ordinary decoding.  Greedy outputs are checked identical to ordinary.
"""

from __future__ import annotations

import argparse
import statistics
import time

from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig
from llama_dflash.config import TargetConfig
from llama_dflash.defaults import random_draft_for, smollm2_path

PROMPTS = {
    "structured": "List the numbers from 1 to 60, one per line, as 'n: n squared'.\n1: 1\n2: 4\n3: 9\n",
    "prose": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ks", default="1,2,4,7")
    args = ap.parse_args()

    path = smollm2_path()
    draft = random_draft_for(path)
    tcfg = TargetConfig(path, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=args.threads)
    ks: list = [int(k) for k in args.ks.split(",")] + ["auto"]
    names = ["ordinary"] + [f"k={k}" for k in ks]
    engines = {"ordinary": OrdinaryDecoding(tcfg)}
    model = engines["ordinary"]._model
    for k in ks:
        kw = {"model": model} if model is not None else {}
        engines[f"k={k}"] = LlamaDFlashDecoding(
            tcfg, SpecConfig(draft, draft_n_max=k, draft_n_threads=args.threads), **kw)

    results: dict = {}
    for pname, text in PROMPTS.items():
        prompt = engines["ordinary"].tokenize(text)
        ref = None
        for r in range(args.runs):
            for name in names:
                t0 = time.perf_counter()
                res = engines[name].generate(prompt, args.tokens)
                dt = time.perf_counter() - t0
                if ref is None:
                    ref = res.tokens
                same = res.tokens == ref
                results.setdefault((pname, name), []).append((len(res.tokens) / dt, same, res.stats))
    print(f"{'prompt':<11} {'config':<9} {'tok/s':>7} {'ratio':>6} {'same':>5}  notes")
    for pname in PROMPTS:
        base = statistics.median(x[0] for x in results[(pname, "ordinary")])
        for name in names:
            rows = results[(pname, name)]
            tps = statistics.median(x[0] for x in rows)
            note = ""
            st = rows[-1][2]
            if name == "k=auto":
                note = (f"hist={st.chosen_draft_tokens} "
                        f"ordinary_steps={getattr(st, 'ordinary_steps', None)}")
            print(f"{pname:<11} {name:<9} {tps:7.2f} {(tps / base if base else float('nan')):6.3f} {str(all(x[1] for x in rows)):>5}  {note}")
    for e in engines.values():
        e.close()


if __name__ == "__main__":
    main()
