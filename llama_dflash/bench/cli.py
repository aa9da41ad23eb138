"""Compare ordinary and speculative (DFlash/DSpark) decoding on one target/draft pair.

Without --model/--draft-model it runs the embedded default pair (SmolLM2-135M-Instruct and its
draft).  --spec-type picks llama.cpp's speculative types (n-gram drafters, the draft model) or
ours (lookup, auto); types that need no draft model load none.  Prints the [ordinary],
[<algorithm>] and [comparison] blocks; --json writes the same facts to a file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from ..config import ALGORITHMS, DRAFT_SPEC_TYPES, SpecConfig, TargetConfig
from ..draft_models import validate_draft_files
from ..inspect import check_target_file, get_int, get_str, read_gguf
from ..sampling import SamplingParams
from .format import format_result
from .runner import BenchConfig, run_benchmark
from .workloads import WORKLOAD_HELP, WORKLOADS, load_prompt_file, workload_prompts

if TYPE_CHECKING:  # annotations only
    from .runner import RunResult
    from .sweep import SweepConfig

__all__ = ["configure", "run", "DEFAULT_PROMPT", "chat_wrap", "plain_transcript", "draft_tokens_arg",
           "spec_type_arg", "spec_type_names", "add_spec_type_args", "spec_options", "needs_draft_model",
           "resolve_models", "cpp_reference_types", "NO_CPP_TYPES"]

DEFAULT_PROMPT = (
    "Write a Python function that checks whether a number is prime, then explain step by step "
    "how it works and list three test cases."
)

#: our speculative types that llama.cpp's C++ driver does not have
NO_CPP_TYPES = {"lookup": "our suffix lookup over prompt and output",
                "auto": "our per-step choice among the lookup, the draft model and no draft"}
_NGRAM_SIZE_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v")
_NGRAM_FLAGS = ("ngram_size_n", "ngram_size_m", "ngram_min_hits")
#: a stand-in draft path, only to let SpecConfig check the names of types that need a draft model
_ANY_DRAFT = "draft.gguf"


def configure(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("models")
    m.add_argument("--model", help="target GGUF (default: the embedded SmolLM2-135M-Instruct)")
    m.add_argument("--draft-model", help="draft GGUF: DFlash/DSpark, an EAGLE-3 head, or a classic draft model with "
                                         "--spec-type draft-simple (default: the draft for the default model; "
                                         "none is loaded when --spec-type needs none)")
    m.add_argument("--algorithm", choices=ALGORITHMS, default="auto")
    d = p.add_argument_group("drafting")
    add_spec_type_args(d)
    d.add_argument("--draft-tokens", type=draft_tokens_arg, default="auto",
                   help="draft_n_max (clamped to the draft's block), or 'auto' (the default): the adaptive "
                        "controller picks the length every step from measured costs and acceptance")
    d.add_argument("--draft-n-min", type=int, default=0)
    d.add_argument("--draft-p-min", type=float, default=0.0)
    d.add_argument("--backend-sampling", choices=("auto", "on", "off"), default="auto",
                   help="pick the draft's candidates with a top-k sampler in its graph: on, off, or auto "
                        "(the default: only where the draft runs on a GPU)")
    d.add_argument("--no-backend-sampling", dest="backend_sampling", action="store_const", const="off",
                   help="the same as --backend-sampling off")
    d.add_argument("--rollback", choices=("auto", "native", "checkpoint"), default="auto",
                   help="recurrent/hybrid targets: recurrent-snapshot rollback (n_rs_seq) or "
                        "checkpoint/restore/replay; auto picks native where the architecture has it")
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
    c.add_argument("--n-ctx", type=int, default=2048,
                   help="context size (default 2048); raised, with a note, to hold the longest prompt + the largest "
                        "--max-tokens + a draft block, so that every run reaches its token count")
    c.add_argument("--n-batch", type=int, default=512)
    c.add_argument("--n-ubatch", type=int, default=512)
    c.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                   help="flash attention in the target context (default: llama.cpp's own, auto)")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--n-gpu-layers", type=int, default=None,
                   help="target layers to offload to the GPU (default: all, -1, where the build has a GPU "
                        "backend); a warning says when the build has none")
    w = p.add_argument_group("sweeps and workloads")
    w.add_argument("--sweep-draft-tokens", type=_draft_list, metavar="K,K,...",
                   help="compare these draft lengths (e.g. 1,2,3,4,5,6,7,8,auto)")
    w.add_argument("--sweep-max-tokens", type=_int_list, metavar="N,N,...",
                   help="compare these generation lengths (e.g. 512,1024,2048)")
    w.add_argument("--workload", type=_workload_list, metavar="NAME[,NAME...]",
                   help="built-in prompt set(s) instead of --prompt, a comma list: "
                        + "; ".join(f"{k}: {v}" for k, v in WORKLOAD_HELP.items()) + "; all: every one")
    w.add_argument("--prompt-file", metavar="PATH", action="append",
                   help="prompts: one per line, or JSONL with \"prompt\"; repeat it for several workloads "
                        "(each file is one, named after it; with --workload too)")
    w.add_argument("--compare-speculators", action="store_true",
                   help="measure every speculator that applies to the target (its MTP head, each --draft-model "
                        "-- a comma list here --, lookup, the n-gram types, auto) on the same prompts, side by side, "
                        "and name the winner with the cost model's verdict for each")
    w.add_argument("--cpp-reference", metavar="BINARY",
                   help="also run llama.cpp's llama-speculative-simple on the same prompt tokens, n_predict, "
                        "speculative types, draft length, n-gram sizes, threads and --ignore-eos, and compare "
                        "accepted counts (not with lookup or auto: llama.cpp has no such type)")
    w.add_argument("--oracle", action="store_true",
                   help="also run the oracle: the ordinary run's tokens as proposals, with the real draft decode "
                        "still running: the measured speedup ceiling of this pair (greedy: 100%% accepted); "
                        "needs a draft model")
    w.add_argument("--no-cost-probe", dest="cost_probe", action="store_false",
                   help="do not time verify/draft for every draft length (the cost model then uses the "
                        "measured runs only; without a draft model there is no probe)")
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="PATH", help="write the results as JSON")
    o.add_argument("--report", metavar="PATH.md", help="write the community feedback template, filled in")
    o.add_argument("--plot", metavar="PATH.png", help="plot throughput/acceptance vs draft length (sweeps)")
    o.add_argument("--quiet", action="store_true", help="no progress messages on stderr")
    o.add_argument("--verbose", action="store_true", help="show llama.cpp's log")


# ---- speculative types: shared by bench, generate and serve ------------------------------------

#: `generate` and `serve` (one sequence at a time) without --spec-type, where a draft model is
#: loaded: per step the lookup, the draft's block or no draft (bench/speculators.py, held-out
#: prompts: 1.16x ordinary on copy-heavy tasks, 1.00x on prose, where the draft alone gives
#: 0.94x / 1.01x).  `bench` keeps the draft model alone: it measures the draft.
DEFAULT_SPEC_TYPE = "auto,draft"

def add_spec_type_args(group: Any) -> None:
    """--spec-type and the n-gram sizes (an argparse parser or argument group)."""
    group.add_argument("--spec-type", type=spec_type_arg, default=None, metavar="NAMES",
                       help="speculative types, comma-separated: llama.cpp's ngram-simple, ngram-map-k, "
                            "ngram-map-k4v, ngram-mod, ngram-cache, draft-simple (a classic draft model), "
                            "draft-eagle3, draft-mtp, draft-dflash, draft-dspark, and ours: lookup "
                            "(suffix lookup over prompt and output), auto (per step: the lookup, the draft "
                            "model's block or no draft; alone or with one draft type), none.  Chained in "
                            "llama.cpp's priority order.  Default: auto over the draft model in generate and "
                            "serve --parallel 1, the draft model alone in bench and serve --parallel N")
    group.add_argument("--ngram-size-n", type=int, default=None, metavar="N",
                       help="ngram-simple/-map-k/-map-k4v: length of the n-gram looked up (llama.cpp's default)")
    group.add_argument("--ngram-size-m", type=int, default=None, metavar="M",
                       help="ngram-simple/-map-k/-map-k4v: length of the drafted m-gram (llama.cpp's default)")
    group.add_argument("--ngram-min-hits", type=int, default=None, metavar="H",
                       help="ngram-map-k/-map-k4v: hits an n-gram needs before it drafts (llama.cpp's default)")


def _names(text: str) -> list[str]:
    return [part.strip().lower().replace("_", "-") for part in text.split(",")]


def spec_type_names(text: str) -> tuple[str, ...]:
    """The canonical names (`SpecConfig.spec_types`) of a --spec-type value, checked by SpecConfig;
    a draft type among them is named as such ("draft" for the draft model of any algorithm)."""
    draft = _ANY_DRAFT if any(n in DRAFT_SPEC_TYPES for n in _names(text)) else None
    return SpecConfig(draft, spec_type=text).spec_types


def spec_type_arg(text: str) -> str:
    """argparse type of --spec-type: the names and their combination checked by SpecConfig."""
    try:
        spec_type_names(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def needs_draft_model(args: argparse.Namespace) -> bool:
    """Whether the selected types draft with a draft model (always without --spec-type)."""
    spec_type = getattr(args, "spec_type", None)
    return spec_type is None or any(n in DRAFT_SPEC_TYPES for n in spec_type_names(spec_type))


def spec_options(args: argparse.Namespace) -> dict[str, Any]:
    """SpecConfig keywords of --spec-type and the n-gram sizes: only those given (so that without
    them the configuration is exactly what it was before these flags)."""
    kw: dict[str, Any] = {}
    if getattr(args, "spec_type", None) is not None:
        kw["spec_type"] = args.spec_type
    for name in _NGRAM_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            kw[name] = value
    return kw


def resolve_models(args: argparse.Namespace) -> tuple[str, Optional[str]]:
    """(target, draft) paths: the default pair without --model; no draft when the speculative
    types need none (a --draft-model given anyway is kept, for `auto` or for SpecConfig to refuse)."""
    from ..defaults import default_draft_path, smollm2_path

    if not needs_draft_model(args):
        return args.model or smollm2_path(), args.draft_model
    model = args.model or smollm2_path()
    draft = args.draft_model
    if draft is None:
        if args.model is not None and os.path.basename(args.model) != os.path.basename(smollm2_path()):
            raise ValueError("--draft-model is required with a --model other than the default"
                             + (f" (--spec-type {args.spec_type} drafts with a draft model)" if args.spec_type else ""))
        draft = default_draft_path(model)
    return model, draft


_resolve_models = resolve_models  # the earlier name


def cpp_reference_types(spec: SpecConfig) -> tuple[Optional[list[str]], list[str]]:
    """llama-speculative-simple's --spec-type list for `spec` (None without --spec-type: the
    draft's own type, as before) and the flags of the n-gram sizes.  Our lookup and auto have no
    C++ equivalent: a ValueError says so."""
    from ..proposers.ngram import cpp_ngram_args
    from .cpp_reference import CPP_SPEC_TYPES, cpp_spec_type

    missing = [t for t in spec.spec_types if t in NO_CPP_TYPES]
    if missing:
        t = missing[0]
        raise ValueError(f"--cpp-reference: llama.cpp has no speculative type {t!r} ({NO_CPP_TYPES[t]}); "
                         f"its types are {', '.join(CPP_SPEC_TYPES)}")
    extra: list[str] = []
    for t in spec.spec_types:
        if t in _NGRAM_SIZE_TYPES:
            extra += cpp_ngram_args(t, size_n=spec.ngram_size_n, size_m=spec.ngram_size_m,
                                    min_hits=spec.ngram_min_hits)
    if spec.spec_type is None:
        return None, extra
    types = [cpp_spec_type(spec.draft_model) if t not in CPP_SPEC_TYPES and t in DRAFT_SPEC_TYPES else t
             for t in spec.spec_types]
    return types, extra


def draft_tokens_arg(text: str) -> "int | str":
    """argparse type of a draft length: an integer or 'auto' (shared with `serve`)."""
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', not {text!r}") from None


def _draft_list(text: str) -> list:
    values = [draft_tokens_arg(x.strip()) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected at least one draft length")
    return values


def _workload_list(text: str) -> list[str]:
    """--workload: built-in workload names, a comma list; "all" stands for every one."""
    names: list[str] = []
    for name in (x.strip() for x in text.split(",") if x.strip()):
        if name != "all" and name not in WORKLOADS:
            raise argparse.ArgumentTypeError(f"invalid choice: {name!r} (choose from {', '.join((*WORKLOADS, 'all'))})")
        names += [n for n in (WORKLOADS if name == "all" else [name]) if n not in names]
    if not names:
        raise argparse.ArgumentTypeError("expected at least one workload")
    return names


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, not {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


# ---- chat formatting -----------------------------------------------------------------------------

ChatPrompt = Union[str, Sequence[str], Sequence[dict]]


def _messages(prompt: ChatPrompt) -> list[dict[str, str]]:
    from .copy_workloads import messages

    if isinstance(prompt, str):
        return messages(prompt)
    items = list(prompt)
    if items and all(isinstance(m, dict) for m in items):
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in items]
    if not items or not all(isinstance(t, str) for t in items):
        raise ValueError(f"a prompt is a string, a tuple of turns or a list of chat messages, not {prompt!r}")
    return messages(tuple(items))


def plain_transcript(msgs: Sequence[dict]) -> str:
    """Chat messages as plain text, for models without a usable template (and --raw-prompt)."""
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in msgs]
    return "\n\n".join(lines) + "\n\nAssistant:"


def chat_wrap(model_path: str, prompt: ChatPrompt) -> str:
    """A prompt as the text the model reads: a user prompt (a string), or a multi-turn chat (a
    tuple of turns alternating user/assistant, or a list of {"role", "content"} messages).

    ChatML templates (SmolLM2, Qwen) are written directly; a single user prompt for any other
    model stays as it is.  A multi-turn chat for another model is rendered with the model's own
    Jinja template, or as a plain transcript where it has none (or it fails)."""
    template = get_str(read_gguf(model_path), "tokenizer.chat_template", "")
    if isinstance(prompt, str) and "<|im_start|>" not in template:
        return prompt
    msgs = _messages(prompt)
    if "<|im_start|>" in template:
        return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs) + \
            "<|im_start|>assistant\n"
    if len(msgs) == 1 and msgs[0]["role"] == "user":
        return msgs[0]["content"]
    return _render_template(model_path, template, msgs) if template else plain_transcript(msgs)


def _render_template(model_path: str, template: str, msgs: list[dict[str, str]]) -> str:
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        info = read_gguf(model_path)
        eos = ""
        eos_id = get_int(info, "tokenizer.ggml.eos_token_id", -1, lo=-1)
        if 0 <= eos_id < len(info.token_bytes):
            eos = info.token_bytes[eos_id].decode("utf-8", "replace")

        def raise_exception(message: str) -> None:
            raise ValueError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        # bos_token "": llama.cpp's tokenizer adds BOS itself
        return env.from_string(template).render(messages=msgs, add_generation_prompt=True, bos_token="",
                                                eos_token=eos)
    except Exception:  # noqa: BLE001 - a template we cannot render: the plain transcript
        return plain_transcript(msgs)


def _wrap(args: argparse.Namespace, model: str, prompt: ChatPrompt) -> str:
    if args.raw_prompt:
        return prompt if isinstance(prompt, str) else plain_transcript(_messages(prompt))
    return chat_wrap(model, prompt)


# ---- configuration ---------------------------------------------------------------------------------
def _check_output_path(path: str, flag: str = "--json") -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{flag} {path}: directory {parent} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path}: is a directory")


def _is_sweep(args: argparse.Namespace) -> bool:
    return bool(args.sweep_draft_tokens or args.sweep_max_tokens or args.workload or args.prompt_file)


def spec_config(args: argparse.Namespace, draft: Optional[str]) -> SpecConfig:
    """The SpecConfig of bench/generate's drafting flags."""
    return SpecConfig(draft, algorithm=args.algorithm, draft_n_max=args.draft_tokens,
                      draft_n_min=args.draft_n_min, draft_p_min=args.draft_p_min,
                      backend_sampling={"on": True, "off": False}.get(args.backend_sampling, "auto"),
                      rollback=args.rollback, **spec_options(args))


