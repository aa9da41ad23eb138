"""`Llama`: `llama_cpp.Llama` with DFlash/DSpark speculative decoding, a true drop-in.

    from llama_dflash import Llama, SpecConfig
    llm = Llama("target.gguf", speculative=SpecConfig("draft.gguf"), n_ctx=2048)
    llm.create_completion("Once upon a time", max_tokens=64, temperature=0)

Why it is a drop-in: the model, the context, the sampler chain, `generate`, completions, chat,
logprobs, grammars, stopping criteria, `save_state`, pickling -- all of it is llama-cpp-python's
own code running on llama-cpp-python's own model and context, built from the same constructor
arguments.  Its `generate` already knows how to verify drafts: after each sampled token it asks
`self.draft_model` for tokens, evaluates ``[token, *drafts]`` in one batch, samples the rows one by
one with the same sampler chain and cuts the cache at the first disagreement, so the chain's state
(random stream, penalty window, grammar, mirostat) advances exactly once per emitted token: the
same call gives the same tokens, with or without a draft, at any temperature.  This class adds
only what that loop cannot do by itself:

* a `Speculator` (DFlash/DSpark draft context attached to the target through `ctx_other`) as
  `draft_model`;
* an `eval` that decodes through our batch, asks for logits only on the rows that are sampled
  (every row of a verification batch, the last of a prompt, all with ``logits_all=True``),
  captures the target's layer inputs after every decode for the draft, and takes recurrent
  caches back through `rewind`'s checkpoints where a plain cut does not work;
* `n_tokens`/`sample()` kept as the reference keeps them after a generation ends mid-block;
* `save_state`/`load_state` that carry the draft cache, pickling that carries `speculative`;
* clear errors where the reference would crash the process (non-finite sampling values,
  grammars llama.cpp's parser would overflow on, malformed GGUF files).

With ``speculative=None`` the class is `llama_cpp.Llama` plus those checks.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import threading
import time
import warnings
from typing import Any, Iterator, Optional, Sequence

import llama_cpp
from llama_cpp import llama_cpp as ll

from . import _bindings as ext
from ._llama import (Context, Model, Placement, close_at_exit, cpu_has_amx, placement_defaults, seq_state,
                     set_seq_state, set_verbose)
from .adaptive import AdaptiveController
from .config import SpecConfig, TargetConfig
from .draft_models import draft_label, resolve_draft
from .generate import check_token_ids
from .grammar_limits import check_gbnf
from .inspect import check_gguf_file, check_target
from .proposers import Proposer
from .proposers.factory import build_draft_model, build_proposer, draft_model_ceiling, order_models
from .proposers.mtp import MTPProposer, check_mtp_target
from .rewind import is_recurrent_model, make_rewinder
from .speculator import Speculator
from .stats import SpecStats
from .target import TargetContext

__all__ = ["Llama", "PlacementWarning", "stats_summary", "draft_placement", "placement_warning"]

_SUMMARY_KEYS = (
    "algorithm", "draft_n_max", "drafted", "verified", "accepted", "verification_steps", "rollbacks",
    "generated_tokens", "prompt_tokens", "acceptance_rate", "accepted_per_step", "mean_accepted_length", "tau",
    "tokens_per_second",
    "prefill_seconds", "total_seconds",
)
# arguments of llama_cpp.Llama that cannot work with a draft attached (they can without one)
_NOT_WITH_SPECULATIVE = ("vocab_only", "embedding", "draft_model")
_SAMPLING_FLOATS = ("top_p", "min_p", "typical_p", "temp", "repeat_penalty", "frequency_penalty",
                    "presence_penalty", "tfs_z", "mirostat_tau", "mirostat_eta")
_patch_lock = threading.Lock()


class PlacementWarning(RuntimeWarning):
    """The target and the draft model sit on different devices."""


def draft_placement(spec: SpecConfig, target: Placement) -> Placement:
    """Where the draft model goes: `spec.draft_n_gpu_layers` ("auto", the default: the CPU when the
    target offloads nothing, else every layer), and the target's split mode, main GPU and tensor
    split unless `spec.draft_split_mode` / `spec.draft_main_gpu` say otherwise."""
    return Placement(spec.draft_gpu_layers(target.n_gpu_layers),
                     target.split_mode if spec.draft_split_mode is None else int(spec.draft_split_mode),
                     target.main_gpu if spec.draft_main_gpu is None else int(spec.draft_main_gpu),
                     target.tensor_split)


def _where(devices: frozenset) -> str:
    if devices == {"CPU"}:
        return "the CPU"
    gpus = sorted(d for d in devices if d != "CPU")
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ", ".join(str(g) for g in gpus)


def placement_warning(target: Placement, draft: Placement, n_gpus: int) -> Optional[str]:
    """A warning when target and draft would sit on different devices of a machine with `n_gpus`
    GPUs usable by this build (0: a CPU-only build, where everything runs on the CPU)."""
    if n_gpus <= 0:
        return None
    on_target, on_draft = target.devices(n_gpus), draft.devices(n_gpus)
    if on_target == on_draft:
        return None
    return (f"llama_dflash.Llama: the target model sits on {_where(on_target)} (n_gpu_layers="
            f"{target.n_gpu_layers}, split_mode={target.split_mode}, main_gpu={target.main_gpu}) but the draft "
            f"model on {_where(on_draft)} (draft_n_gpu_layers={draft.n_gpu_layers}, split_mode={draft.split_mode}, "
            f"main_gpu={draft.main_gpu}): the draft reads the target's output head through ctx_other on every "
            "block, across devices. Let the draft follow the target (SpecConfig(draft_n_gpu_layers='auto'), "
            "no draft_split_mode/draft_main_gpu) or place the target alike (e.g. n_gpu_layers=-1)")


def _gpu_count() -> int:
    """GPUs this llama.cpp build can offload to (0 on a CPU-only build)."""
    if not ll.llama_supports_gpu_offload():
        return 0
    from .bench.backend import backend_info

    return len(backend_info().gpus)


def stats_summary(stats: SpecStats) -> dict[str, Any]:
    """The per-response `speculative` field: counters and derived rates of one generation."""
    d = stats.to_dict()
    return {k: d[k] for k in _SUMMARY_KEYS}


@contextlib.contextmanager
def _model_params(repack: bool, load_mtp: bool = False) -> Iterator[None]:
    """Load with llama.cpp's CPU weight repacking on or off, and with the MTP layers for draft-mtp.

    llama-cpp-python builds its model parameters inside `__init__`; repacking is on there and the
    MTP (nextn) layers are skipped.  On CPUs with AMX, repacked Q4_1 weights crash batched decodes
    (plain llama_cpp.Llama too), so the default turns repacking off there; `draft-mtp` needs the
    MTP layers loaded -- the only parameters we change behind the reference's back.
    """
    if repack and not load_mtp:
        yield
        return
    with _patch_lock:
        original = ll.llama_model_default_params

        def without_repack():  # type: ignore[no-untyped-def]
            params = original()
            params.use_extra_bufts = bool(repack)
            params.load_mtp = bool(load_mtp)
            return params

        ll.llama_model_default_params = without_repack
        try:
            yield
        finally:
            ll.llama_model_default_params = original


def _check_sampling(kwargs: dict[str, Any]) -> None:
    """Values llama.cpp's samplers turn into NaN rows (then into a process abort with a grammar)."""
    for name in _SAMPLING_FLOATS:
        v = kwargs.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise ValueError(f"{name} must be a finite number, not {v!r}")
    for name in ("top_k", "mirostat_mode"):
        v = kwargs.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValueError(f"{name} must be an integer, not {v!r}")


