"""Train a draft for a GGUF target by self-distillation (`llama-dflash train`).

Steps: the target answers prompts (built-in mixed set or --prompts), its layer inputs are
extracted through llama.cpp exactly as the engine does and cached in --workdir, a PyTorch draft
matching the llama.cpp graph that will run it is trained on them, exported to --output, checked
for top-1 parity against llama.cpp and evaluated for acceptance on held-out prompts.

`--algorithm`: dflash / dspark (block drafts, architecture `dflash`), eagle3 (an EAGLE-3 head over
three target layers, trained with the training-time test; architecture `eagle3`), simple (a small
llama distilled from the target for `draft-simple`; architecture `llama`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..writer import WEIGHT_TYPES
from . import DATA_BACKENDS, DEVICES

__all__ = ["configure", "run", "ALGORITHMS"]

#: what `--algorithm` trains: block drafts (dflash, dspark) and autoregressive ones (eagle3, simple)
ALGORITHMS = ("dflash", "dspark", "eagle3", "simple")
AUTOREGRESSIVE = ("eagle3", "simple")


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, not {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="target GGUF (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--output", required=True, help="draft GGUF to write")
    p.add_argument("--prompts", help="prompt file: one prompt per line, or JSONL with a \"prompt\" field "
                                     "(default: a built-in mixed set)")
    p.add_argument("--data", choices=("mix", "prompts"),
                   help="mix (the default without --prompts): stdlib code, the target's own questions, raw and "
                        "chat, whole sources held out, several sequences per decode; prompts (the default with "
                        "--prompts): --prompts or the built-in set, chat-wrapped, one sequence at a time")
    p.add_argument("--data-tokens", type=int, default=300_000,
                   help="mix: generate until the training answers reach this many tokens (default 300000)")
    p.add_argument("--n-seq", type=int, default=8,
                   help="mix: sequences per target decode, or per batch with --data-backend torch (default 8; "
                        "a GPU takes 256 or more)")
    p.add_argument("--data-backend", choices=DATA_BACKENDS, default="llama.cpp",
                   help="mix: what answers the prompts: llama.cpp (default), or torch, a PyTorch copy of the target "
                        "rebuilt from its GGUF on --device, hundreds of sequences per batch on a GPU (llama targets)")
    p.add_argument("--sampled-every", type=int, default=4,
                   help="mix: every N-th training prompt also gets a sampled (T=0.8) answer; 1: every prompt, "
                        "0: none (default 4)")
    p.add_argument("--seed-samples", type=int, default=1,
                   help="mix: questions the target writes per topic seed (default 1; 0: none, the topic prompts "
                        "only -- phase A's ~410 seed answers take minutes on a busy CPU)")
    p.add_argument("--data-only", action="store_true",
                   help="stop after making (or completing) the data in --workdir; a later run trains on it")
    p.add_argument("--reuse-data", action="store_true",
                   help="train on the data already in --workdir as it is, generating nothing (e.g. several "
                        "draft shapes on one data set, or data made elsewhere)")
    p.add_argument("--add-greedy-labels", action="store_true",
                   help="mix: for a cache made before the target's greedy choices were recorded, compute them for its "
                        "sampled answers (one llama.cpp prefill per sampled sequence) so they train on what greedy "
                        "verification accepts; new caches record them while generating")
    p.add_argument("--distill", type=float, default=0.0, metavar="W",
                   help="train each slot on the target's next-token distribution with weight W in (0, 1], the greedy "
                        "label with 1 - W (default 0: the label only); the distributions are recomputed once from "
                        "the cached inputs of the target's last layers (llama targets, PyTorch on --device)")
    p.add_argument("--soft-top-k", type=int, default=16,
                   help="with --distill: target tokens kept per row (default 16)")
    p.add_argument("--eval-seqs", type=int, default=48, help="mix: held-out greedy sequences (default 48)")
    p.add_argument("--n-prompts", type=int, default=300, help="training prompts to use (default 300)")
    p.add_argument("--eval-prompts", type=int, default=8, help="held-out prompts for evaluation (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="answer length per prompt (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="target sampling temperature for the data (0: greedy)")
    p.add_argument("--target-layers", type=_int_list, help="target layer ids (default: 3 evenly spread)")
    p.add_argument("--draft-layers", type=int, default=None,
                   help="draft transformer layers (default 1; simple: 2; eagle3 has exactly 1)")
    p.add_argument("--block-size", type=int, default=8, help="DFlash block size (default 8)")
    p.add_argument("--init-from-target", action="store_true",
                   help="start every draft layer from the target's deepest injected layer (its heads, feed-forward "
                        "width and rope base), fc passing that layer's input through; default: random weights")
    p.add_argument("--init-from-draft", metavar="DRAFT",
                   help="start from this draft GGUF's weights (same shape; any weight type; its vocabulary may "
                        "differ) and keep training it on this run's data")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step (default 8)")
    p.add_argument("--anchors-per-seq", type=int, default=8,
                   help="blocks per sequence per step (default 8); eagle3: chains per sequence run past step 0")
    p.add_argument("--workdir", help="features cache and checkpoints, resumable (default: OUTPUT.work)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (llama.cpp and torch)")
    p.add_argument("--algorithm", choices=ALGORITHMS, default="dflash",
                   help="dflash (default); dspark adds a Markov head and a confidence head; eagle3: an EAGLE-3 head "
                        "over three target layers (llama.cpp draft-eagle3); simple: a small llama distilled from the "
                        "target (llama.cpp draft-simple)")
    p.add_argument("--ttt-steps", type=int, default=4,
                   help="eagle3: draft rows per chain in the training-time test, the head run on its own outputs "
                        "(default 4; also the evaluation's draft tokens unless --eval-draft-tokens)")
    p.add_argument("--copy-layers", type=_int_list, metavar="IDS",
                   help="simple: the target layers the draft layers start from (default: spread over the depth, "
                        "first and last included)")
    p.add_argument("--random-layers", action="store_true",
                   help="simple: start the draft layers from random weights instead of target layers")
    p.add_argument("--markov-rank", type=int, default=64, help="DSpark Markov head rank (default 64)")
    p.add_argument("--no-confidence-head", action="store_true", help="DSpark without a confidence head")
    p.add_argument("--train-vocab", type=int, default=0, metavar="N",
                   help="train against the N target tokens most frequent in the training answers (a reduced head, "
                        "exported with d2t; much faster steps); 0: the full vocabulary")
    p.add_argument("--eval-draft-tokens", type=int, default=0,
                   help="draft tokens per step of the final engine evaluation (default: block size - 1)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="held-out proxy acceptance every N steps; the best checkpoint is kept (0: never)")
    p.add_argument("--patience", type=int, default=0,
                   help="stop after this many evaluations without improvement (0: never stop early)")
    p.add_argument("--train-minutes", type=float, default=0.0, help="stop training after this many minutes (0: no limit)")
    p.add_argument("--reduce-vocab", type=int, metavar="N",
                   help="export an own LM head over the N target tokens most frequent in the data (d2t)")
    p.add_argument("--quantize", choices=WEIGHT_TYPES, default="f32", help="weight type of the exported draft")
    p.add_argument("--hf-output", metavar="DIR", help="also write the draft in the Hugging Face layout "
                                                       "(config.json + model.safetensors) for vLLM/SGLang")
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="where PyTorch trains: auto picks CUDA, then Apple MPS, then the CPU")
    p.add_argument("--n-gpu-layers", type=int, default=-1,
                   help="target layers on the GPU for data generation (-1 all, 0 none; needs a GPU build of llama.cpp)")
    p.add_argument("--no-amp", action="store_true", help="no bf16 mixed precision on CUDA")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--skip-eval", action="store_true", help="skip parity and acceptance evaluation")


def _check_algorithm(args: argparse.Namespace, info) -> None:
    """Options that belong to another algorithm, or shapes llama.cpp cannot run: one clear line each.
    Resolves --draft-layers' default."""
    algo = args.algorithm
    if args.draft_layers is None:
        args.draft_layers = 2 if algo == "simple" else 1
    if algo == "eagle3" and args.draft_layers != 1:
        raise ValueError(f"--algorithm eagle3 has exactly one decoder layer (llama.cpp's eagle3 graph), "
                         f"not --draft-layers {args.draft_layers}")
    if not 1 <= args.ttt_steps <= 16:
        raise ValueError(f"--ttt-steps must be in 1..16, not {args.ttt_steps}")
    if algo != "simple" and (args.copy_layers or args.random_layers):
        raise ValueError("--copy-layers and --random-layers are for --algorithm simple")
    if algo in AUTOREGRESSIVE and args.init_from_target:
        raise ValueError("--init-from-target is for dflash/dspark drafts"
                         + (" (simple drafts start from target layers: --copy-layers)" if algo == "simple" else ""))
    if algo == "simple":
        if args.reduce_vocab is not None:
            raise ValueError("--reduce-vocab: a draft-simple model keeps the target's whole vocabulary "
                             "(--train-vocab N restricts the training loss only)")
        if args.copy_layers and args.random_layers:
            raise ValueError("--copy-layers and --random-layers exclude each other")
        if not args.random_layers and info.architecture != "llama":
            raise ValueError(f"--algorithm simple copies llama layers of the target, not {info.architecture!r} "
                             "ones; use --random-layers")
        if args.copy_layers:
            if len(args.copy_layers) != args.draft_layers:
                raise ValueError(f"--copy-layers gives {len(args.copy_layers)} layers for --draft-layers "
                                 f"{args.draft_layers}")
            bad = [x for x in args.copy_layers if not 0 <= x < info.n_layer]
            if bad:
                raise ValueError(f"--copy-layers {bad} out of range: {info.basename} has layers 0..{info.n_layer - 1}")


