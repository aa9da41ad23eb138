"""Held-out acceptance of several drafts of any kind, side by side, through llama.cpp's C++ driver.

The prompts are the shipped held-out sets (llama_dflash/drafts/heldout_chat.jsonl, chat-wrapped, and
heldout_code.jsonl, raw completions); every draft runs greedily at each number of draft tokens with
p_min 0, so the table compares what the drafts predict, not how they are driven. The driver picks
the speculative type from each file (draft-eagle3, draft-dspark, draft-dflash, draft-simple).

    python bench/heldout_drafts.py --draft dspark=llama_dflash/drafts/SmolLM2-135M-Instruct.dspark.gguf \\
        --draft eagle3=OUT/draft-q4.gguf --draft-tokens 1,2,4 --max-tokens 128 --threads 2 --json table.json

Needs llama-speculative-simple (bench/build_cpp_reference.sh, or $LLAMA_SPECULATIVE_SIMPLE).

`--replay` measures the same thing without running the target again for every draft and length:
the target's greedy answers and layer inputs are made once (llama.cpp), and each draft, run by
llama.cpp, replays the driver's greedy loop on them (llama_dflash/train/replay.py; its steps equal
the driver's, tests/train/test_ar_roundtrip.py). `--answers FILE` keeps those answers for later runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DRAFTS = os.path.join(HERE, "..", "llama_dflash", "drafts")


def _prompts(model: str) -> dict[str, list[str]]:
    from llama_dflash.bench.cli import chat_wrap
    from llama_dflash.train.prompts import load_prompts

    return {"chat": [chat_wrap(model, p) for p in load_prompts(os.path.join(DRAFTS, "heldout_chat.jsonl"))],
            "code": load_prompts(os.path.join(DRAFTS, "heldout_code.jsonl"))}


def _answers(args, model: str, sets: dict, drafts) -> dict:
    """{"chat": [Answer], "code": [Answer], "layers": ids}: the target's greedy answers and the inputs
    of every layer the drafts read, made once (and kept in --answers)."""
    import numpy as np

    from llama_dflash.inspect import read_gguf
    from llama_dflash.train.replay import Answer, greedy_answers

    layers = sorted({int(x) for _, path in drafts for key in ("eagle3.target_layers", "dflash.target_layers")
                     for x in (read_gguf(path).get(key) or [])})
    if args.answers and os.path.isfile(args.answers):
        z = np.load(args.answers, allow_pickle=False)
        have = [int(x) for x in z["layers"]]
        if set(layers) <= set(have) and int(z["max_tokens"]) == args.max_tokens:
            out: dict = {"layers": have}
            for kind in sets:
                n = int(z[f"{kind}_n"])
                out[kind] = [Answer([int(t) for t in z[f"{kind}_{i}_tokens"]], int(z[f"{kind}_{i}_plen"]),
                                    z[f"{kind}_{i}_features"]) for i in range(n)]
            return out
    out = {"layers": layers}
    save: dict = {"layers": np.asarray(layers), "max_tokens": np.asarray(args.max_tokens)}
    for kind, prompts in sets.items():
        t0 = time.time()
        out[kind] = greedy_answers(model, prompts, n_predict=args.max_tokens, layers=layers, n_threads=args.threads)
        print(f"answers ({kind}): {len(prompts)} prompts in {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
        save[f"{kind}_n"] = np.asarray(len(prompts))
        for i, a in enumerate(out[kind]):
            save[f"{kind}_{i}_tokens"] = np.asarray(a.tokens)
            save[f"{kind}_{i}_plen"] = np.asarray(a.prompt_len)
            save[f"{kind}_{i}_features"] = a.features.astype(np.float32)
    if args.answers:
        np.savez(args.answers, **save)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", action="append", required=True, metavar="NAME=PATH", help="a draft to measure (repeat)")
    p.add_argument("--model", help="target GGUF (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--draft-tokens", default="1,2,4", help="draft tokens per step to measure (default 1,2,4)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="write every measurement here")
    p.add_argument("--replay", action="store_true",
                   help="replay the driver's loop on the target's greedy answers (made once) instead of running it")
    p.add_argument("--answers", help="with --replay: a .npz of the answers, made if missing, reused if present")
    args = p.parse_args(argv)
    from llama_dflash.defaults import smollm2_path
    from llama_dflash.train.ar_eval import driver_acceptance, find_driver

    if not args.replay and find_driver() is None:
        print("heldout_drafts: llama-speculative-simple is not built (bench/build_cpp_reference.sh); "
              "--replay needs no driver", file=sys.stderr)
        return 2
    drafts = []
    for d in args.draft:
        name, _, path = d.partition("=")
        if not path or not os.path.isfile(path):
            print(f"heldout_drafts: --draft {d}: expected NAME=PATH of an existing file", file=sys.stderr)
            return 2
        drafts.append((name, path))
    model = args.model or smollm2_path()
    ks = [int(x) for x in args.draft_tokens.split(",")]
    sets = _prompts(model)
    results = []
    answers = _answers(args, model, sets, drafts) if args.replay else None
    for name, path in drafts:
        for kind, prompts in sets.items():
            for k in ks:
                t0 = time.time()
                if args.replay:
                    from llama_dflash.train.replay import replay_acceptance

                    r = replay_acceptance(model, path, answers[kind], n_max=k, feature_layers=answers["layers"],
                                          n_threads=args.threads)
                    r.pop("steps_list")
                else:
                    r = driver_acceptance(model, path, prompts, n_predict=args.max_tokens, n_max=k,
                                          threads=args.threads)
                r.update(draft=name, path=path, prompts_set=kind, seconds=round(time.time() - t0, 1))
                results.append(r)
                print(f"{name:>12} {kind} k={k}: tau {r['tau']:.3f}  per position "
                      f"{', '.join(f'{x:.3f}' for x in r['acceptance_per_position'])}", file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"model": model, "max_tokens": args.max_tokens, "results": results}, f, indent=1)
    cols = [f"{kind} k={k}" for kind in sets for k in ks]
    print("| draft | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, _ in drafts:
        cells = []
        for kind in sets:
            for k in ks:
                r = next(x for x in results if x["draft"] == name and x["prompts_set"] == kind and x["n_max"] == k)
                cells.append(f"{r['tau']:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