_flash_attn_warned = False


def _warn_flash_attn_once() -> None:
    """Without flash attention a verification batch of a quantized model can compute other logits
    than single-token decodes (up to 0.52 on SmolLM2 Q4_1): say so once per process."""
    global _flash_attn_warned
    if not _flash_attn_warned:
        _flash_attn_warned = True
        warnings.warn("llama_dflash.Llama: speculative decoding with flash_attn=False (llama_cpp.Llama's default): "
                      "greedy text can differ from ordinary decoding at near-ties (the distribution does not); "
                      "pass flash_attn=True for token-for-token equal output", UserWarning, stacklevel=3)


def _check_lora(path: Optional[str]) -> None:
    """llama.cpp loads anything as a LoRA adapter without a word (garbage included)."""
    if not path:
        return
    if not os.path.isfile(path):
        raise ValueError(f"LoRA adapter not found: {path}")
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise ValueError(f"LoRA adapter {path} is not a GGUF file")


def _check_grammar(grammar: Any, vocab: int) -> None:
    """Bounded (llama.cpp's recursive parser overflows on deep nesting) and parseable (llama-cpp-
    python adds a NULL sampler to its chain for a grammar llama.cpp refuses: a segfault)."""
    text = getattr(grammar, "_grammar", None)
    if not isinstance(text, str):
        raise ValueError("grammar must be a llama_cpp.LlamaGrammar")
    check_gbnf(text)
    root = str(getattr(grammar, "_root", "root"))
    sampler = ll.llama_sampler_init_grammar(vocab, text.encode("utf-8"), root.encode("utf-8"))
    if not sampler:
        raise ValueError("llama.cpp could not parse the grammar")
    ll.llama_sampler_free(sampler)


