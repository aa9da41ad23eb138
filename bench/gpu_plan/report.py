"""The device plan's report.md: the machine and build, the GPU test subset, the default pair's
sweep as a table (tau, tokens/s, speedup, oracle, cost curve, ours vs C++), then the shaped
targets (shapes.md) and the sweep's own filled-in report.

    python bench/gpu_plan/report.py STATE_DIR OUT.md
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Optional


def _load(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _f(x: Any, fmt: str = "{:.2f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) else "-"


def pair_table(d: dict) -> list[str]:
    """One row per draft length of the sweep's first cell."""
    cell = d["cells"][0]
    ordinary = cell["ordinary"]
    costs = d.get("step_costs") or {}
    unit = costs.get("ordinary")
    oracle_dec = cell["cost_model"].get("oracle_decode_speedup", {})
    measured_dec = cell["cost_model"].get("measured_decode_speedup", {})
    lines = [f"ordinary: {_f(ordinary['aggregate_tokens_per_second'], '{:.1f}')} token/s "
             f"(decode loop {_f(ordinary.get('decode_tokens_per_second'), '{:.1f}')}), {cell['max_tokens']} tokens, "
             f"one decode {_f(1000 * unit if unit else None, '{:.3f}')} ms", "",
             "| k | tau | speculative token/s | speedup | decode-loop speedup | oracle (decode loop) | "
             "verify k+1 / decode | draft block / decode | output identical |",
             "|---|---|---|---|---|---|---|---|---|"]
    for k, m in cell["speculative"].items():
        s = m["stats"]
        v = (costs.get("verify") or {}).get(k)
        dr = (costs.get("draft") or {}).get(k)
        lines.append(f"| {k} | {_f(s.get('tokens_per_step'))} | {_f(m['aggregate_tokens_per_second'], '{:.1f}')} | "
                     f"{_f(m.get('speedup'))}x | {_f(measured_dec.get(k))}x | "
                     f"{_f(oracle_dec.get(k)) + 'x' if k in oracle_dec else '-'} | "
                     f"{_f(v / unit if v and unit else None)} | {_f(dr / unit if dr and unit else None)} | "
                     f"{'yes' if m.get('output_tokens_match') else 'NO: first divergence ' + str(m.get('first_divergence'))} |")
    cpp = d.get("cpp_reference")
    if cpp:
        lines += ["", "C++ driver (llama-speculative-simple, same build, at the fastest fixed k): "
                      f"{_f(cpp.get('tokens_per_second'), '{:.1f}')} token/s decode, ours "
                      f"{_f(cpp.get('ours', {}).get('tokens_per_second'), '{:.1f}')}: ours / C++ "
                      f"{_f(cpp.get('ours_over_cpp'), '{:.3f}')}x; accepted identical: {cpp.get('accepted_identical')}"]
    lines += ["", f"cost model: {cell['cost_model'].get('summary', '')}; {cell['cost_model'].get('verdict', '')}"]
    return lines


def build_report(state: str) -> str:
    res = os.path.join(state, "results")
    build = _load(os.path.join(state, "build.json")) or {}
    backend = _load(os.path.join(state, "backend.json")) or {}
    gpus = [d.get("description") or d.get("name") for d in backend.get("devices", []) if d.get("is_gpu")]
    out = ["# Device plan results", "",
           f"- machine: {', '.join(g for g in gpus if g) or 'no GPU device'}; backend {backend.get('backend', '?')}",
           f"- build: {build.get('mode', '?')}, `{build.get('cmake_args', '')}`, configure "
           f"{build.get('configure_seconds', '-')} s, compile {build.get('build_seconds', '-')} s with "
           f"{build.get('jobs', '?')} jobs; kit commit {str(build.get('kit_commit', ''))[:10]}"]
    tests = _read(os.path.join(res, "tests.log")).strip().splitlines()
    out.append(f"- GPU test subset: {tests[-1] if tests else 'not run'}")
    pair = _load(os.path.join(res, "bench.json"))
    out += ["", "## The default pair (SmolLM2-135M-Instruct + the shipped draft)", ""]
    if pair:
        try:
            out += pair_table(pair)
        except (KeyError, IndexError, TypeError) as exc:
            out.append(f"(bench.json could not be read: {exc!r})")
    else:
        out.append("(no bench.json: the sweep did not finish; see plan.log)")
    shapes = _read(os.path.join(res, "shapes.md"))
    out += ["", shapes if shapes else "## Random-weight targets\n\n(no shapes.md: step 2 did not finish)"]
    sweep = _read(os.path.join(res, "pair-report.md"))
    if sweep:
        out += ["", "## The sweep's filled-in report (llama-dflash bench --report)", "", sweep]
    return "\n".join(out) + "\n"


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: report.py STATE_DIR OUT.md", file=sys.stderr)
        return 2
    text = build_report(sys.argv[1])
    with open(sys.argv[2], "w", encoding="utf-8") as fh:
        fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