def target_config(args: argparse.Namespace, model: str) -> TargetConfig:
    ngl = -1 if args.n_gpu_layers is None else args.n_gpu_layers
    return TargetConfig(model, n_ctx=args.n_ctx, n_batch=args.n_batch, n_ubatch=args.n_ubatch,
                        n_threads=args.threads, n_gpu_layers=ngl, verbose=args.verbose,
                        flash_attn=args.flash_attn)


def _configs(args: argparse.Namespace) -> tuple[TargetConfig, SpecConfig]:
    model, draft = resolve_models(args)
    if args.spec_type is None:
        validate_draft_files(model, draft, args.algorithm)  # before llama.cpp loads either file
        spec = spec_config(args, draft)
    else:
        spec = spec_config(args, draft)  # e.g. a --draft-model that no selected type uses: refused first
        if spec.draft_model is not None:
            validate_draft_files(model, spec.draft_model, spec.algorithm)
        else:
            check_target_file(model)  # n-gram types and lookup: any architecture
    return target_config(args, model), spec


def build_config(args: argparse.Namespace) -> BenchConfig:
    target, spec = _configs(args)
    prompt = _wrap(args, target.model, args.prompt)
    return BenchConfig(target, spec, prompt, max_tokens=args.max_tokens, warmup_tokens=args.warmup_tokens,
                       runs=args.runs, ignore_eos=args.ignore_eos,
                       sampling=SamplingParams(temperature=args.temperature, seed=args.seed),
                       oracle=args.oracle, probe=args.cost_probe)