class Llama(llama_cpp.Llama):
    """`llama_cpp.Llama` that decodes speculatively with `speculative=SpecConfig(...)`.

    Every `llama_cpp.Llama` argument means the same here (see the README's table).  Extra
    arguments: `speculative` (a `SpecConfig`, or None for no draft) and `repack` (llama.cpp's CPU
    weight repacking; None: off on AMX CPUs, where it crashes batched decodes).
    """

    def __init__(self, model_path: str, *, speculative: Optional[SpecConfig] = None,
                 repack: Optional[bool] = None, **kwargs: Any):
        self._speculator: Optional[Speculator] = None
        self.speculative = speculative
        close_at_exit(self)
        self._repack = (not cpu_has_amx()) if repack is None else bool(repack)
        if speculative is not None:
            if not isinstance(speculative, SpecConfig):
                raise ValueError(f"speculative must be a SpecConfig or None, not {type(speculative).__name__}")
            for name in _NOT_WITH_SPECULATIVE:
                if kwargs.get(name):
                    raise ValueError(f"llama_dflash.Llama: {name} cannot be combined with speculative=")
        if speculative is not None and speculative.spec_types and not kwargs.get("flash_attn", False):
            _warn_flash_attn_once()
        lora_path = kwargs.pop("lora_path", None)
        _check_lora(lora_path)
        if lora_path:  # as llama_cpp.Llama does with an adapter
            kwargs["use_mmap"] = False
        # llama.cpp aborts the process on many malformed files: check them in Python first
        target_info = check_gguf_file(model_path) if os.path.isfile(model_path) else None
        if speculative is not None:
            if target_info is None:
                raise ValueError(f"Model path does not exist: {model_path}")
            ext.check_symbols()
            check_target(target_info)  # any architecture: layer inputs only for a draft model reading them
            if speculative.uses_mtp:
                check_mtp_target(target_info)
            self._draft_info = None
            if speculative.uses_draft_model:
                self._draft_info = resolve_draft(target_info, speculative.draft_model, speculative.algorithm)
        with _model_params(self._repack, speculative is not None and speculative.uses_mtp):
            super().__init__(model_path, **kwargs)
        self.lora_path = lora_path
        if lora_path:
            try:
                self._load_lora(lora_path)
            except BaseException:
                self.close()
                raise
        mp = self.model_params
        shares = getattr(self, "tensor_split", None)
        #: where the weights went, as passed to llama.cpp: {"target": Placement, "draft": Placement
        #: or None (no draft model)}
        self.placement: dict[str, Optional[Placement]] = {
            "target": Placement(int(mp.n_gpu_layers), int(mp.split_mode), int(mp.main_gpu),
                                None if shares is None else tuple(float(x) for x in shares)),
            "draft": None,
        }
        self.last_stats = SpecStats(algorithm="ordinary")
        self.lock = threading.Lock()
        self._eval_end = 0  # one past the last position of the last decode (its outputs' anchor)
        self._outputs_from = 0  # first position of the last decode that has logits
        self._cache_end = 0  # positions the target cache really holds (>= n_tokens after a trim)
        self._last_sampled: Optional[int] = None
        self._generation = 0
        self._prefilling = False
        self._checked_grammar: Any = None
        if speculative is not None and speculative.spec_types:  # (spec_type "none": plain decoding)
            try:
                self._attach(speculative)
            except BaseException:
                self.close()
                raise

    def _load_lora(self, path: str) -> None:
        """Load the adapter and apply it to the context, as llama_cpp.Llama's lora_path does --
        except for who frees it.  llama_cpp.Llama frees it from a closure over the instance (a
        reference cycle), and llama.cpp's model also deletes the adapters still registered with
        it when freed: if the collector finalises the model first, that closure frees the adapter
        a second time (SIGSEGV).  Here the model is its one owner: llama_model_free frees it."""
        adapter = ll.llama_adapter_lora_init(self._model.model, path.encode("utf-8"))
        if not adapter:
            raise RuntimeError(f"Failed to initialize LoRA adapter from lora path: {path}")
        self._lora_adapter = adapter
        adapters = (ll.llama_adapter_lora_p_ctypes * 1)(adapter)
        scales = (ctypes.c_float * 1)(self.lora_scale)
        if ll.llama_set_adapters_lora(self._ctx.ctx, adapters, 1, scales):
            raise RuntimeError(f"Failed to set LoRA adapter from lora path: {path}")

    # ---- draft attachment ------------------------------------------------------------------------
    def _attach(self, spec: SpecConfig) -> None:
        info = self._draft_info
        set_verbose(self.verbose)  # llama.cpp's log goes through our callback from here on
        on_target = self.placement["target"]
        # views of llama_cpp.Llama's model and context: whichever way those are freed (close(), or
        # their own __del__ in a garbage cycle), the draft reading them is freed first
        model = Model.borrow(self._model.model, self.model_path, self._repack,
                             n_gpu_layers=int(self.model_params.n_gpu_layers), placement=on_target, owner=self._model,
                             load_mtp=spec.uses_mtp)
        ctx = Context.borrow(model, self._ctx.ctx, owner=self._ctx)
        config = TargetConfig(self.model_path, n_ctx=max(16, ctx.n_ctx), n_batch=ctx.n_batch,
                              n_ubatch=ctx.n_ubatch, n_threads=self.n_threads)
        target = TargetContext(model, config, extract_layers=info.target_layers if info else (), ctx=ctx)
        stats = SpecStats(algorithm=draft_label(info) if info else ",".join(spec.spec_types))
        proposer = None
        mtp: Optional[MTPProposer] = None
        try:
            if spec.uses_mtp:
                mtp = MTPProposer(spec, target, stats)
            if info is not None:
                on_draft = draft_placement(spec, on_target)
                msg = placement_warning(on_target, on_draft, _gpu_count())
                if msg:
                    warnings.warn(msg, PlacementWarning, stacklevel=3)
                # the draft's layer count comes from spec.draft_gpu_layers; the rest from here
                with placement_defaults(on_draft.split_mode, on_draft.main_gpu, on_draft.tensor_split):
                    proposer = build_draft_model(info, spec, target, stats)
                self.placement["draft"] = proposer.model.placement
            models: list[tuple[str, Proposer]] = [("draft-mtp", mtp)] if mtp is not None else []
            if proposer is not None:
                models.append((info.kind, proposer))
            drafting = build_proposer(spec, order_models(models))
            if drafting is mtp:
                stats.algorithm = "draft-mtp"
            elif drafting is not proposer:
                stats.algorithm = drafting.label  # type: ignore[attr-defined]
                drafting.stats = stats  # type: ignore[attr-defined]
            # the context is llama-cpp-python's, created without recurrent snapshots (n_rs_seq)
            if spec.rollback == "native" and is_recurrent_model(model):
                raise ValueError("llama_dflash.Llama rolls recurrent targets back through checkpoints; "
                                 "use rollback='auto' or 'checkpoint'")
            rewinder = make_rewinder(target, stats, "auto" if spec.rollback == "native" else spec.rollback)
        except BaseException:
            for m in (proposer, mtp):
                if m is not None:
                    m.close()
            target.close()
            raise
        controller = None
        if spec.adaptive and info is not None and drafting is proposer:
            controller = AdaptiveController(draft_model_ceiling(info), shadow_probes=True)
        elif spec.adaptive and mtp is not None and drafting is mtp:
            controller = AdaptiveController(mtp.n_max, shadow_probes=True)
        # input_ids is sized by the n_ctx asked for, which llama.cpp may round up for the cache
        self._speculator = Speculator(target, drafting, rewinder, controller, stats,
                                      max_positions=min(ctx.n_ctx, len(self.input_ids)), draft=proposer,
                                      owned=(mtp,) if mtp is not None else ())
        self.draft_model = self._speculator  # llama_cpp.Llama.generate's hook
        self._recurrent = is_recurrent_model(model)

    @property
    def speculator(self) -> Optional[Speculator]:
        return self._speculator

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Free the draft (it references the target context), then what llama_cpp.Llama owns."""
        spec, self._speculator = getattr(self, "_speculator", None), None
        if spec is not None:
            self.draft_model = None
            spec.close()
        if hasattr(self, "_stack"):
            super().close()

    # ---- evaluation: decode, capture features, keep the caches aligned ----------------------------
    def eval(self, tokens: Sequence[int]) -> None:
        if not self._prefilling:
            return self._eval(tokens)
        # the first eval of a generation is its prompt: what was reused, what it cost
        self.last_stats.reused_prompt_tokens = self.n_tokens
        t0 = time.perf_counter()
        try:
            self._eval(tokens)
        finally:
            self._prefilling = False
        self.last_stats.prefill_seconds = time.perf_counter() - t0

    @property
    def last_speculative_stats(self) -> dict[str, Any]:
        """The last generation's statistics under llama-cpp-python's preview names (drafted,
        verified, accepted, mean_accepted_length = tau, acceptance_rate_per_position, draft /
        target decode / target sync / process seconds, rollback and checkpoint counters,
        time_to_first_token_seconds, sustained and generation tokens/s); `last_stats` has all."""
        return self.last_stats.preview_stats()

    def _eval(self, tokens: Sequence[int]) -> None:
        spec = self._speculator
        if spec is None:
            return super().eval(tokens)
        tokens = [int(t) for t in tokens]
        check_token_ids(tokens, self._n_vocab)
        if self.n_tokens + len(tokens) > self._n_ctx:
            raise ValueError(f"{self.n_tokens + len(tokens)} tokens do not fit the context (n_ctx={self._n_ctx})")
        spec.commit(self.n_tokens)
        self._sync_cache(self.n_tokens)
        if not tokens:
            return
        n_draft = spec.block_for(tokens, self.n_tokens)
        if n_draft:
            spec.before_verify(self.n_tokens, tokens)
        t0 = time.perf_counter()
        step = self.n_batch
        for start in range(0, len(tokens), step):
            chunk = tokens[start : start + step]
            last = start + step >= len(tokens)
            self._decode(chunk, n_sure=len(chunk) - (n_draft if last else 0), last=last, verify=bool(n_draft))
        if n_draft or len(tokens) == 1:
            spec.verified(time.perf_counter() - t0)
        self._requires_eval = False

    def _decode(self, chunk: list[int], *, n_sure: int, last: bool, verify: bool) -> None:
        spec = self._speculator
        target = spec.target
        pos0 = self.n_tokens
        n = len(chunk)
        want = "all" if (self._logits_all or verify) else ("last" if last else "none")
        t0 = time.perf_counter()
        target.decode(chunk, pos0, logits=want)
        t1 = time.perf_counter()
        self.input_ids[pos0 : pos0 + n] = chunk
        self.n_tokens = self._eval_end = self._cache_end = pos0 + n
        self._outputs_from = {"all": pos0, "last": pos0 + n - 1}.get(want, pos0 + n)
        if self._logits_all:
            self.scores[pos0 : pos0 + n, :] = target.logits_rows(n)  # (waits for the device)
        if not self._prefilling:  # the decode loop's target time (the prompt's is prefill_seconds)
            stats, t2 = self.last_stats, time.perf_counter()
            stats.target_decode_seconds += t1 - t0
            stats.target_sync_seconds += t2 - t1
            stats.target_seconds += t2 - t0
        spec.on_decoded(target.layer_features(), pos0, n_sure)

    def _sync_cache(self, n_keep: int) -> None:
        """Make both caches hold exactly positions < n_keep of input_ids."""
        spec = self._speculator
        spec.rollback(n_keep)
        if self._cache_end > n_keep:
            kept = spec.rewinder.rewind(n_keep)
            spec.rewinder.settle()
            self._cache_end = kept
            if kept < spec.draft_end:
                spec.rollback(kept)
        if self._cache_end < n_keep:  # a recurrent cache emptied, or a restored state: decode again
            replay = [int(t) for t in self.input_ids[self._cache_end : n_keep]]
            self.n_tokens = self._cache_end
            step = self.n_batch
            for start in range(0, len(replay), step):
                self._decode(replay[start : start + step], n_sure=len(replay[start : start + step]),
                             last=start + step >= len(replay), verify=False)

    def reset(self) -> None:
        super().reset()
        if self._speculator is not None and getattr(self, "_recurrent", False):
            self._cache_end = 0  # the base cleared the recurrent memory
            self._speculator.rewinder.reset()
            self._speculator.clear()

    def _check_call(self, kwargs: dict[str, Any]) -> None:
        """Sampling arguments llama.cpp would crash on.  `generate` calls `sample` once per token
        with the same grammar: it is parsed once per grammar object, not per token."""
        _check_sampling(kwargs)
        grammar = kwargs.get("grammar")
        if grammar is not None and grammar is not self._checked_grammar:
            _check_grammar(grammar, self._model.vocab)
            self._checked_grammar = grammar

    # ---- sampling: rows addressed from the last decode, as the reference does ---------------------
    def sample(self, *args: Any, idx: Optional[int] = None, **kwargs: Any) -> int:
        """As llama_cpp.Llama.sample.  With a draft attached, the last decode may hold rows past
        `n_tokens` (a generation that ended inside a verified block): the row of position
        `idx` (default n_tokens - 1) is found among the last decode's outputs."""
        self._check_call(kwargs)
        if self._speculator is None:
            if self.n_tokens <= 0:
                raise ValueError("sample() needs evaluated tokens: call eval() first")
            return super().sample(*args, idx=idx, **kwargs)
        pos = idx if idx is not None else self.n_tokens - 1
        if not self._outputs_from <= pos < self._eval_end:
            raise ValueError(f"position {pos} has no logits from the last eval(): evaluate tokens first")
        self._last_sampled = pos
        # the base computes its row index as idx - n_tokens; aim it at our row
        return super().sample(*args, idx=pos - self._eval_end + self.n_tokens, **kwargs)

    # ---- generation ---------------------------------------------------------------------------------
    def generate(self, tokens: Sequence[int], *args: Any, **kwargs: Any) -> Iterator[int]:  # type: ignore[override]
        """llama_cpp.Llama.generate, with statistics in `last_stats`."""
        self._check_call(kwargs)
        check_token_ids(tokens, self._n_vocab)
        return self._generate(list(tokens), args, kwargs)

    def _generate(self, tokens: list[int], args: tuple, kwargs: dict) -> Iterator[int]:
        spec = self._speculator
        stats = SpecStats(algorithm=spec.stats.algorithm if spec else "ordinary",
                          draft_n_max=spec.proposer.n_max if spec else 0,
                          adaptive=bool(spec and spec.controller is not None))
        stats.prompt_tokens = len(tokens)
        self.last_stats = stats
        if spec is not None:
            spec.use_stats(stats)
        self._last_sampled = None
        self._generation += 1
        self._prefilling = True
        mine = self._generation
        self._ended_on_eog = False
        inner = super().generate(tokens, *args, **kwargs)
        t0 = time.perf_counter()
        try:
            sent = None
            while True:
                tok = inner.send(sent)
                self._ended_on_eog = bool(ll.llama_vocab_is_eog(self._model.vocab, tok))
                if stats.generated_tokens == 0:
                    stats.first_token_seconds = time.perf_counter() - t0
                stats.generated_tokens += 1
                sent = yield tok
        except StopIteration:
            return
        finally:
            inner.close()
            stats.total_seconds = time.perf_counter() - t0
            if mine == self._generation:  # an abandoned older generator must not touch a newer one
                self._end_generation()

    def _end_generation(self) -> None:
        """Leave n_tokens where llama_cpp.Llama leaves it: one past the last sampled row.  Drafts
        evaluated beyond it stay in the caches until the next eval cuts them."""
        if self._last_sampled is not None and self.n_tokens > self._last_sampled + 1:
            self.n_tokens = self._last_sampled + 1
        spec = self._speculator
        if spec is not None:
            spec.commit(self.n_tokens)

    # ---- responses carry the statistics ---------------------------------------------------------------
    def create_completion(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        return self._with_stats(super().create_completion(*args, **kwargs))

    def create_chat_completion(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        return self._with_stats(super().create_chat_completion(*args, **kwargs))

    def _with_stats(self, result: Any):
        if isinstance(result, dict):
            result["speculative"] = self._summary()
            return result
        return self._stream_with_stats(result)

    def _summary(self) -> dict[str, Any]:
        """`stats_summary` of the last generation, with the prompt tokens found in the cache and the
        tokens of the answer (llama-cpp-python's usage count: a closing end-of-generation token is
        generated but not part of the answer)."""
        out = stats_summary(self.last_stats)
        out["cached_tokens"] = self.last_stats.reused_prompt_tokens
        out["completion_tokens"] = self.last_stats.generated_tokens - int(getattr(self, "_ended_on_eog", False))
        return out

    def _stream_with_stats(self, chunks: Iterator[dict]) -> Iterator[dict]:
        try:
            for chunk in chunks:
                choices = chunk.get("choices") or []
                if choices and choices[0].get("finish_reason") is not None:
                    chunk["speculative"] = self._summary()
                yield chunk
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    # ---- state ---------------------------------------------------------------------------------------
    def save_state(self) -> llama_cpp.LlamaState:
        """The reference's state plus the draft cache (so drafting resumes after `load_state`)."""
        state = super().save_state()
        spec = self._speculator
        if spec is not None and spec.draft is not None:
            spec.commit(self.n_tokens)
            spec.rollback(self.n_tokens)
            draft = spec.draft
            if hasattr(draft, "get_state"):  # what it keeps beyond its cache (an EAGLE-3 head's g rows)
                saved = draft.get_state()
            else:
                draft.flush()
                saved = seq_state(draft.ctx.ptr)
            state.dflash_draft = (saved, spec.draft_end)  # type: ignore[attr-defined]
        state.dflash_cache = (self._cache_end, self._eval_end, self._outputs_from)  # type: ignore[attr-defined]
        return state

    def load_state(self, state: llama_cpp.LlamaState) -> None:
        super().load_state(state)
        # llama.cpp's state carries the cache and the last decode's outputs
        cache = getattr(state, "dflash_cache", (state.n_tokens, state.n_tokens, state.n_tokens - 1))
        self._cache_end, self._eval_end, self._outputs_from = (int(x) for x in cache)
        spec = self._speculator
        if spec is None:
            return
        spec.clear()
        draft = getattr(state, "dflash_draft", None)
        if draft is None or spec.draft is None:
            return
        model = spec.draft
        if model.set_state(draft[0]) if hasattr(model, "set_state") else set_seq_state(model.ctx.ptr, draft[0]):
            spec.draft_end = int(draft[1])

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["draft_model"] = None
        state["speculative"] = self.speculative
        state["repack"] = self._repack
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

