"""Cost of validating a target/draft pair before llama.cpp sees them, with and without `d2t`.

    . .venv/bin/activate && python bench/gguf_validation.py [--runs 5] [--draft-vocab 8192]

On SmolLM2-135M with two random drafts (full vocabulary, and a reduced vocabulary with d2t),
median seconds of `validate_files` (both headers read and every check run) and, for reference,
of reading the d2t draft through `gguf.GGUFReader` (what d2t validation used to do: every tensor
of the file), side by side with the ratio to the full-vocabulary draft.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Callable

from llama_dflash.defaults import smollm2_path
from llama_dflash.inspect import validate_files
from llama_dflash.writer import write_random_draft


def _median(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    args = ap.parse_args()
    target = smollm2_path()
    with tempfile.TemporaryDirectory() as tmp:
        plain = write_random_draft(os.path.join(tmp, "plain.gguf"), target, seed=1)
        d2t = write_random_draft(os.path.join(tmp, "d2t.gguf"), target, seed=1, draft_vocab=args.draft_vocab)

        def whole_file() -> None:
            from gguf import GGUFReader

            reader = GGUFReader(d2t, "r")
            for t in reader.tensors:
                t.data.sum()  # touch every tensor, as a full read does

        rows = [
            ("validate_files, full-vocabulary draft", _median(lambda: validate_files(target, plain), args.runs)),
            ("validate_files, d2t draft", _median(lambda: validate_files(target, d2t), args.runs)),
            ("gguf.GGUFReader over the d2t draft", _median(whole_file, args.runs)),
        ]
    base = rows[0][1]
    print(f"{'what':44s} {'median s':>9s} {'vs full-vocab':>14s}")
    for name, secs in rows:
        print(f"{name:44s} {secs:9.3f} {secs / base:13.2f}x")


if __name__ == "__main__":
    main()