def _check_output(path: str) -> None:
    if os.path.isdir(path):
        raise ValueError(f"--output {path} is a directory")
    d = os.path.dirname(os.path.abspath(path))
    probe_dir = d
    while not os.path.exists(probe_dir):
        probe_dir = os.path.dirname(probe_dir)
    if not os.path.isdir(probe_dir) or not os.access(probe_dir, os.W_OK):
        raise ValueError(f"--output {path} is not writable (directory {probe_dir})")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"--output {path} is not writable")


def _positive(name: str, v, minimum: int = 1) -> None:
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {v}")


def run(args: argparse.Namespace) -> int:
    from ..defaults import smollm2_path
    from ..inspect import read_gguf, validate_target
    from ..writer import evenly_spread_layers
    from .prompts import builtin_prompts, chat_wrap, load_prompts

    t_start = time.time()
    model_path = args.model or smollm2_path()
    if not os.path.isfile(model_path):
        raise FileNotFoundError(f"target model not found: {model_path}")
    info = read_gguf(model_path)
    validate_target(info)
    if args.algorithm == "dspark" and not 1 <= args.markov_rank <= 4096:
        raise ValueError(f"--markov-rank must be in 1..4096, not {args.markov_rank}")
    if args.reduce_vocab is not None and not 0 < args.reduce_vocab <= info.n_vocab:
        raise ValueError(f"--reduce-vocab must be in 1..{info.n_vocab}, not {args.reduce_vocab}")
    _check_output(args.output)
    _check_algorithm(args, info)
    if args.hf_output and os.path.isfile(args.hf_output):
        raise ValueError(f"--hf-output {args.hf_output} is a file, not a directory")
    _positive("--block-size", args.block_size, 2)
    if args.block_size > 64:
        raise ValueError(f"--block-size must be <= 64, not {args.block_size}")
    for name in ("n_prompts", "max_new_tokens", "draft_layers", "steps", "batch_size", "anchors_per_seq",
                 "data_tokens", "n_seq"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    _positive("--eval-prompts", args.eval_prompts, 0)
    _positive("--seed-samples", args.seed_samples, 0)
    for name in ("eval_seqs", "train_vocab", "eval_every", "patience", "eval_draft_tokens", "sampled_every"):
        _positive("--" + name.replace("_", "-"), getattr(args, name), 0)
    if args.data == "mix" and args.prompts:
        raise ValueError("--prompts gives the data itself: use it without --data mix (or with --data prompts)")
    if not 0.0 <= args.distill <= 1.0:
        raise ValueError(f"--distill must be between 0 and 1, not {args.distill}")
    _positive("--soft-top-k", args.soft_top_k)
    if args.distill > 0:
        from .torchgen import TORCH_ARCHS

        if info.architecture not in TORCH_ARCHS:
            raise ValueError(f"--distill recomputes the target's distributions in PyTorch, which runs "
                             f"{', '.join(TORCH_ARCHS)} targets, not {info.architecture!r}")
    if args.add_greedy_labels and (args.data == "prompts" or args.prompts):
        raise ValueError("--add-greedy-labels works on --data mix caches, not on --prompts data")
    if args.data_backend == "torch" and (args.data == "prompts" or args.prompts):
        raise ValueError("--data-backend torch makes the mix data only (use it without --prompts / --data prompts)")
    if args.data_backend == "torch":
        from .torchgen import TORCH_ARCHS

        if info.architecture not in TORCH_ARCHS:
            raise ValueError(f"--data-backend torch runs {', '.join(TORCH_ARCHS)} targets, not {info.architecture!r}; "
                             "use --data-backend llama.cpp")
    if args.init_from_draft and args.init_from_target and args.algorithm not in AUTOREGRESSIVE:
        raise ValueError("--init-from-draft and --init-from-target exclude each other")
    if args.init_from_draft and not os.path.isfile(args.init_from_draft):
        raise FileNotFoundError(f"--init-from-draft: draft not found: {args.init_from_draft}")
    if args.train_minutes < 0:
        raise ValueError(f"--train-minutes must be >= 0, not {args.train_minutes}")
    if args.train_vocab and args.train_vocab > info.n_vocab:
        raise ValueError(f"--train-vocab must be <= {info.n_vocab}, not {args.train_vocab}")
    if args.train_vocab and args.reduce_vocab is not None and args.reduce_vocab != args.train_vocab:
        raise ValueError("--reduce-vocab must equal --train-vocab (the draft is trained against that vocabulary)")
    if args.lr <= 0:
        raise ValueError(f"--lr must be > 0, not {args.lr}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, not {args.temperature}")
    layers = args.target_layers or evenly_spread_layers(info.n_layer)
    bad = [x for x in layers if not 0 <= x < info.n_layer]
    if bad:
        raise ValueError(f"--target-layers {bad} out of range: {info.basename} has layers 0..{info.n_layer - 1}")
    if len(set(layers)) != len(layers):
        raise ValueError(f"--target-layers has duplicates: {layers}")
    if args.algorithm == "eagle3" and len(layers) != 3:
        raise ValueError(f"--algorithm eagle3 reads exactly 3 target layers (llama.cpp's eagle3 graph), "
                         f"not {len(layers)}: {layers}")

    all_prompts = load_prompts(args.prompts) if args.prompts else builtin_prompts(10_000, seed=args.seed)
    n_eval = min(args.eval_prompts, max(0, len(all_prompts) - 1))
    eval_prompts = all_prompts[len(all_prompts) - n_eval:] if n_eval else []
    train_prompts = all_prompts[: len(all_prompts) - n_eval][: args.n_prompts]
    if not train_prompts:
        raise ValueError("no training prompts left after holding out --eval-prompts")
    template = info.get("tokenizer.chat_template") or ""
    wrap = lambda p: chat_wrap(template, p)  # noqa: E731

    import torch

    from .device import init_distributed

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dist = init_distributed(args.device)
    try:
        return _run(args, dist, info, model_path, layers, train_prompts, eval_prompts, wrap, t_start)
    finally:
        dist.close()


def _existing_cache(data_dir: str, model_path: str, layers):
    """--reuse-data: the cache in data_dir, checked against this target and these layers."""
    from .data import FeatureCache

    meta_path = os.path.join(data_dir, "meta.json")
    if not os.path.isfile(meta_path):
        raise ValueError(f"--reuse-data: no data in {data_dir} (make it first, e.g. with --data-only)")
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    if meta.get("model") != os.path.basename(model_path) or list(meta.get("target_layers", [])) != list(layers):
        raise ValueError(f"--reuse-data: the data in {data_dir} was made from {meta.get('model')} layers "
                         f"{meta.get('target_layers')}, not {os.path.basename(model_path)} layers {list(layers)}")
    cache = FeatureCache(data_dir)
    if not cache.ids("train"):
        raise ValueError(f"--reuse-data: the data in {data_dir} holds no training sequences")
    return cache


def _run(args, dist, info, model_path, layers, train_prompts, eval_prompts, wrap, t_start) -> int:
    import numpy as np

    from .data import FeatureCache, build_cache
    from .device import resolve_device
    from .export import evaluate_acceptance, export_draft, parity_check
    from .model import load_target_head
    from .trainer import TrainConfig, train

    device = resolve_device(args.device, dist.local_rank)
    workdir = args.workdir or (os.path.abspath(args.output) + ".work")
    os.makedirs(workdir, exist_ok=True)
    progress = not args.no_progress and dist.main
    say = (lambda *a: None) if not progress else (lambda *a: print(*a, file=sys.stderr, flush=True))

    t0 = time.time()
    mix = (args.data or ("prompts" if args.prompts else "mix")) == "mix"
    data_dir = os.path.join(workdir, "mix" if mix else "data")
    if args.reuse_data:
        cache = _existing_cache(data_dir, model_path, layers)
    elif dist.main:  # one process makes the data; the others wait and read it
        if mix:
            from .dataset import MixConfig, build_mixed_cache

            mcfg = MixConfig(answer_tokens=args.data_tokens, n_seq=args.n_seq, eval_seqs=args.eval_seqs, seed=args.seed,
                             sampled_every=args.sampled_every, seed_samples=args.seed_samples)
            cache = build_mixed_cache(data_dir, model_path, mcfg, target_layers=layers, wrap=wrap,
                                      n_threads=args.threads, progress=progress, n_gpu_layers=args.n_gpu_layers,
                                      backend=args.data_backend, device=device)
        else:
            cache = build_cache(data_dir, model_path, train_prompts, target_layers=layers,
                                max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                                n_threads=args.threads, progress=progress, wrap=wrap, n_gpu_layers=args.n_gpu_layers)
    if args.add_greedy_labels and dist.main:
        from .dataset import add_greedy_labels

        st = add_greedy_labels(data_dir, model_path, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers,
                               progress=progress)
        say(f"greedy labels: {st['sequences']} sampled sequences, {st['changed']} of {st['rows']} answer rows "
            "differ from the sampled token")
    soft_stats = None  # the target's distributions computed by this run (--distill)
    if args.distill > 0 and dist.main and cache.soft is None:  # part of the data (also with --data-only)
        from .soft_labels import add_soft_labels

        soft_stats = add_soft_labels(data_dir, model_path, top_k=args.soft_top_k, device=str(device),
                                     progress=progress)
        say(f"soft labels: the target's top {args.soft_top_k} for {soft_stats['rows']} answer rows "
            f"(top-1 = the recorded greedy choice for {soft_stats['agree']:.3f})")
    dist.barrier()
    if args.add_greedy_labels or soft_stats is not None or (not dist.main and (not args.reuse_data or args.distill > 0)):
        cache = FeatureCache(data_dir)  # the data rank 0 made, with the labels it added
        if not mix:
            cache.truncate(len(train_prompts))
    t_data = time.time() - t0
    train_ids = cache.ids("train")
    eval_ids = cache.ids("eval", greedy_only=True)
    n_train_tokens = sum(len(cache.seqs[i].tokens) - cache.seqs[i].prompt_len for i in train_ids)
    say(f"data: {len(cache)} sequences, {cache.n_rows} rows ({n_train_tokens} training answer tokens, "
        f"{len(eval_ids)} held-out sequences) in {t_data:.0f}s")
    if args.data_only:
        if dist.main:
            print(json.dumps({"data": data_dir, "sequences": len(cache), "rows": cache.n_rows,
                              "train_answer_tokens": n_train_tokens, "eval_sequences": len(eval_ids),
                              "data_seconds": round(t_data, 1)}, indent=1))
        return 0

    autoregressive = args.algorithm in AUTOREGRESSIVE
    mask_id = None if autoregressive else _mask_token(info, cache)
    emb, head = load_target_head(model_path)
    from .vocab import choose_vocab, count_tokens, coverage, end_tokens

    counts = count_tokens(info.n_vocab, (cache.seqs[i].tokens[cache.seqs[i].prompt_len:] for i in train_ids))
    vocab = None
    n_vocab_keep = args.train_vocab or args.reduce_vocab
    if n_vocab_keep:
        vocab = choose_vocab(counts, n_vocab_keep, end_tokens(info))
        say(f"reduced vocabulary: {len(vocab)} tokens cover {coverage(counts, vocab):.4f} of the training answer tokens")
    extra: dict = {}
    if autoregressive:
        model, objective, extra = _ar_model(args, info, model_path, layers, emb, head, vocab, say)
    else:
        model = _block_model(args, info, model_path, layers, emb, head, vocab, say)
        objective = None
    cfg = TrainConfig(steps=args.steps, lr=args.lr, batch_size=args.batch_size, anchors_per_seq=args.anchors_per_seq,
                      seed=args.seed, amp=not args.no_amp, eval_every=args.eval_every, patience=args.patience,
                      max_seconds=args.train_minutes * 60.0, distill=args.distill)
    n_read = args.eval_draft_tokens or (args.ttt_steps if args.algorithm == "eagle3" else 4)
    evaluate = None
    if args.eval_every and eval_ids:
        if autoregressive:
            from .objectives import ar_proxy_acceptance

            evaluate = lambda m: ar_proxy_acceptance(m, cache, eval_ids, n_read=n_read, stride=2)  # noqa: E731
        else:
            from .proxy import proxy_acceptance

            evaluate = lambda m: proxy_acceptance(m, cache, eval_ids, mask_id=mask_id, n_read=n_read,  # noqa: E731
                                                  stride=2)
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()  # the PyTorch data backend's KV cache
        if cache.to_device(device):
            say(f"features: {cache.n_rows} rows on {device} ({cache.n_rows * cache.width * 2 / 2**30:.1f} GiB)")
    t0 = time.time()
    summary = train(model, cache, cfg, mask_id=mask_id, train_ids=train_ids,
                    ckpt_path=os.path.join(workdir, f"checkpoint.{args.algorithm}.pt"), progress=progress, device=device, dist=dist,
                    evaluate=evaluate, objective=objective)
    t_train = time.time() - t0
    model.to("cpu")
    if not dist.main:
        return 0
    name = f"{args.algorithm}-{os.path.splitext(info.basename)[0]}"
    if autoregressive:
        from .ar_export import export_ar

        export_ar(model, args.output, target_path=model_path, name=name, weight_type=args.quantize)
    else:
        export_draft(model, args.output, target_path=model_path, mask_token_id=mask_id, name=name, vocab=vocab,
                     weight_type=args.quantize)
    if args.hf_output:
        from .hf_export import export_hf

        export_hf(args.output, args.hf_output)
    report = {"output": args.output, "target": info.basename, "algorithm": args.algorithm,
              "reduced_vocab": None if vocab is None else len(vocab), "weight_type": args.quantize,
              "hf_output": args.hf_output,
              "target_layers": layers, "block_size": None if autoregressive else args.block_size,
              "draft_layers": args.draft_layers, "init_from_draft": args.init_from_draft, "mask_token_id": mask_id,
              "mask_token": None if mask_id is None else info.tokens[mask_id], **extra,
              "data": "mix" if mix else "prompts", "sequences": len(cache), "rows": cache.n_rows, "answer_tokens": cache.n_answer_tokens,
              "train_answer_tokens": n_train_tokens, "eval_sequences": len(eval_ids),
              "data_seconds": round(t_data, 1), "train_seconds": round(t_train, 1), "train": summary}
    if args.distill > 0:
        report["distill"] = {"weight": args.distill, "top_k": int(cache.soft[0].shape[1]) if cache.soft else None,
                             "computed": soft_stats}
    if not args.skip_eval:
        seqs = [(cache.get(i)[0], cache.get(i)[1].astype(np.float32)) for i in range(min(4, len(cache)))]
        if autoregressive:
            from .ar_export import parity_ar

            report["parity"] = parity_ar(model, args.output, model_path, seqs, n_read=n_read, n_threads=args.threads)
        else:
            report["parity"] = parity_check(model, args.output, model_path, seqs, n_threads=args.threads, vocab=vocab)
        say(f"parity: top-1 agreement {report['parity']['agreement']:.4f} over {report['parity']['slots']} slots")
        if mix and eval_ids:
            toks = [[int(t) for t in cache.seqs[i].tokens[:cache.seqs[i].prompt_len]]
                    for i in eval_ids[:max(1, args.eval_prompts)]]
        elif eval_prompts:
            from .._llama import Model

            tok = Model(model_path)
            try:
                toks = [tok.tokenize(wrap(p)) for p in eval_prompts]
            finally:
                tok.close()
        else:
            toks = []
        if toks and autoregressive:
            report["eval"] = _driver_eval(model_path, args.output, toks, max_new_tokens=args.max_new_tokens,
                                          n_max=n_read, n_threads=args.threads)
        elif toks:
            report["eval"] = evaluate_acceptance(model_path, args.output, toks, max_new_tokens=args.max_new_tokens,
                                                 n_max=min(args.eval_draft_tokens or args.block_size, args.block_size - model.first_slot),
                                                 n_threads=args.threads)
        if toks and "tau" in report["eval"]:
            report["eval"]["prompts"] = len(toks)
            say("held-out acceptance per position: " + ", ".join(f"{x:.3f}" for x in report["eval"]["acceptance_per_position"]))
            say(f"tau (tokens per step): {report['eval']['tau']:.3f}, "
                f"accepted drafts per step: {report['eval']['accepted_per_step']:.3f}")
    report["total_seconds"] = round(time.time() - t_start, 1)
    with open(os.path.join(workdir, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
    return 0


def _mask_token(info, cache) -> int:
    """A token the block drafts' mask slots hold: an unused special token, else the last unused id."""
    from .trainer import pick_mask_token

    used = set()
    for sq in cache.seqs:
        used.update(int(t) for t in sq.tokens)
    reserved = {info.get(k) for k in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                      "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id",
                                      "tokenizer.ggml.eot_token_id")}
    mask_id = pick_mask_token(info.tokens, used, {r for r in reserved if isinstance(r, int)})
    if mask_id is None:
        unused = [i for i in range(info.n_vocab - 1, -1, -1) if i not in used]
        if not unused:
            raise ValueError("every token of the vocabulary occurs in the data: no mask token available")
        mask_id = unused[0]
    return mask_id


def _block_model(args, info, model_path, layers, emb, head, vocab, say):
    """The DFlash / DSpark draft of this run, initialised as asked."""
    from ..writer import DraftShape, _pick_heads, _pick_kv_heads
    from .model import DraftModel

    n_head = _pick_heads(info.n_embd)
    heads = dict(n_head=n_head, n_head_kv=_pick_kv_heads(n_head), n_ff=0, rope_theta=10000.0)
    if args.init_from_target:
        from .target_init import target_attention_shape

        heads = target_attention_shape(info)
    shape = DraftShape(n_embd=info.n_embd, n_layer=args.draft_layers, **heads,
                       block_size=args.block_size, target_layers=layers, rms_eps=1e-6,
                       context_length=max(2048, info.n_ctx_train or 0),
                       markov_rank=args.markov_rank if args.algorithm == "dspark" else 0,
                       confidence_head=args.algorithm == "dspark" and not args.no_confidence_head)
    model = DraftModel(shape, emb, head, vocab=vocab if args.train_vocab else None)
    if args.init_from_target:
        from .target_init import init_from_target, last_feature

        src_layer, feature_index = last_feature(layers)
        init_from_target(model, model_path, src_layer, feature_index, seed=args.seed)
        say(f"draft layers start from target layer {src_layer} (feature {feature_index} passed through)")
    if args.init_from_draft:
        from .warm_start import init_from_draft

        ws = init_from_draft(model, args.init_from_draft, model_path)
        say(f"started from {args.init_from_draft}: {ws['tensors']} tensors, "
            f"{ws['markov_rows']} Markov rows matched by token")
    return model


def _ar_model(args, info, model_path, layers, emb, head, vocab, say):
    """(model, objective, report fields) of an EAGLE-3 head or a plain llama draft.

    EAGLE-3: one decoder layer of the target's heads, feed-forward width and rope base; its head is
    the target's (rows of the reduced vocabulary, exported as `output.weight` + `d2t`). Simple:
    the target's width, heads and vocabulary, layers copied from the target unless --random-layers."""
    from .objectives import Eagle3Objective, SimpleObjective
    from .target_init import target_attention_shape

    if args.algorithm == "eagle3":
        from .eagle3 import Eagle3Model, Eagle3Shape

        a = target_attention_shape(info)
        arch = info.architecture
        shape = Eagle3Shape(n_embd=info.n_embd, n_head=a["n_head"], n_head_kv=a["n_head_kv"], n_ff=a["n_ff"],
                            target_layers=layers, rms_eps=float(info.get(f"{arch}.attention.layer_norm_rms_epsilon") or 1e-6),
                            rope_theta=a["rope_theta"], context_length=max(2048, info.n_ctx_train or 0))
        model = Eagle3Model(shape, emb, head, vocab=vocab)
        objective = Eagle3Objective(steps=args.ttt_steps, distill=args.distill, chains=args.anchors_per_seq)
        extra = {"ttt_steps": args.ttt_steps}
    else:
        from .simple import SimpleDraft, init_from_target, simple_shape_from_target, spread_layers

        model = SimpleDraft(simple_shape_from_target(info, args.draft_layers), emb, head,
                            vocab=vocab if args.train_vocab else None)
        copied = None
        if not args.random_layers:
            copied = list(args.copy_layers or spread_layers(info.n_layer, args.draft_layers))
            init_from_target(model, model_path, copied)
            say(f"draft layers start from target layers {copied}")
        objective = SimpleObjective(distill=args.distill)
        extra = {"copied_layers": copied}
    if args.init_from_draft:
        from .ar_export import load_ar_weights

        n = load_ar_weights(model, args.init_from_draft)
        say(f"started from {args.init_from_draft}: {n} tensors")
    return model, objective, extra


def _driver_eval(model_path: str, draft_path: str, prompts: list, *, max_new_tokens: int, n_max: int,
                 n_threads) -> dict:
    """Held-out acceptance of an EAGLE-3 / simple draft through llama.cpp's C++ driver (the engine's
    proposers for them are not part of training); skipped, with the reason, when it is not built."""
    from .ar_eval import driver_acceptance, find_driver, special_text

    if find_driver() is None:
        return {"skipped": "llama-speculative-simple is not built (bench/build_cpp_reference.sh, or set "
                           "LLAMA_SPECULATIVE_SIMPLE)"}
    texts = [special_text(model_path, t) for t in prompts]
    return driver_acceptance(model_path, draft_path, texts, n_predict=max_new_tokens, n_max=n_max, threads=n_threads)