def selected_workloads(args: argparse.Namespace) -> dict[str, list[ChatPrompt]]:
    """The prompts of --workload (each named set) and --prompt-file (each file, named after it), in the
    order given; "prompt": [--prompt] without either."""
    workloads: dict[str, list[ChatPrompt]] = {name: workload_prompts(name) for name in args.workload or ()}
    for path in args.prompt_file or ():
        label = os.path.basename(path)
        if label in workloads:
            raise ValueError(f"--prompt-file {path}: a workload named {label!r} was already given")
        workloads[label] = load_prompt_file(path)
    return workloads or {"prompt": [args.prompt]}


def build_sweep_config(args: argparse.Namespace) -> "SweepConfig":
    from .sweep import SweepConfig

    target, spec = _configs(args)
    workloads = {k: [_wrap(args, target.model, p) for p in v] for k, v in selected_workloads(args).items()}
    # without --spec-type the sweep measures the draft alone; beside its lengths it measures what a
    # user gets by default from generate and serve: `--spec-type auto` over the same draft
    default_spec = None
    if args.spec_type is None and spec.draft_model is not None:
        default_spec = dataclasses.replace(spec, spec_type=DEFAULT_SPEC_TYPE, draft_n_max="auto")
    return SweepConfig(target, spec, workloads,
                       draft_tokens=args.sweep_draft_tokens or [args.draft_tokens],
                       max_tokens=args.sweep_max_tokens or [args.max_tokens],
                       runs=args.runs, warmup_tokens=args.warmup_tokens, ignore_eos=args.ignore_eos,
                       sampling=SamplingParams(temperature=args.temperature, seed=args.seed),
                       oracle=args.oracle, probe=args.cost_probe, default_spec=default_spec)


