"""Rewrite an existing draft GGUF (`llama-dflash export`): reduced output vocabulary, weight type.

`--reduce-vocab N` gives the draft its own LM head over the N target tokens the target emits most
(rows sliced from the head it used before, plus `d2t`), so it no longer runs the target's full head
for every block row; `--quantize` writes its matrices as f16, q8_0 or q4_0. No retraining.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..writer import WEIGHT_TYPES

__all__ = ["configure", "run", "default_weight_type"]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="draft GGUF to read (DFlash/DSpark; EAGLE-3 and draft-simple drafts: "
                                 "--quantize and --hf-output)")
    p.add_argument("output", nargs="?", help="draft GGUF to write (optional with --hf-output)")
    p.add_argument("--hf-output", metavar="DIR", help="also write the draft in the Hugging Face layout of the "
                                                       "z-lab DFlash/DSpark checkpoints (config.json + model.safetensors)")
    p.add_argument("--hf-target-dir", metavar="DIR",
                   help="with --hf-output: also write the target's tokenizer (from --model) as a Hugging Face "
                        "directory, for convert_hf_to_gguf.py --target-model-dir")
    p.add_argument("--model", help="target GGUF (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--reduce-vocab", type=int, metavar="N",
                   help="keep an own LM head over the N target tokens the target emits most (writes d2t)")
    p.add_argument("--vocab-data", metavar="WORKDIR",
                   help="count tokens in a `llama-dflash train` workdir's data cache")
    p.add_argument("--vocab-text", action="append", default=[], metavar="FILE",
                   help="count tokens of a text file (repeatable)")
    p.add_argument("--vocab-prompts", type=int, default=None, metavar="N",
                   help="count tokens of the target's greedy answers to N built-in prompts "
                        "(default 64 when no other source is given)")
    p.add_argument("--vocab-max-new-tokens", type=int, default=96, help="answer length for --vocab-prompts")
    p.add_argument("--quantize", choices=WEIGHT_TYPES, help="weight type of the draft's matrices "
                                                             "(default: the input's)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for --vocab-prompts")


def default_weight_type(path: str) -> str:
    """The weight type of a draft's first attention matrix, if one we can write; else f32."""
    from ..inspect import read_gguf

    types = read_gguf(path).tensor_types
    names = {0: "f32", 1: "f16", 8: "q8_0", 2: "q4_0"}
    return names.get(types.get("blk.0.attn_q.weight", 0), "f32")


def run(args: argparse.Namespace) -> int:
    from ..defaults import smollm2_path
    from ..inspect import read_draft, read_gguf, validate_pair

    model_path = args.model or smollm2_path()
    for path in (args.input, model_path):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model not found: {path}")
    if args.hf_target_dir and not args.hf_output:
        raise ValueError("--hf-target-dir needs --hf-output")
    if not args.output and not args.hf_output:
        raise ValueError("give an output GGUF, --hf-output DIR, or both")
    if not args.output and (args.reduce_vocab is not None or args.quantize):
        raise ValueError("--reduce-vocab and --quantize need an output GGUF")
    if args.hf_target_dir and os.path.isfile(args.hf_target_dir):
        raise ValueError(f"--hf-target-dir {args.hf_target_dir} is a file, not a directory")
    if args.hf_output and os.path.isfile(args.hf_output):
        raise ValueError(f"--hf-output {args.hf_output} is a file, not a directory")
    if args.output and os.path.isdir(args.output):
        raise ValueError(f"output {args.output} is a directory")
    if args.output and os.path.abspath(args.output) == os.path.abspath(args.input):
        raise ValueError("the output must be another file than the input")
    target = read_gguf(model_path)
    if read_gguf(args.input).architecture in ("eagle3", "llama"):
        if os.path.realpath(args.input) == os.path.realpath(model_path):
            raise ValueError(f"{args.input} is the target itself, not a draft")
        return _run_autoregressive(args, target)
    draft = read_draft(args.input)
    validate_pair(target, draft)
    if args.reduce_vocab is not None and not 0 < args.reduce_vocab <= target.n_vocab:
        raise ValueError(f"--reduce-vocab must be in 1..{target.n_vocab}, not {args.reduce_vocab}")
    if args.vocab_prompts is not None and args.vocab_prompts < 0:
        raise ValueError(f"--vocab-prompts must be >= 0, not {args.vocab_prompts}")
    if args.vocab_max_new_tokens < 1:
        raise ValueError(f"--vocab-max-new-tokens must be >= 1, not {args.vocab_max_new_tokens}")
    if args.hf_target_dir:
        from .hf_target import write_target_dir

        write_target_dir(model_path, args.hf_target_dir)  # refuses a tokenizer it cannot rebuild, first
    if not args.output:
        from .hf_export import export_hf

        export_hf(args.input, args.hf_output)
        print(json.dumps({"input": args.input, "hf_output": args.hf_output,
                          "hf_target_dir": args.hf_target_dir}, indent=1))
        return 0
    weight_type = args.quantize or default_weight_type(args.input)

    from .draftfile import read_draft_tensors, reduce_head, rewrite_draft

    tensors = read_draft_tensors(args.input)
    report: dict = {"input": args.input, "output": args.output, "weight_type": weight_type}
    if args.reduce_vocab is not None:
        counts = raw = vocab_counts(args, model_path, target)
        from .vocab import choose_vocab, coverage, end_tokens

        always = end_tokens(target)
        if "d2t" in tensors:  # already reduced: choose among its tokens
            allowed = set(int(t) for t in tensors["d2t"])
            if args.reduce_vocab > len(allowed):
                raise ValueError(f"--reduce-vocab {args.reduce_vocab} exceeds the draft's vocabulary ({len(allowed)})")
            counts = _restrict(counts, allowed)
            always = [t for t in always if t in allowed]
        keep = choose_vocab(counts, args.reduce_vocab, always)
        tensors = reduce_head(tensors, keep, model_path)
        report.update(reduced_vocab=len(keep), counted_tokens=int(raw.sum()),
                      coverage_of_counted=round(coverage(raw, keep), 5))
    rewrite_draft(args.input, args.output, tensors, weight_type=weight_type)
    validate_pair(target, read_draft(args.output))
    report["bytes"] = os.path.getsize(args.output)
    if args.hf_output:
        from .hf_export import export_hf

        export_hf(args.output, args.hf_output)
        report["hf_output"] = args.hf_output
    print(json.dumps(report, indent=1))
    return 0


