"""Our loops against llama.cpp's C++ binaries, side by side in one run (medians and ratios).

  python bench/compare_cpp.py --bin DIR [--model T.gguf] [--draft-model D.gguf] [--tokens 128] [--draft-tokens 4]
                              [--rounds 3] [--phase-rounds 3] [--no-ordinary] [--micro DIR]

DIR holds llama-bench and llama-speculative-simple (../shared/tools/build-cpp-reference.sh prints it).
Prints: ordinary tokens/s vs llama-bench tg, and speculative tokens/s vs llama-speculative-simple,
all as decode rates (prompt processing excluded on both sides), interleaved rounds; then where a
speculative step's time goes, in microseconds per step, for both (`--phase-rounds` more interleaved
runs, medians):

  ours: draft block (decode + reading its tokens + dropping its cells), injection (target features
        into the draft cache), target verify decode, sampling/acceptance, rewind (both caches after a
        rejection), other Python (the rest of the decode time: the loop's own bookkeeping).
  C++:  what llama-speculative-simple prints with -lv 4: the draft implementation's draft() time
        (dur g), the target context's eval time (its prompt eval + eval, less the prompt's
        "encoded" time: approximate, that span also holds the prompt's injection), the target
        sampler's time, and the rest of its decode time (injection, seq_rm, printing the tokens).
Ours counts the prompt's injection in its first step (it is deferred to the first draft block);
llama.cpp counts it in its prompt time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, TargetConfig
from llama_dflash._llama import Model, cpu_has_amx
from llama_dflash.bench.cpp_reference import IncompleteOutput, cpp_spec_type, run_cpp_reference, run_driver
from llama_dflash.defaults import default_draft_path, smollm2_path
from llama_dflash.writer import write_random_draft, write_tiny_target

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


OUR_PHASES = ("draft block", "injection", "target verify", "sampling/accept", "rewind", "other Python")
CPP_PHASES = ("draft block", "target verify", "sampling", "other (inject, seq_rm, print)")


def our_phases(engine, prompt: list[int], n: int) -> tuple[dict[str, float], int]:
    """One instrumented generation: microseconds per verification step by phase, and the steps.

    The rewind is timed by wrapping this engine's rewinder and draft rollback for the run (the
    loop itself keeps no clock there); everything else comes from the run's SpecStats."""
    rewind = [0.0]

    def timed(fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                rewind[0] += time.perf_counter() - t0
        return wrapper

    targets = [(engine.rewinder, "rewind"), (engine.proposer, "rollback")]
    for obj, name in targets:
        setattr(obj, name, timed(getattr(obj, name)))
    try:
        res = engine.generate(prompt, n, ignore_eos=True)
    finally:
        for obj, name in targets:
            delattr(obj, name)  # the class's method again
    st = res.stats
    steps = max(1, st.verification_steps)
    decode = st.total_seconds - st.prefill_seconds
    parts = {"draft block": st.draft_seconds, "injection": st.process_seconds, "target verify": st.target_seconds,
             "sampling/accept": st.sample_seconds, "rewind": rewind[0]}
    parts["other Python"] = decode - sum(parts.values())
    return {k: 1e6 * v / steps for k, v in parts.items()}, steps


_CPP_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds")
_CPP_ENCODED = re.compile(r"encoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds")
_CPP_CALLS = re.compile(r"#calls\(b,g,a\)\s*=\s*(\d+)\s+(\d+)\s+(\d+)")
_CPP_DUR = re.compile(r"dur\(b,g,a\)\s*=\s*([\d.]+),\s*([\d.]+),\s*([\d.]+)\s*ms")
_CPP_PERF = re.compile(r"common_perf_print:\s+(sampling time|prompt eval time|eval time)\s*=\s*([\d.]+) ms")


def cpp_phases(binary: str, model: str, draft: str, prompt: str, n: int, k: int, threads: int,
               repack: bool) -> tuple[dict[str, float], int]:
    """One llama-speculative-simple run at -lv 4 (its draft timings, no per-step log lines):
    microseconds per step by phase, and the steps (its draft calls)."""
    cmd = [binary, "-m", model, "-md", draft, "--spec-type", cpp_spec_type(draft), "-p", prompt, "-n", str(n),
           "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0.0", "-c", "1024",
           "-b", "512", "-ub", "512", "--temp", "0", "--top-k", "1", "--repeat-penalty", "1", "-ngl", "99",
           "-ngld", "99", "-t", str(threads), "-td", str(threads), "--ignore-eos", "-lv", "4"]
    if not repack:
        cmd.append("--no-repack")

    def timings(text: str):
        found = [r.search(text) for r in (_CPP_DECODED, _CPP_ENCODED, _CPP_CALLS, _CPP_DUR)]
        if not all(found):
            raise IncompleteOutput("llama-speculative-simple -lv 4 printed no decode/draft timings: "
                                   + " | ".join(text.strip().splitlines()[-3:]))
        return text, found

    # run_driver: into a file, again while its asynchronous log loses the lines needed
    text, (dec, enc, calls, dur) = run_driver(cmd, timings)
    perf = {name: float(ms) for name, ms in _CPP_PERF.findall(text)}
    steps = max(1, int(calls.group(2)))
    decode_ms = 1e3 * float(dec.group(2))
    parts = {"draft block": float(dur.group(2)),
             "target verify": perf.get("prompt eval time", 0.0) + perf.get("eval time", 0.0) - 1e3 * float(enc.group(2)),
             "sampling": perf.get("sampling time", 0.0)}
    parts["other (inject, seq_rm, print)"] = decode_ms - sum(parts.values())
    return {k_: 1e3 * v / steps for k_, v in parts.items()}, steps


def print_phases(title: str, names: tuple[str, ...], runs: list[dict[str, float]], steps: list[int]) -> None:
    med = statistics.median
    total = sum(med(r[k] for r in runs) for k in names)
    cells = "  ".join(f"{k} {med(r[k] for r in runs):7.1f}" for k in names)
    print(f"{title:5s} us/step (median of {len(runs)}, {med(steps):.0f} steps): {cells}  | total {total:7.1f}")


def write_micro_pair(folder: str) -> tuple[str, str]:
    """The microscopic random pair (target n_embd 64, 4 layers; a 1-layer random draft) in folder,
    written once: where one decode costs a quarter of a millisecond, as a GPU step does, what the
    host does per step is a visible share of it."""
    os.makedirs(folder, exist_ok=True)
    target, draft = os.path.join(folder, "t.gguf"), os.path.join(folder, "d.gguf")
    if not (os.path.exists(target) and os.path.exists(draft)):
        write_tiny_target(target, n_embd=64, n_layer=4)
        write_random_draft(draft, target, n_layer=1)
    return target, draft


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model")
    ap.add_argument("--draft-model")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--phase-rounds", type=int, default=3,
                    help="interleaved runs that split a step's time by phase, ours and C++ (0: none)")
    ap.add_argument("--no-ordinary", action="store_true", help="skip ordinary decoding vs llama-bench")
    ap.add_argument("--micro", metavar="DIR",
                    help="write the microscopic random pair (a ~0.25 ms decode: host overhead shows) into DIR "
                         "and compare on it, instead of --model/--draft-model")
    a = ap.parse_args()
    if a.micro and (a.model or a.draft_model):
        ap.error("--micro writes its own pair: leave out --model and --draft-model")
    if a.micro:
        a.model, a.draft_model = write_micro_pair(a.micro)
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
            if not a.no_ordinary:
                ours_ord.append(decode_rate(o.generate(prompt, a.tokens, ignore_eos=True)))
                cpp_tg.append(llama_bench_tg(os.path.join(a.bin, "llama-bench"), model, a.tokens, a.threads))
            res = s.generate(prompt, a.tokens, ignore_eos=True)
            ours_spec.append(decode_rate(res))
            c = run_cpp_reference(os.path.join(a.bin, "llama-speculative-simple"), model, draft, PROMPT,
                                  n_predict=a.tokens, draft_n_max=a.draft_tokens, draft_p_min=0.0, n_ctx=1024,
                                  n_batch=512, n_ubatch=512, threads=a.threads, repack=m.repack, ignore_eos=True)
            cpp_spec.append(c.tokens_per_second)
            ordinary = "" if a.no_ordinary else f"ordinary {ours_ord[-1]:.2f} vs llama-bench {cpp_tg[-1]:.2f}; "
            print(f"round {r + 1}: {ordinary}"
                  f"speculative {ours_spec[-1]:.2f} vs C++ {cpp_spec[-1]:.2f} (accept {100 * c.acceptance_rate:.1f}% "
                  f"vs ours {100 * res.stats.acceptance_rate:.1f}%; accepted {c.n_accept}/{c.n_drafted} vs ours "
                  f"{res.stats.accepted}/{res.stats.drafted})", file=sys.stderr)
        ours_ph, cpp_ph, ours_steps, cpp_steps = [], [], [], []
        for _ in range(a.phase_rounds):
            ph, n_steps = our_phases(s, prompt, a.tokens)
            ours_ph.append(ph)
            ours_steps.append(n_steps)
            ph, n_steps = cpp_phases(os.path.join(a.bin, "llama-speculative-simple"), model, draft, PROMPT, a.tokens,
                                     a.draft_tokens, a.threads, m.repack)
            cpp_ph.append(ph)
            cpp_steps.append(n_steps)
    m.close()
    med = statistics.median
    if not a.no_ordinary:
        r_ord = med(x / y for x, y in zip(ours_ord, cpp_tg))
        print(f"ordinary    : ours {med(ours_ord):8.2f} t/s   llama-bench tg{a.tokens} {med(cpp_tg):8.2f} t/s   "
              f"ratio {med(ours_ord) / med(cpp_tg):.3f} (median of per-round ratios {r_ord:.3f})")
    r_spec = med(x / y for x, y in zip(ours_spec, cpp_spec))
    print(f"speculative : ours {med(ours_spec):8.2f} t/s   llama-speculative-simple {med(cpp_spec):8.2f} t/s   "
          f"ratio {med(ours_spec) / med(cpp_spec):.3f} (median of per-round ratios {r_spec:.3f})   "
          f"(draft tokens {a.draft_tokens}, {a.tokens} tokens, {a.rounds} rounds)")
    if ours_ph:
        print_phases("ours", OUR_PHASES, ours_ph, ours_steps)
        print_phases("C++", CPP_PHASES, cpp_ph, cpp_steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
