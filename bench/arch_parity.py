"""The preview's own architectures against llama.cpp's C++ driver, as one table (issue 41).

    . .venv/bin/activate && python bench/arch_parity.py [--tokens 64] [--markdown PATH]

For every fixture of `llama_dflash.testing.targets` (qwen35 and qwen35moe with an MTP block,
muse-glimmer, nemotron_h, gemma4) and every drafter that applies (the rigged DFlash, DSpark,
DFlash2 and reduced-vocabulary DSpark drafts of `llama_dflash.testing.drafts`, the target's MTP
head), at draft tokens 1, 4 and 7: our steps against `llama-speculative-simple`'s (the same
tokens drafted and accepted at every verification), whether our output is ordinary decoding's,
and the rollbacks ours made (native snapshots on the hybrid targets).  tests/test_arch_parity.py
asserts the same in CI; this prints the numbers.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from cpp_steps import StepRecorder, steps_within_budget  # noqa: E402
from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, TargetConfig  # noqa: E402
from llama_dflash.bench.cpp_reference import run_cpp_reference  # noqa: E402
from llama_dflash.testing.drafts import DRAFT_KINDS, write_rigged_draft  # noqa: E402
from llama_dflash.testing.targets import ARCHS, MTP_ARCHS, write_target  # noqa: E402

PROMPT = "the quick brown fox and the lazy dog is"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--binary", default=os.path.join(os.path.expanduser("~/.cache"), "llama-cpp-reference",
                                                      "build", "bin", "llama-speculative-simple"))
    ap.add_argument("--markdown", metavar="PATH", help="also write the table as Markdown")
    args = ap.parse_args()
    rows = ["| arch | speculator | k | accepted / drafted (ours) | C++ | same steps | output = ordinary | rollbacks |",
            "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ARCHS:
            fx = write_target(os.path.join(tmp, f"{arch}.gguf"), arch, mtp=arch in MTP_ARCHS)
            drafts = {k: write_rigged_draft(os.path.join(tmp, f"{arch}.{k}.gguf"), fx, k) for k in DRAFT_KINDS}
            drafts["dspark-d2t"] = write_rigged_draft(os.path.join(tmp, f"{arch}.d2t.gguf"), fx, "dspark",
                                                      draft_vocab=150)
            cfg = TargetConfig(fx.path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2)
            with OrdinaryDecoding(cfg) as o:
                ref = o.generate(o.tokenize(PROMPT), args.tokens).tokens
            kinds = list(drafts) + (["mtp"] if arch in MTP_ARCHS else [])
            for kind in kinds:
                for k in (1, 4, 7):
                    spec = (SpecConfig(spec_type="draft-mtp", draft_n_max=k) if kind == "mtp"
                            else SpecConfig(drafts[kind], draft_n_max=k))
                    with LlamaDFlashDecoding(cfg, spec) as eng:
                        rec = StepRecorder(eng.proposer)
                        eng.use_proposer(rec)
                        res = eng.generate(eng.tokenize(PROMPT), args.tokens)
                        stats = eng.last_stats
                    cpp = run_cpp_reference(args.binary, fx.path, None if kind == "mtp" else drafts[kind], PROMPT,
                                            n_predict=args.tokens, draft_n_max=k, draft_p_min=0.0, n_ctx=512,
                                            n_batch=64, n_ubatch=64, threads=2, repack=False, timeout=300,
                                            spec_types=["draft-mtp"] if kind == "mtp" else None, timed=False)
                    theirs = steps_within_budget(cpp.steps, args.tokens)
                    ours = rec.steps[: len(theirs)]
                    name = "draft-mtp" if kind == "mtp" else f"draft-{kind}"
                    row = (f"| {arch} | {name} | {k} | {sum(a for a, _ in ours)} / {sum(d for _, d in ours)} | "
                           f"{sum(a for a, _ in theirs)} / {sum(d for _, d in theirs)} | "
                           f"{'yes' if ours == theirs else 'NO'} | {'yes' if res.tokens == ref else 'NO'} | "
                           f"{stats.rollbacks} ({stats.rollback_mode}) |")
                    rows.append(row)
                    print(row, flush=True)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