def _run_autoregressive(args: argparse.Namespace, target) -> int:
    """An EAGLE-3 head or a draft-simple llama: another weight type and/or the Hugging Face layout.
    Their heads are chosen when training (`--train-vocab`), so --reduce-vocab does not apply."""
    from ..inspect import read_gguf

    draft = read_gguf(args.input)
    if args.reduce_vocab is not None:
        raise ValueError(f"--reduce-vocab rewrites DFlash/DSpark drafts; {args.input} is an {draft.architecture} "
                         "draft (train it with --train-vocab N)")
    if draft.tokens != target.tokens:
        raise ValueError(f"{args.input} has another vocabulary than the target {target.basename}")
    if draft.architecture == "eagle3" and int(draft.get("eagle3.target_hidden_size") or 0) != target.n_embd:
        raise ValueError(f"{args.input} reads {draft.get('eagle3.target_hidden_size')}-wide target layers; "
                         f"{target.basename}'s are {target.n_embd} wide")
    if args.hf_target_dir:
        from .hf_target import write_target_dir

        write_target_dir(target.path, args.hf_target_dir)
    report: dict = {"input": args.input, "architecture": draft.architecture}
    src = args.input
    if args.output:
        from .draftfile import read_draft_tensors, rewrite_draft

        weight_type = args.quantize or default_weight_type(args.input)
        rewrite_draft(args.input, args.output, read_draft_tensors(args.input), weight_type=weight_type)
        report.update(output=args.output, weight_type=weight_type, bytes=os.path.getsize(args.output))
        src = args.output
    if args.hf_output:
        from .hf_export import export_hf

        export_hf(src, args.hf_output)
        report.update(hf_output=args.hf_output, hf_target_dir=args.hf_target_dir)
    print(json.dumps(report, indent=1))
    return 0


def _restrict(counts, allowed: set[int]):
    """Counts with every token outside `allowed` pushed below any allowed one."""
    import numpy as np

    out = np.full_like(counts, -1)
    idx = np.fromiter(allowed, dtype=np.int64)
    out[idx] = counts[idx]
    return out


def vocab_counts(args: argparse.Namespace, model_path: str, target):
    """Token counts from every source named on the command line (default: 64 built-in prompts)."""
    import numpy as np

    from .vocab import counts_from_cache, counts_from_generation, counts_from_texts

    counts = np.zeros(target.n_vocab, dtype=np.int64)
    n_prompts = args.vocab_prompts
    if n_prompts is None and not args.vocab_data and not args.vocab_text:
        n_prompts = 64
    if args.vocab_data:
        counts += counts_from_cache(target.n_vocab, args.vocab_data)
    if args.vocab_text:
        counts += counts_from_texts(model_path, args.vocab_text)
    if n_prompts:
        from .prompts import builtin_prompts, chat_wrap

        template = target.get("tokenizer.chat_template") or ""
        counts += counts_from_generation(model_path, builtin_prompts(n_prompts), max_new_tokens=args.vocab_max_new_tokens,
                                         n_threads=args.threads, wrap=lambda p: chat_wrap(template, p),
                                         progress=sys.stderr.isatty())
    return counts
