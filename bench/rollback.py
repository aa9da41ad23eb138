"""What rolling back a recurrent/hybrid target costs: native n_rs_seq snapshots vs checkpoints.

    . .venv/bin/activate && python bench/rollback.py [--tokens 128] [--runs 3] [--draft-tokens 4]

Writes a random lfm2 target (short-convolution recurrent layers between attention layers) and
a random draft for it, then runs speculative decoding with --rollback native and checkpoint
side by side (interleaved rounds).  A random draft is rejected at almost every step, so every
step rolls back: the per-step costs printed are what each strategy pays per rejection.
Outputs are checked identical to ordinary decoding.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, TargetConfig
from llama_dflash.tiny_qwen3next import write_tiny_qwen3next
from llama_dflash.writer import write_random_draft, write_tiny_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arch", choices=("lfm2", "qwen3next"), default="lfm2",
                    help="qwen3next has no native rollback: only the checkpoint path runs")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="rollback-bench-")
    if args.arch == "lfm2":
        target = write_tiny_target(os.path.join(tmp, "lfm2.gguf"), arch="lfm2", n_embd=args.n_embd,
                                   n_layer=args.n_layer, n_head=4, n_head_kv=2, n_ff=2 * args.n_embd, seed=1)
    else:
        target = write_tiny_qwen3next(os.path.join(tmp, "qwen3next.gguf"), n_embd=args.n_embd,
                                      n_layer=args.n_layer, seed=1)
    draft = write_random_draft(os.path.join(tmp, "draft.gguf"), target, block_size=args.draft_tokens + 1, seed=2)
    cfg = TargetConfig(target, n_ctx=1024, n_batch=128, n_ubatch=128, n_threads=args.threads)
    ordinary = OrdinaryDecoding(cfg)
    prompt = ordinary.tokenize("the quick brown fox and the lazy dog is")
    engines = {"ordinary": ordinary}
    for mode in ("native", "checkpoint") if args.arch == "lfm2" else ("checkpoint",):
        engines[mode] = LlamaDFlashDecoding(cfg, SpecConfig(draft, draft_n_max=args.draft_tokens, rollback=mode),
                                            model=ordinary._model)
    tps: dict[str, list[float]] = {name: [] for name in engines}
    stats = {}
    ref = None
    for _ in range(args.runs):
        for name, eng in engines.items():
            t0 = time.perf_counter()
            res = eng.generate(prompt, args.tokens, ignore_eos=True)
            tps[name].append(len(res.tokens) / (time.perf_counter() - t0))
            ref = ref or res.tokens
            assert res.tokens == ref, f"{name} diverged from ordinary decoding"
            stats[name] = res.stats
    print(f"{args.arch} target n_embd={args.n_embd} n_layer={args.n_layer}, draft_n_max={args.draft_tokens}, "
          f"{args.tokens} tokens, {args.runs} rounds; outputs identical to ordinary: True")
    print(f"{'mode':<11} {'tok/s':>8} {'steps':>6} {'rollbacks':>9}  per-step rollback cost")
    for name in engines:
        s = stats[name]
        steps = max(1, s.verification_steps)
        if name == "native":
            cost = f"{1000 * s.native_rollback_seconds / steps:.4f} ms (seq_rm on the snapshots)"
        elif name == "checkpoint":
            cost = (f"{1000 * s.checkpoint_seconds / steps:.4f} ms = capture "
                    f"{1000 * s.checkpoint_capture_seconds / steps:.4f} + restore "
                    f"{1000 * s.checkpoint_restore_seconds / steps:.4f} + replay "
                    f"{1000 * s.replay_seconds / steps:.4f} ({s.replayed_tokens / steps:.2f} tokens/step), "
                    f"{s.checkpoint_bytes} bytes, {'on device' if s.checkpoint_on_device else 'host'}")
        else:
            cost = "-"
        print(f"{name:<11} {statistics.median(tps[name]):8.2f} {s.verification_steps:6d} {s.rollbacks:9d}  {cost}")
    for eng in engines.values():
        eng.close()


if __name__ == "__main__":
    main()