def _progress_bar(args: argparse.Namespace, total: int):
    """A tqdm bar on stderr for interactive runs; None with --quiet or when stderr is not a terminal."""
    if args.quiet or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, file=sys.stderr, unit="gen", leave=False, dynamic_ncols=True)


def _check_spec_type(args: argparse.Namespace) -> None:
    """--spec-type choices that bench cannot run, said before any model is loaded."""
    if args.spec_type is None:
        return
    types = spec_type_names(args.spec_type)
    if not types:
        raise ValueError("--spec-type none drafts nothing: bench compares a speculative type with ordinary "
                         "decoding (name one, e.g. ngram-simple, lookup or draft-dflash)")
    if args.cpp_reference:
        from .cpp_reference import CPP_SPEC_TYPES

        missing = [t for t in types if t in NO_CPP_TYPES]
        if missing:
            t = missing[0]
            raise ValueError(f"--cpp-reference: llama.cpp has no speculative type {t!r} ({NO_CPP_TYPES[t]}); "
                             f"run --spec-type with its types ({', '.join(CPP_SPEC_TYPES)}) to compare")


def _validate_outputs(args: argparse.Namespace) -> None:
    for flag in ("json", "report", "plot"):
        path = getattr(args, flag)
        if path:
            _check_output_path(path, f"--{flag}")
    if args.cpp_reference and not (os.path.isfile(args.cpp_reference) and os.access(args.cpp_reference, os.X_OK)):
        raise ValueError(f"--cpp-reference {args.cpp_reference}: not an executable file")
    _check_spec_type(args)
    if args.plot and not _is_sweep(args):
        raise ValueError("--plot draws a sweep: add --sweep-draft-tokens (e.g. 1,2,4,8)")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ValueError("--plot needs matplotlib: pip install 'llama-dflash[plot]'") from None


