"""`llama-dflash generate`: one prompt through the engine, the text on stdout.

--spec-type picks the speculative types as in `bench` (`none`: ordinary decoding); a statistics
line goes to stderr and --json writes text, tokens and statistics.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from .cli import UsageError
from .config import ALGORITHMS

__all__ = ["configure", "run"]


def configure(p: argparse.ArgumentParser) -> None:
    from .bench.cli import DEFAULT_PROMPT, add_spec_type_args, draft_tokens_arg

    m = p.add_argument_group("models")
    m.add_argument("--model", help="target GGUF (default: the embedded SmolLM2-135M-Instruct)")
    m.add_argument("--draft-model", help="draft GGUF: DFlash/DSpark, an EAGLE-3 head, or a classic draft model "
                                         "with --spec-type draft-simple (default: the draft for the default model; "
                                         "none is loaded when --spec-type needs none)")
    m.add_argument("--algorithm", choices=ALGORITHMS, default="auto")
    d = p.add_argument_group("drafting")
    add_spec_type_args(d)
    d.add_argument("--draft-tokens", type=draft_tokens_arg, default="auto",
                   help="draft_n_max (clamped to the draft's block), or 'auto' (the default): adaptive")
    d.add_argument("--draft-n-min", type=int, default=0)
    d.add_argument("--draft-p-min", type=float, default=0.0)
    d.add_argument("--backend-sampling", choices=("auto", "on", "off"), default="auto")
    d.add_argument("--rollback", choices=("auto", "native", "checkpoint"), default="auto")
    g = p.add_argument_group("generation")
    g.add_argument("--prompt", default=DEFAULT_PROMPT)
    g.add_argument("--raw-prompt", action="store_true", help="do not wrap the prompt in the model's chat format")
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0)
    c = p.add_argument_group("context")
    c.add_argument("--n-ctx", type=int, default=2048)
    c.add_argument("--n-batch", type=int, default=512)
    c.add_argument("--n-ubatch", type=int, default=512)
    c.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--n-gpu-layers", type=int, default=None, help="target layers on the GPU (default: all, -1)")
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="PATH", help="write text, tokens, finish reason and statistics as JSON")
    o.add_argument("--quiet", action="store_true", help="no statistics line on stderr")
    o.add_argument("--show-drafts", action="store_true",
                   help="stream the answer with each accepted draft token marked by the speculator that drafted "
                        "it: colour on a terminal, brackets elsewhere ([...], {...}, ...; a legend on stderr)")
    o.add_argument("--verbose", action="store_true", help="show llama.cpp's log")


def run(args: argparse.Namespace) -> int:
    from .bench.cli import (DEFAULT_SPEC_TYPE, _check_output_path, _wrap, resolve_models, spec_config,
                            spec_type_names, target_config)
    from .engine import LlamaDFlashDecoding, OrdinaryDecoding
    from .draft_models import validate_draft_files
    from .inspect import check_target_file
    from .sampling import SamplingParams

    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, not {args.max_tokens}")
    if args.json:
        _check_output_path(args.json)
    ordinary = args.spec_type is not None and not spec_type_names(args.spec_type)  # --spec-type none
    if ordinary:
        from .defaults import smollm2_path

        if args.draft_model:
            raise UsageError(f"--draft-model {args.draft_model} is given but --spec-type none drafts nothing")
        model, spec = args.model or smollm2_path(), None
        check_target_file(model)
    else:
        model, draft = resolve_models(args)
        if args.spec_type is None and draft is not None:
            args.spec_type = DEFAULT_SPEC_TYPE
        spec = spec_config(args, draft)
        if spec.draft_model is not None:
            validate_draft_files(model, spec.draft_model, spec.algorithm)
        else:
            check_target_file(model)  # n-gram types and lookup: any architecture
    target = target_config(args, model)
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed)
    t0 = time.perf_counter()
    engine: Any = OrdinaryDecoding(target) if spec is None else LlamaDFlashDecoding(target, spec)
    origins: list = []
    with engine:
        prompt = engine.tokenize(_wrap(args, model, args.prompt))
        algorithm = "ordinary" if spec is None else engine.algorithm
        names = () if spec is None else engine.speculator_names
        if args.show_drafts:
            res, origins, marker = _show_drafts(engine, prompt, args, sampling, names)
        else:
            res = engine.generate(prompt, args.max_tokens, sampling, ignore_eos=args.ignore_eos)
        text = engine.detokenize(res.tokens)
    seconds = time.perf_counter() - t0
    if args.show_drafts:
        sys.stdout.write("\n")
        sys.stdout.flush()
        if not args.quiet:
            sys.stderr.write(marker.legend() + "\n")
    else:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    s = res.stats
    if not args.quiet:
        line = f"llama-dflash generate: {algorithm}: {len(res.tokens)} tokens ({res.finish_reason}), " \
               f"{s.tokens_per_second:.2f} token/s"
        if spec is not None:
            line += (f", {s.accepted}/{s.drafted} drafted tokens accepted, tau {s.tokens_per_step:.2f} "
                     f"in {s.verification_steps} steps")
        sys.stderr.write(line + "\n")
    if args.json:
        from .bench.runner import merge_speculators, speculator_summary

        raw: dict = {}
        merge_speculators(raw, s)
        data = {"text": text, "tokens": res.tokens, "finish_reason": res.finish_reason, "algorithm": algorithm,
                "speculators": list(names), "prompt_tokens": len(prompt), "seconds": seconds,
                "stats": s.to_dict(), "speculator_stats": speculator_summary(raw)}
        if args.show_drafts:
            data["token_origins"] = origins
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2)
    return 0


def _show_drafts(engine: Any, prompt: list, args: argparse.Namespace, sampling: Any, names: tuple) -> tuple:
    """Stream the answer to stdout with its accepted draft tokens marked; (result, origins, marker)."""
    from .engine import GenerationResult
    from .generate import GenerationState
    from .origins import OriginTracker, TextPieces, TokenOrigin
    from .show import DraftMarker, token_bytes, use_colour

    marker = DraftMarker(sys.stdout, use_colour(sys.stdout))
    vocab = engine.target.model.vocab
    pieces = TextPieces(lambda t: token_bytes(vocab, t), errors="replace")  # as engine.detokenize
    proposer = getattr(engine, "proposer", None)
    tracker = OriginTracker(proposer, names[0] if names else "draft") if names else None
    state = GenerationState()
    tokens: list[int] = []
    origins: list[dict] = []
    if tracker is not None:
        tracker.attach()
        tracker.reset()
    try:
        for tok in engine.stream(prompt, args.max_tokens, sampling, ignore_eos=args.ignore_eos, state=state):
            origin = tracker.mark(tok) if tracker is not None else TokenOrigin(int(tok), "target")
            text = pieces.piece(tok)
            marker.write(text, origin)
            sys.stdout.flush()
            tokens.append(int(tok))
            origins.append(origin.to_dict(text))
    finally:
        if tracker is not None:
            tracker.detach()
        marker.close()
    return GenerationResult(tokens, state.finish_reason, engine.last_stats), origins, marker
