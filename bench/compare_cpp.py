"""Our loops against llama.cpp's C++ binaries, side by side in one run (medians and ratios).

  python bench/compare_cpp.py --bin DIR [--model T.gguf] [--draft-model D.gguf] [--tokens 128] [--draft-tokens 4]

DIR holds llama-bench and llama-speculative-simple (../shared/tools/build-cpp-reference.sh prints it).
Prints: ordinary tokens/s vs llama-bench tg, and speculative tokens/s vs llama-speculative-simple,
all as decode rates (prompt processing excluded on both sides), interleaved rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, TargetConfig
from llama_dflash._llama import Model, cpu_has_amx
from llama_dflash.bench.cpp_reference import run_cpp_reference
from llama_dflash.defaults import default_draft_path, smollm2_path

PROMPT = "<|im_start|>user\nWrite a Python function that checks whether a number is prime.<|im_end|>\n<|im_start|>assistant\n"


def llama_bench_tg(binary: str, model: str, n: int, threads: int) -> float:
    cmd = [binary, "-m", model, "-p", "0", "-n", str(n), "-t", str(threads), "-r", "3", "-o", "json"]
    if cpu_has_amx():
        cmd += ["-nr", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


def decode_rate(res) -> float:
    """Generated tokens per second of decoding, prompt processing excluded: what llama-bench's
    tg and llama-speculative-simple's "decoded N tokens in S seconds" measure."""
    return len(res.tokens) / max(1e-9, res.stats.total_seconds - res.stats.prefill_seconds)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model")
    ap.add_argument("--draft-model")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    model = a.model or smollm2_path()
    draft = a.draft_model or default_draft_path(model)
    cfg = TargetConfig(model, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=a.threads)
    m = Model(model, repack=cfg.repack)
    ours_ord, ours_spec, cpp_tg, cpp_spec = [], [], [], []
    with OrdinaryDecoding(cfg, model=m) as o, LlamaDFlashDecoding(cfg, SpecConfig(draft, draft_n_max=a.draft_tokens), model=m) as s:
        prompt = o.tokenize(PROMPT)
        o.generate(prompt, 16, ignore_eos=True)
        s.generate(prompt, 16, ignore_eos=True)
        for r in range(a.rounds):
            ours_ord.append(decode_rate(o.generate(prompt, a.tokens, ignore_eos=True)))
            cpp_tg.append(llama_bench_tg(os.path.join(a.bin, "llama-bench"), model, a.tokens, a.threads))
            res = s.generate(prompt, a.tokens, ignore_eos=True)
            ours_spec.append(decode_rate(res))
            c = run_cpp_reference(os.path.join(a.bin, "llama-speculative-simple"), model, draft, PROMPT,
                                  n_predict=a.tokens, draft_n_max=a.draft_tokens, draft_p_min=0.0, n_ctx=1024,
                                  n_batch=512, n_ubatch=512, threads=a.threads, repack=m.repack, ignore_eos=True)
            cpp_spec.append(c.tokens_per_second)
            print(f"round {r + 1}: ordinary {ours_ord[-1]:.2f} vs llama-bench {cpp_tg[-1]:.2f}; "
                  f"speculative {ours_spec[-1]:.2f} vs C++ {cpp_spec[-1]:.2f} (accept {100 * c.acceptance_rate:.1f}% "
                  f"vs ours {100 * res.stats.acceptance_rate:.1f}%; accepted {c.n_accept}/{c.n_drafted} vs ours "
                  f"{res.stats.accepted}/{res.stats.drafted})", file=sys.stderr)
    m.close()
    med = statistics.median
    r_ord = med(x / y for x, y in zip(ours_ord, cpp_tg))
    r_spec = med(x / y for x, y in zip(ours_spec, cpp_spec))
    print(f"ordinary    : ours {med(ours_ord):8.2f} t/s   llama-bench tg{a.tokens} {med(cpp_tg):8.2f} t/s   "
          f"ratio {med(ours_ord) / med(cpp_tg):.3f} (median of per-round ratios {r_ord:.3f})")
    print(f"speculative : ours {med(ours_spec):8.2f} t/s   llama-speculative-simple {med(cpp_spec):8.2f} t/s   "
          f"ratio {med(ours_spec) / med(cpp_spec):.3f} (median of per-round ratios {r_spec:.3f})   "
          f"(draft tokens {a.draft_tokens}, {a.tokens} tokens, {a.rounds} rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