def _cpp_block(args: argparse.Namespace, target: TargetConfig, spec: SpecConfig, prompt: str,
               max_tokens: int, draft_n_max: int, ours: "RunResult", ignore_eos: bool,
               not_comparable: Optional[str] = None) -> tuple[str, dict]:
    """Run llama-speculative-simple on the same prompt text, n_predict, speculative types, draft
    length, n-gram sizes, threads and ignore-eos, and set its numbers beside one of our runs
    (`ours`: same prompt and draft length, unless `not_comparable` says why not)."""
    from .._llama import cpu_has_amx
    from ..target import default_threads
    from .cpp_reference import run_cpp_reference

    threads = target.n_threads or default_threads()
    types, extra = cpp_reference_types(spec)
    cpp = run_cpp_reference(args.cpp_reference, target.model, spec.draft_model, prompt, n_predict=max_tokens,
                            draft_n_max=draft_n_max, draft_p_min=spec.draft_p_min, n_ctx=target.n_ctx,
                            n_batch=target.n_batch, n_ubatch=target.n_ubatch, threads=threads,
                            repack=not cpu_has_amx() if target.repack is None else target.repack,
                            ignore_eos=ignore_eos, spec_types=types, extra_args=extra)
    our_tps = ours.decode_tokens_per_second
    ratio = our_tps / cpp.tokens_per_second if cpp.tokens_per_second else 0.0
    budget = cpp.within_budget(max_tokens) if cpp.steps else None
    cpp_accept, cpp_drafted = (budget.accepted, budget.drafted) if budget else (cpp.n_accept, cpp.n_drafted)
    identical = None if not_comparable else (ours.accepted == cpp_accept and ours.drafted == cpp_drafted)
    verdict = f"not compared ({not_comparable})" if not_comparable else ("yes" if identical else "NO")
    kinds = f"spec types {','.join(types)}{' ' + ' '.join(extra) if extra else ''}, " if types else ""
    lines = [
        f"[comparison: ours vs llama.cpp's C++ driver (llama-speculative-simple), {kinds}draft tokens {draft_n_max}, "
        f"{threads} threads, ignore-eos {ignore_eos}]",
        f"  {'':20}{'ours':>14}{'C++':>14}",
        f"  {'decoded tokens':20}{ours.tokens:>14}{cpp.decoded_tokens:>14}",
        f"  {'token/s (decode)':20}{our_tps:>14.2f}{cpp.tokens_per_second:>14.2f}",
        f"  {'draft accepted':20}{ours.accepted!s:>14}{cpp_accept:>14}",
        f"  {'draft proposed':20}{ours.drafted!s:>14}{cpp_drafted:>14}",
    ]
    if budget and budget.excluded_steps:
        lines.append(f"  (C++ within the {max_tokens}-token budget; its driver also ran {budget.excluded_steps} step(s) "
                     f"at the end, drafting {budget.excluded_drafted} more: it decodes past n_predict and reads a draft "
                     f"cap of 0 as no cap; totals {cpp.n_accept} accepted / {cpp.n_drafted} proposed)")
    elif not budget:
        lines.append("  (no per-step log from the C++ driver: its totals are compared as they are)")
    lines += [f"  accepted identical  : {verdict}",
              f"  ours / C++          : {ratio:.3f}x (decode rates, prompt processing excluded on both sides)"]
    data = {**cpp.__dict__, "acceptance_rate": cpp.acceptance_rate, "ours_over_cpp": ratio,
            "ours": {"decoded_tokens": ours.tokens, "tokens_per_second": our_tps, "n_accept": ours.accepted,
                     "n_drafted": ours.drafted},
            "within_budget": None if budget is None else {**budget.__dict__, "n_predict": max_tokens},
            "threads": threads, "ignore_eos": ignore_eos, "accepted_identical": identical}
    if types:
        data.update(spec_types=types, extra_args=extra)
    data.pop("steps")
    return "\n".join(lines), data


