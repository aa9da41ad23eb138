"""`llama-dflash doctor [TARGET [DRAFT...]]`: check a target and its drafts, say what applies, and the break-even tau.

Without arguments: the embedded default pair.  Exit code 0 when every check passes, 2 when one
fails (the report says which field and what to do); --json prints the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["configure", "run"]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", help="target GGUF (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("drafts", nargs="*", metavar="DRAFT",
                   help="draft GGUFs to check against the target (default with the default target: its shipped draft)")
    p.add_argument("--no-probe", action="store_true", help="skip the cost probe (no break-even tau)")
    p.add_argument("--n-gpu-layers", type=int, default=-1, help="target layers on the GPU for the probe (default: all)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")


def run(args: argparse.Namespace) -> int:
    from .defaults import default_draft_path, smollm2_path
    from .doctor import diagnose, format_diagnosis

    target, drafts = args.target, list(args.drafts)
    if target is None:
        target = smollm2_path()
        drafts = [default_draft_path(target)]
    diag = diagnose(target, drafts, probe=not args.no_probe, n_gpu_layers=args.n_gpu_layers, n_threads=args.threads)
    if args.json:
        sys.stdout.write(json.dumps(diag.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(format_diagnosis(diag) + "\n")
    return 0 if diag.ok else 2
