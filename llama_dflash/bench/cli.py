"""Compare ordinary and speculative (DFlash/DSpark) decoding on one target/draft pair.

Without --model/--draft-model it runs the embedded default pair (SmolLM2-135M-Instruct and its
draft).  Prints the [ordinary], [dflash|dspark] and [comparison] blocks; --json writes the same
facts to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..config import SpecConfig, TargetConfig
from ..inspect import read_gguf
from ..sampling import SamplingParams
from .format import format_result
from .runner import BenchConfig, run_benchmark

__all__ = ["configure", "run", "DEFAULT_PROMPT", "chat_wrap"]

DEFAULT_PROMPT = (
    "Write a Python function that checks whether a number is prime, then explain step by step "
    "how it works and list three test cases."
)


def configure(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("models")
    m.add_argument("--model", help="target GGUF (default: the embedded SmolLM2-135M-Instruct)")
    m.add_argument("--draft-model", help="DFlash/DSpark draft GGUF (default: the draft for the default model)")
    m.add_argument("--algorithm", choices=("auto", "dflash", "dspark"), default="auto")
    d = p.add_argument_group("drafting")
    d.add_argument("--draft-tokens", type=int, default=7, help="draft_n_max (clamped to the draft's block)")
    d.add_argument("--draft-n-min", type=int, default=0)
    d.add_argument("--draft-p-min", type=float, default=0.0)
    d.add_argument("--no-backend-sampling", action="store_true")
    g = p.add_argument_group("generation")
    g.add_argument("--prompt", default=DEFAULT_PROMPT)
    g.add_argument("--raw-prompt", action="store_true", help="do not wrap the prompt in the model's chat format")
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--warmup-tokens", type=int, default=32)
    g.add_argument("--runs", type=int, default=3)
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0)
    c = p.add_argument_group("context")
    c.add_argument("--n-ctx", type=int, default=2048)
    c.add_argument("--n-batch", type=int, default=512)
    c.add_argument("--n-ubatch", type=int, default=512)
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--n-gpu-layers", type=int, default=-1)
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="PATH", help="write the results as JSON")
    o.add_argument("--quiet", action="store_true", help="no progress messages on stderr")
    o.add_argument("--verbose", action="store_true", help="show llama.cpp's log")


def chat_wrap(model_path: str, prompt: str) -> str:
    """Wrap a user prompt in ChatML when the model's template is ChatML (SmolLM2, Qwen)."""
    template = read_gguf(model_path).get("tokenizer.chat_template") or ""
    if "<|im_start|>" in template:
        return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    return prompt


def _resolve_models(args: argparse.Namespace) -> tuple[str, str]:
    from ..defaults import default_draft_path, smollm2_path

    model = args.model or smollm2_path()
    draft = args.draft_model
    if draft is None:
        if args.model is not None and os.path.basename(args.model) != os.path.basename(smollm2_path()):
            raise ValueError("--draft-model is required with a --model other than the default")
        draft = default_draft_path(model)
    return model, draft


def _check_output_path(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"--json {path}: directory {parent} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"--json {path}: is a directory")


def build_config(args: argparse.Namespace) -> BenchConfig:
    if args.json:
        _check_output_path(args.json)
    model, draft = _resolve_models(args)
    target = TargetConfig(model, n_ctx=args.n_ctx, n_batch=args.n_batch, n_ubatch=args.n_ubatch,
                          n_threads=args.threads, n_gpu_layers=args.n_gpu_layers, verbose=args.verbose)
    spec = SpecConfig(draft, algorithm=args.algorithm, draft_n_max=args.draft_tokens,
                      draft_n_min=args.draft_n_min, draft_p_min=args.draft_p_min,
                      backend_sampling=not args.no_backend_sampling)
    prompt = args.prompt if args.raw_prompt else chat_wrap(model, args.prompt)
    return BenchConfig(target, spec, prompt, max_tokens=args.max_tokens, warmup_tokens=args.warmup_tokens,
                       runs=args.runs, ignore_eos=args.ignore_eos,
                       sampling=SamplingParams(temperature=args.temperature, seed=args.seed))


def run(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    show = not args.quiet and sys.stderr.isatty()
    progress = (lambda msg: sys.stderr.write(f"\r\033[K{msg}")) if show else None
    result = run_benchmark(cfg, progress)
    if show:
        sys.stderr.write("\r\033[K")
    print(format_result(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result.to_dict(), fh, indent=2)
    return 0