def _warn_offload(args: argparse.Namespace) -> Optional[str]:
    """An explicit --n-gpu-layers on a build that cannot offload: said on stderr, kept for the report."""
    from .backend import backend_info, offload_warning

    if args.n_gpu_layers is None:
        return None
    msg = offload_warning(args.n_gpu_layers, backend_info())
    if msg:
        print(f"warning: {msg}", file=sys.stderr)
    return msg


def run(args: argparse.Namespace) -> int:
    _validate_outputs(args)
    args.offload_warning = _warn_offload(args)
    if args.compare_speculators:
        return _run_compare(args)
    return _run_sweep(args) if _is_sweep(args) else _run_single(args)


def _run_compare(args: argparse.Namespace) -> int:
    """--compare-speculators: every speculator that applies, side by side (bench/compare.py)."""
    from ..defaults import default_draft_path, smollm2_path
    from .compare import applicable_speculators, compare_speculators, format_comparison

    if args.spec_type is not None or args.sweep_draft_tokens or args.sweep_max_tokens or args.cpp_reference \
            or args.oracle:
        raise ValueError("--compare-speculators picks the speculators itself: leave out --spec-type, the sweeps, "
                         "--cpp-reference and --oracle")
    model = args.model or smollm2_path()
    drafts = [d for d in (args.draft_model or "").split(",") if d]
    if not drafts and args.model is None:
        drafts = [default_draft_path(model)]
    candidates, skipped = applicable_speculators(model, drafts, draft_tokens=args.draft_tokens)
    target = target_config(args, model)
    workloads = selected_workloads(args)
    pairs = [(name, p) for name, ps in workloads.items() for p in ps]
    # several workloads: a tau / speedup column each
    labels = [n for n, _ in pairs] if len(workloads) > 1 else None
    prompts = [_wrap(args, model, p) for _, p in pairs]
    bar = _progress_bar(args, len(prompts) * args.runs)
    try:
        result = compare_speculators(target, candidates, prompts, max_tokens=args.max_tokens, runs=args.runs,
                                     ignore_eos=args.ignore_eos, warmup_tokens=args.warmup_tokens,
                                     sampling=SamplingParams(temperature=args.temperature, seed=args.seed),
                                     not_applicable=skipped, labels=labels,
                                     progress=(lambda _msg: bar.update(1)) if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    print(format_comparison(result))
    if args.json:
        _write(args.json, json.dumps(result.to_dict(), indent=2))
    return 0


def _speculator_field(speculators: dict) -> dict[str, str]:
    """The report's per-speculator line (only where the engine ran several or token drafters)."""
    from .format import speculator_rows

    rows = speculator_rows(speculators)
    if not rows:
        return {}
    return {"Per-speculator counts": "; ".join(
        f"{r['name']}: " + (f"{r['drafts']} steps without a draft" if r["name"] == "none" else
                            f"{r['drafts']} drafts, {r['drafted']} drafted, {r['accepted']} accepted "
                            f"({100 * r['acceptance_rate']:.1f}%), tau {r['tokens_per_step']:.2f}")
        for r in rows)}


def _run_single(args: argparse.Namespace) -> int:
    from .report import feedback_fields, model_fields, render_report

    cfg = build_config(args)
    bar = _progress_bar(args, (3 if cfg.oracle else 2) * cfg.runs + (2 if cfg.warmup_tokens else 0) + int(cfg.probe))
    try:
        result = run_benchmark(cfg, (lambda _msg: bar.update(1)) if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    if args.offload_warning:
        result.warnings.insert(0, args.offload_warning)
    summary = format_result(result)
    data = result.to_dict()
    if args.cpp_reference:
        k = result.oracle_draft_tokens or result.draft_n_max
        text, data["cpp_reference"] = _cpp_block(
            args, cfg.target, cfg.spec, cfg.prompt, cfg.max_tokens, k, result.speculative.runs[0], cfg.ignore_eos,
            "ours drafted an adaptive length; pass --draft-tokens K" if result.is_adaptive else None)
        summary += "\n\n" + text
    print(summary)
    if args.json:
        _write(args.json, json.dumps(data, indent=2))
    if args.report:
        s = result.speculative
        fields = feedback_fields(
            model=cfg.target.model, draft_model=cfg.spec.draft_model, algorithm=result.algorithm,
            n_ctx=cfg.target.n_ctx, n_batch=cfg.target.n_batch, n_ubatch=cfg.target.n_ubatch,
            draft_n_max=result.draft_n_max, draft_p_min=cfg.spec.draft_p_min,
            backend_sampling=cfg.spec.backend_sampling, ignore_eos=cfg.ignore_eos,
            workload=f"single prompt: {args.prompt!r}", generated_tokens=sum(r.tokens for r in s.runs),
            ordinary_tps=result.ordinary.aggregate_tokens_per_second,
            speculative_tps=s.aggregate_tokens_per_second, stats=s.stats,
            deterministic=result.runs_deterministic, first_divergence=result.first_divergence,
            warnings=result.notes + result.warnings,
            extras={**model_fields(s.stats, result.cost_model(), result.decode_speedups()[0], result.phase_table(),
                                   (result.oracle_draft_tokens, result.oracle_speedup) if result.oracle else None),
                    **_speculator_field(s.speculators)},
        )
        _write(args.report, render_report([("Run", fields)], summary))
    return 0


def _run_sweep(args: argparse.Namespace) -> int:
    from .report import feedback_fields, model_fields, render_report
    from .sweep import format_sweep, run_sweep, setting_label, sweep_steps

    cfg = build_sweep_config(args)
    bar = _progress_bar(args, sweep_steps(cfg))
    try:
        result = run_sweep(cfg, bar)
    finally:
        if bar is not None:
            bar.close()
    if args.offload_warning:
        result.warnings.insert(0, args.offload_warning)
    summary = format_sweep(result)
    data = result.to_dict()
    first = result.cells[0]
    best = first.best_draft_tokens or max(first.speculative,
                                          key=lambda k: first.speculative[k].aggregate_tokens_per_second)
    if args.cpp_reference:
        fixed = best if isinstance(best, int) else max((k for k in first.speculative if isinstance(k, int)), default=7)
        prompts = next(iter(cfg.workloads.values()))
        why = (f"ours ran {len(prompts)} prompts, C++ the first" if len(prompts) > 1
               else None if fixed in first.speculative else "ours drafted an adaptive length only")
        ours = first.speculative[fixed if fixed in first.speculative else best].runs[0]
        text, data["cpp_reference"] = _cpp_block(args, cfg.target, cfg.spec, prompts[0], first.max_tokens, fixed,
                                                 ours, cfg.ignore_eos, why)
        summary += "\n\n" + text
    print(summary)
    if args.json:
        _write(args.json, json.dumps(data, indent=2))
    if args.plot:
        from .plot import plot_sweep

        plot_sweep(result, args.plot)
    if args.report:
        sections = []
        for cell in result.cells:
            k = cell.best_draft_tokens or max(cell.speculative,
                                              key=lambda k: cell.speculative[k].aggregate_tokens_per_second)
            m = cell.speculative[k]
            from .runner import first_divergence

            verdict = "best draft length" if cell.best_draft_tokens else "fastest draft length (ordinary was faster)"
            sections.append((f"Workload {cell.workload}, {cell.max_tokens} tokens, {verdict} {setting_label(k)}",
                             feedback_fields(
                model=cfg.target.model, draft_model=cfg.spec.draft_model, algorithm=result.algorithm,
                n_ctx=cfg.target.n_ctx, n_batch=cfg.target.n_batch, n_ubatch=cfg.target.n_ubatch,
                draft_n_max=k, draft_p_min=cfg.spec.draft_p_min, backend_sampling=cfg.spec.backend_sampling,
                ignore_eos=cfg.ignore_eos,
                workload=f"{cell.workload} ({len(cfg.workloads[cell.workload])} prompts)",
                generated_tokens=sum(r.tokens for r in m.runs),
                ordinary_tps=cell.ordinary.aggregate_tokens_per_second,
                speculative_tps=m.aggregate_tokens_per_second, stats=m.stats,
                deterministic=cell.ordinary.deterministic and m.deterministic,
                first_divergence=first_divergence(cell.ordinary.runs[0].output_tokens, m.runs[0].output_tokens),
                warnings=result.notes + result.warnings,
                extras={**model_fields(m.stats, cell.cost_model(), cell.decode_speedups()[0], cell.phase_table(),
                                       cell.oracle_ceiling),
                        **_speculator_field(m.speculators)},
            )))
        _write(args.report, render_report(sections, summary))
    return 0


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
