"""Random-weight targets in the shapes of real models, their drafts, and what the cost curve predicts.

No large model can travel to a lent GPU, but the cost of a speculative step depends on the
target's shape and weight type, not on what its weights say.  So this writes llama-layout
targets with random Q4_0 weights in the shapes of ~1B, ~4B and ~8B models (fast: Q4_0 blocks are
written as random bytes with a fixed scale, no quantization), and a random DFlash draft for each
in the target's own head layout (F16, as the papers' drafts run in 16 bits).  The benchmark's
cost probe and oracle on such a pair measure this engine's ceiling at that size; `summarize`
turns those into predicted speedups for any tau.

    python -m llama_dflash.bench.shapes write SHAPE OUT_DIR [--draft-layers N]   -> target.gguf, draft.gguf
    python -m llama_dflash.bench.shapes summarize BENCH.json... [--tau T@K ...] [--json OUT] [--md OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["Shape", "SHAPES", "write_shaped_target", "write_shaped_draft", "alpha_for_tau", "tau_at",
           "summarize", "main"]


@dataclass(frozen=True)
class Shape:
    name: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    tied: bool = False
    like: str = ""

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def params(self) -> int:
        e, hd = self.n_embd, self.head_dim
        layer = e * self.n_head * hd * 2 + e * self.n_head_kv * hd * 2 + 3 * e * self.n_ff + 2 * e
        return self.n_layer * layer + self.n_vocab * e * (1 if self.tied else 2) + e


#: llama-layout shapes of real models (random weights); "tiny" and "small" are for the CPU rehearsal
SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("1b", 2048, 16, 32, 8, 8192, 128256, tied=True, like="Llama-3.2-1B"),
    Shape("4b", 3072, 36, 24, 8, 8192, 128256, like="Llama-3.2-3B's widths, 36 layers (~4.4B)"),
    Shape("8b", 4096, 32, 32, 8, 14336, 128256, like="Llama-3.1-8B"),
    Shape("tiny", 128, 2, 4, 2, 256, 1024, like="CPU rehearsal"),
    Shape("small", 256, 4, 4, 2, 512, 4096, like="CPU rehearsal"),
)}

_Q4_0_BLOCK = 32
_Q4_0_BYTES = 18  # fp16 scale + 16 bytes of 4-bit values


def _vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """An SPM vocabulary of exactly n_vocab tokens: the tiny test vocabulary (specials, bytes,
    letters), then filler word pieces that no text produces."""
    from gguf import TokenType

    from ..writer import tiny_vocab

    tokens, scores, types = tiny_vocab()
    if n_vocab < len(tokens):
        raise ValueError(f"a shaped target needs at least {len(tokens)} tokens, not {n_vocab}")
    extra = n_vocab - len(tokens)
    tokens = tokens + [f"\u2581w{i}" for i in range(extra)]
    scores = scores + [-1000.0 - i for i in range(extra)]
    types = types + [int(TokenType.NORMAL)] * extra
    return tokens, scores, types


class _RandomQ4_0:
    """Q4_0 rows of random 4-bit values with one fixed scale: views into one random pool, so
    that an 8B model needs no more memory than its largest tensor."""

    def __init__(self, rng: np.random.Generator, max_bytes: int, std: float):
        n_blocks = -(-max_bytes // _Q4_0_BYTES)
        pool = np.empty((n_blocks, _Q4_0_BYTES), dtype=np.uint8)
        pool[:, 2:] = rng.integers(0, 256, size=(n_blocks, _Q4_0_BYTES - 2), dtype=np.uint8)
        # values are scale * (q - 8), q uniform in 0..15: standard deviation ~4.6 * scale
        pool[:, :2] = np.frombuffer(np.float16(std / 4.61).tobytes(), dtype=np.uint8)
        self.pool = pool.reshape(-1)
        self.offset = 0

    def matrix(self, rows: int, cols: int) -> np.ndarray:
        if cols % _Q4_0_BLOCK:
            raise ValueError(f"Q4_0 rows need a multiple of {_Q4_0_BLOCK} values, not {cols}")
        n = rows * cols // _Q4_0_BLOCK * _Q4_0_BYTES
        if n > self.pool.size:
            raise ValueError("tensor larger than the random pool")
        # a different window of the pool for each tensor (wrapping), not the same bytes everywhere
        start = self.offset % (self.pool.size - n + 1)
        start -= start % _Q4_0_BYTES
        self.offset += 7919 * _Q4_0_BYTES
        return self.pool[start:start + n].reshape(rows, cols // _Q4_0_BLOCK * _Q4_0_BYTES)


def write_shaped_target(path: str, shape: Shape, *, seed: int = 0, context_length: int = 8192) -> str:
    """A llama-architecture GGUF in `shape` with random Q4_0 matrices (norms F32)."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    rng = np.random.default_rng(seed)
    e, hd, ff = shape.n_embd, shape.head_dim, shape.n_ff
    biggest = max(shape.n_vocab * e, ff * e) // _Q4_0_BLOCK * _Q4_0_BYTES
    # weights scaled by fan-in so that activations stay O(1) through every layer
    by_e = _RandomQ4_0(rng, biggest, 0.5 / math.sqrt(e))
    by_ff = _RandomQ4_0(rng, ff * e // _Q4_0_BLOCK * _Q4_0_BYTES, 0.5 / math.sqrt(ff))
    embd = _RandomQ4_0(rng, shape.n_vocab * e // _Q4_0_BLOCK * _Q4_0_BYTES, 1.0)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"random-{shape.name}")
    w.add_context_length(context_length)
    w.add_embedding_length(e)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(500000.0)
    w.add_vocab_size(shape.n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    tokens, scores, types = _vocab(shape.n_vocab)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    ones = np.ones(e, dtype=np.float32)
    w.add_tensor("token_embd.weight", embd.matrix(shape.n_vocab, e), raw_dtype=Q.Q4_0)
    w.add_tensor("output_norm.weight", ones)
    if not shape.tied:
        w.add_tensor("output.weight", by_e.matrix(shape.n_vocab, e), raw_dtype=Q.Q4_0)
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "attn_q.weight", by_e.matrix(shape.n_head * hd, e), raw_dtype=Q.Q4_0)
        w.add_tensor(p + "attn_k.weight", by_e.matrix(shape.n_head_kv * hd, e), raw_dtype=Q.Q4_0)
        w.add_tensor(p + "attn_v.weight", by_e.matrix(shape.n_head_kv * hd, e), raw_dtype=Q.Q4_0)
        w.add_tensor(p + "attn_output.weight", by_e.matrix(e, shape.n_head * hd), raw_dtype=Q.Q4_0)
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "ffn_gate.weight", by_e.matrix(ff, e), raw_dtype=Q.Q4_0)
        w.add_tensor(p + "ffn_up.weight", by_e.matrix(ff, e), raw_dtype=Q.Q4_0)
        w.add_tensor(p + "ffn_down.weight", by_ff.matrix(e, ff), raw_dtype=Q.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_shaped_draft(path: str, target_path: str, shape: Shape, *, n_layer: int = 2, block_size: int = 16,
                       n_target_layers: int = 3, weight_type: str = "f16", seed: int = 1) -> str:
    """A random DFlash draft for a shaped target: the target's head layout and FFN width,
    `n_layer` layers, the target's embeddings and LM head (through ctx_other), F16 matrices."""
    from ..writer import DraftShape, evenly_spread_layers, random_draft_weights, write_draft

    ds = DraftShape(n_embd=shape.n_embd, n_layer=n_layer, n_head=shape.n_head, n_head_kv=shape.n_head_kv,
                    n_ff=shape.n_ff, block_size=block_size,
                    target_layers=evenly_spread_layers(shape.n_layer, n_target_layers))
    weights = random_draft_weights(ds, shape.n_vocab, seed=seed, scale=0.5 / math.sqrt(shape.n_embd))
    return write_draft(path, ds, weights, tokenizer_from=target_path, mask_token_id=3,
                       name=f"random-dflash-{shape.name}", weight_type=weight_type)


# ---- what the costs predict ----------------------------------------------------------------------

def tau_at(alpha: float, k: int) -> float:
    """Tokens per step at draft length k when each draft slot is accepted with probability alpha
    given that the one before was (a geometric chain): 1 + alpha + ... + alpha^k."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_for_tau(tau: float, k: int) -> float:
    """The per-slot acceptance alpha that gives `tau` tokens per step at draft length k."""
    if not 1.0 <= tau <= k + 1:
        raise ValueError(f"tau {tau} at draft length {k} must lie in 1..{k + 1}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if tau_at(mid, k) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def parse_tau(text: str) -> tuple[float, int, str]:
    """`T@K` or `T@K=label`: tau T measured at draft length K."""
    label = ""
    if "=" in text:
        text, label = text.split("=", 1)
    try:
        t, k = text.split("@")
        tau, kk = float(t), int(k)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TAU@K (e.g. 2.03@4), not {text!r}") from None
    if kk < 1 or not 1.0 <= tau <= kk + 1:
        raise argparse.ArgumentTypeError(f"tau {tau} at k={kk}: tau must lie in 1..k+1 and k >= 1")
    return tau, kk, label or f"tau {tau:g} at k={kk}"


#: our default draft's held-out tau at 4 draft tokens (bench/results/2026-12-04-make-bench-cpu.md), and hypothetical stronger drafts
DEFAULT_TAUS = ("1.55@4=ours, chat", "2.03@4=ours, raw code", "3@15", "5@15", "7@15")


def _shape_row(path: str, data: dict, taus: Sequence[tuple[float, int, str]]) -> dict[str, Any]:
    cell = data["cells"][0]
    costs = data.get("step_costs") or {}
    t_ord = cell["cost_model"].get("ordinary_seconds_per_token") or 0.0
    preds = {p["k"]: p for p in cell["cost_model"].get("predictions", [])}
    ordinary = costs.get("ordinary")

    def cost(kind: str, k: int) -> Optional[float]:
        table = costs.get(kind) or {}
        return table.get(str(k), table.get(k))

    # the per-step extras (injection, sampling, Python) the measured runs add to draft + verify
    extras = [p["step_cost"] * t_ord - cost("draft", k) - cost("verify", k) for k, p in preds.items()
              if cost("draft", k) is not None and cost("verify", k) is not None]
    extra = sum(extras) / len(extras) if extras else 0.0
    step: dict[int, float] = {}
    curve = []
    for k in sorted(int(x) for x in (costs.get("verify") or {})):
        v, d = cost("verify", k), cost("draft", k)
        if v is None or d is None:
            continue
        step[k] = (v + d + max(0.0, extra)) / t_ord if t_ord else 0.0
        curve.append({"k": k, "verify_over_decode": v / ordinary if ordinary else None,
                      "draft_over_decode": d / ordinary if ordinary else None,
                      "step_cost": step[k] or None, "ceiling": (k + 1) / step[k] if step[k] else None})
    predicted = []
    for tau, k_at, label in taus:
        alpha = alpha_for_tau(tau, k_at)
        best = max(((k, tau_at(alpha, k) / s) for k, s in step.items() if s), key=lambda x: x[1], default=None)
        predicted.append({"label": label, "tau": tau, "at_k": k_at, "alpha": alpha,
                          "best_k": best[0] if best else None, "speedup": best[1] if best else None})
    oracle = {k: v.get("speedup") for k, v in cell.get("oracle", {}).items()}
    oracle_decode = cell["cost_model"].get("oracle_decode_speedup", {})
    backend = (data.get("backend") or {}).get("backend")
    return {"file": os.path.basename(path), "model": data.get("model"), "draft_model": data.get("draft_model"),
            "backend": backend, "max_tokens": cell["max_tokens"],
            "ordinary_tokens_per_second": cell["ordinary"].get("aggregate_tokens_per_second"),
            "ordinary_decode_ms": 1000 * t_ord if t_ord else None, "cost_curve": curve,
            "oracle_speedup": oracle, "oracle_decode_speedup": oracle_decode, "predicted": predicted}


def summarize(paths: Sequence[str], taus: Sequence[tuple[float, int, str]] = (),
              shapes: Optional[dict[str, dict]] = None) -> dict[str, Any]:
    """Rows of the shaped targets' benchmarks: cost curve, oracle, predicted speedups per tau."""
    taus = list(taus) or [parse_tau(t) for t in DEFAULT_TAUS]
    rows = []
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        row = _shape_row(path, data, taus)
        name = os.path.basename(path).split(".")[0]
        if shapes and name in shapes:
            row["shape"] = shapes[name]
        rows.append(row)
    return {"taus": [{"tau": t, "at_k": k, "label": lab} for t, k, lab in taus], "shapes": rows}


def _f(x: Optional[float], fmt: str = "{:.2f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) else "-"


def to_markdown(summary: dict[str, Any]) -> str:
    lines = ["## Random-weight targets in real shapes (cost curve, oracle, predicted speedups)", ""]
    for row in summary["shapes"]:
        sh = row.get("shape") or {}
        head = f"### {row['file']}"
        if sh:
            size = f"{sh['params'] / 1e9:.2f}B" if sh["params"] >= 1e8 else f"{sh['params'] / 1e6:.1f}M"
            head += (f": {sh.get('like') or sh['name']}, n_embd {sh['n_embd']}, {sh['n_layer']} layers, "
                     f"{sh['n_head']}/{sh['n_head_kv']} heads, ffn {sh['n_ff']}, vocab {sh['n_vocab']}, "
                     f"{size} params, Q4_0; draft {sh.get('draft_layers', '?')} layers F16, block "
                     f"{sh.get('block_size', '?')}")
        lines += [head, "",
                  f"backend {row['backend']}, {row['max_tokens']} tokens; ordinary "
                  f"{_f(row['ordinary_tokens_per_second'], '{:.1f}')} token/s, one decode "
                  f"{_f(row['ordinary_decode_ms'], '{:.3f}')} ms", "",
                  "| k | verify k+1 rows / decode | draft block / decode | step / decode | ceiling (modelled) "
                  "| oracle (measured, decode loop) |", "|---|---|---|---|---|---|"]
        for c in row["cost_curve"]:
            lines.append(f"| {c['k']} | {_f(c['verify_over_decode'])} | {_f(c['draft_over_decode'])} | "
                         f"{_f(c['step_cost'])} | {_f(c['ceiling'])}x | "
                         f"{_f(row['oracle_decode_speedup'].get(str(c['k'])))}{'x' if str(c['k']) in row['oracle_decode_speedup'] else ''} |")
        lines += ["", "| draft | tau at k | per-slot acceptance | best k | predicted speedup |", "|---|---|---|---|---|"]
        for p in row["predicted"]:
            lines.append(f"| {p['label']} | {p['tau']:g} at {p['at_k']} | {p['alpha']:.3f} | {p['best_k'] or '-'} | "
                         f"{_f(p['speedup'])}x |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llama_dflash.bench.shapes", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write target.gguf and draft.gguf of a shape into OUT_DIR")
    w.add_argument("shape", choices=sorted(SHAPES))
    w.add_argument("out_dir")
    w.add_argument("--draft-layers", type=int, default=2)
    w.add_argument("--block-size", type=int, default=16)
    w.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("summarize", help="cost curves, oracles and predicted speedups of bench --json files")
    s.add_argument("bench_json", nargs="+")
    s.add_argument("--tau", type=parse_tau, action="append", default=[], metavar="T@K[=LABEL]",
                   help="a draft reaching T tokens per step at draft length K (repeatable; default: "
                        + ", ".join(DEFAULT_TAUS) + ")")
    s.add_argument("--json", metavar="PATH")
    s.add_argument("--md", metavar="PATH")
    a = ap.parse_args(argv)
    if a.cmd == "write":
        shape = SHAPES[a.shape]
        if a.draft_layers < 1 or a.block_size < 2:
            print("error: --draft-layers must be >= 1 and --block-size >= 2", file=sys.stderr)
            return 2
        os.makedirs(a.out_dir, exist_ok=True)
        target = write_shaped_target(os.path.join(a.out_dir, "target.gguf"), shape, seed=a.seed)
        draft = write_shaped_draft(os.path.join(a.out_dir, "draft.gguf"), target, shape, n_layer=a.draft_layers,
                                   block_size=a.block_size, seed=a.seed + 1)
        info = {**asdict(shape), "params": shape.params, "draft_layers": a.draft_layers, "block_size": a.block_size,
                "target_bytes": os.path.getsize(target), "draft_bytes": os.path.getsize(draft)}
        with open(os.path.join(a.out_dir, "shape.json"), "w", encoding="utf-8") as fh:
            json.dump(info, fh, indent=2)
        print(json.dumps(info))
        return 0
    missing = [p for p in a.bench_json if not os.path.isfile(p)]
    if missing:
        print(f"error: no such file: {missing[0]}", file=sys.stderr)
        return 2
    shapes = {}
    for p in a.bench_json:
        info = os.path.join(os.path.dirname(p), os.path.basename(p).split(".")[0] + ".shape.json")
        if os.path.isfile(info):
            with open(info, encoding="utf-8") as fh:
                shapes[os.path.basename(p).split(".")[0]] = json.load(fh)
    try:
        summary = summarize(a.bench_json, a.tau, shapes)
    except (KeyError, ValueError, json.JSONDecodeError) as exc:
        print(f"error: not a sweep's bench --json file: {exc}", file=sys.stderr)
        return 2
    md = to_markdown(summary)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=2)
    if a.md:
        with open(a.md, "w", encoding="utf-8") as fh:
            fh.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
