"""Adaptive draft length (`draft_n_max="auto"`) vs ordinary decoding and every fixed k.

    . .venv/bin/activate && python bench/adaptive.py [--tokens 128] [--runs 2] [--threads 2]

On the SmolLM2 pair with (a) a random draft and (b) the trained default draft, on the built-in
"structured" and "low-repetition" workloads.  Every configuration runs once per round
(interleaved, so machine drift hits all of them), greedy outputs are checked identical to
ordinary decoding, and the table shows median tokens/s, the ratio to ordinary decoding, and
for auto the ratio to the best of ordinary and the fixed lengths (the goal: >= 0.95x ordinary
with the random draft, >= 0.98x of the best with the trained draft).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig
from llama_dflash.bench.workloads import workload_prompts
from llama_dflash.bench.cli import chat_wrap
from llama_dflash.config import TargetConfig
from llama_dflash.defaults import random_draft_for, smollm2_path, trained_draft_path

WORKLOADS = ("structured", "low-repetition")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=2, help="rounds over every prompt")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per workload")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ks", default="1,2,4,7", help="fixed draft lengths to compare, or 'none'")
    ap.add_argument("--drafts", default="random,trained")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()

    path = smollm2_path()
    drafts = {"random": random_draft_for(path), "trained": trained_draft_path()}
    tcfg = TargetConfig(path, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=args.threads)
    ks: list = [int(k) for k in args.ks.split(",") if k.strip() and k != "none"] + ["auto"]
    ordinary = OrdinaryDecoding(tcfg)
    engines: dict[str, object] = {"ordinary": ordinary}
    for dname in args.drafts.split(","):
        for k in ks:
            engines[f"{dname} k={k}"] = LlamaDFlashDecoding(
                tcfg, SpecConfig(drafts[dname], draft_n_max=k, draft_n_threads=args.threads), model=ordinary._model)

    samples: dict[tuple[str, str], list[float]] = {}
    same: dict[tuple[str, str], bool] = {}
    hist: dict[tuple[str, str], dict] = {}
    for wl in WORKLOADS:
        prompts = [ordinary.tokenize(chat_wrap(path, p)) for p in workload_prompts(wl)[: args.prompts]]
        refs: dict[int, list[int]] = {}
        for _ in range(args.runs):
            for i, prompt in enumerate(prompts):
                for name, eng in engines.items():
                    t0 = time.perf_counter()
                    res = eng.generate(prompt, args.tokens)
                    dt = time.perf_counter() - t0
                    refs.setdefault(i, res.tokens)
                    key = (wl, name)
                    samples.setdefault(key, []).append(len(res.tokens) / dt)
                    same[key] = same.get(key, True) and res.tokens == refs[i]
                    if name.endswith("auto"):
                        h = hist.setdefault(key, {"ordinary_steps": 0, "steps": 0, "chosen": {}})
                        h["ordinary_steps"] += res.stats.ordinary_steps
                        h["steps"] += res.stats.verification_steps
                        for kk, v in res.stats.chosen_draft_tokens.items():
                            h["chosen"][kk] = h["chosen"].get(kk, 0) + v
    report = []
    print(f"{'workload':<15} {'config':<15} {'tok/s':>7} {'vs ord':>7} {'vs best':>7} {'same':>5}  notes")
    for wl in WORKLOADS:
        base = statistics.median(samples[(wl, "ordinary")])
        for name in engines:
            tps = statistics.median(samples[(wl, name)])
            vs_best, note = "", ""
            if name.endswith("auto"):
                dname = name.split()[0]
                best = max([base] + [statistics.median(samples[(wl, f"{dname} k={k}")]) for k in ks[:-1]])
                vs_best = f"{tps / best:.3f}"
                h = hist[(wl, name)]
                note = f"ordinary steps {h['ordinary_steps']}/{h['steps']}, chosen k {h['chosen']}"
            print(f"{wl:<15} {name:<15} {tps:7.2f} {tps / base:7.3f} {vs_best:>7} {str(same[(wl, name)]):>5}  {note}")
            report.append({"workload": wl, "config": name, "tokens_per_second": tps, "vs_ordinary": tps / base,
                           "vs_best": float(vs_best) if vs_best else None, "same_output": same[(wl, name)],
                           "samples": samples[(wl, name)]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    for eng in engines.values():
        eng.close()


if __name__ == "__main__":
    main()
