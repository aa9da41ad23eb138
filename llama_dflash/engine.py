"""`LlamaDFlashDecoding`: a target and a DFlash/DSpark draft, validated, loaded and driven together."""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

from . import _bindings as ext
from ._llama import Model, close_at_exit, set_verbose
from .adaptive import AdaptiveController
from .config import SpecConfig, TargetConfig, model_priority
from .generate import DraftController, GenerationState, ordinary_generate, speculative_generate
from .draft_models import AnyDraftInfo, draft_label, resolve_draft
from .inspect import DraftInfo, GGUFInfo, check_target_file
from .proposers import DFlashProposer, Proposer
from .proposers.auto import AutoProposer
from .proposers.chain import ChainProposer
from .proposers.factory import (build_auto_lookup, build_draft_model, build_proposer, build_token_drafters,
                                draft_model_ceiling, order_models)
from .proposers.mtp import DEFAULT_MTP_N_MAX, MTPProposer, check_mtp_target
from .rewind import Rewinder, is_recurrent_model, make_rewinder, native_depth_needed
from .sampling import Sampler, SamplingParams
from .stats import SpecStats
from .target import TargetContext

__all__ = ["LlamaDFlashDecoding", "OrdinaryDecoding", "GenerationResult"]


class GenerationResult:
    """Tokens of one generation with its finish reason and statistics."""

    def __init__(self, tokens: list[int], finish_reason: Optional[str], stats: SpecStats):
        self.tokens = tokens
        self.finish_reason = finish_reason
        self.stats = stats

    def __repr__(self) -> str:
        return f"GenerationResult({len(self.tokens)} tokens, finish_reason={self.finish_reason!r})"


class _Decoder:
    """Shared life cycle: owns a target context, closes it once, usable as a context manager."""

    target: TargetContext
    _owns_model: bool
    _model: Optional[Model]

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # tokens the caches hold at positions 0.. after the last generation; empty: nothing known
    # (fresh, or the last generation failed), so the next one starts from scratch
    _cached: list[int] = []
    _cut_allowed = True  # False for recurrent caches: only an exact extension can be reused

    def _n_reuse(self, prompt: Sequence[int], reuse_prefix: bool) -> int:
        """Prompt positions whose cache cells can stay (prefix reuse across calls)."""
        cached, self._cached = self._cached, []
        if not reuse_prefix or not cached:
            return 0
        limit = min(len(cached), len(prompt) - 1)
        n = 0
        while n < limit and cached[n] == prompt[n]:
            n += 1
        if n < len(cached) and not self._cut_allowed:
            return 0
        return n

    def forget_cache(self) -> None:
        """The caches were changed behind the engine's back: the next generation starts afresh."""
        self._cached = []

    def _track(self, gen: Iterator[int], prompt: list[int], state: GenerationState,
               sampler: Sampler) -> Iterator[int]:
        """Pass tokens through; remember what the caches hold once the generation ended or its
        consumer closed it (the loop's `finally` has rewound the caches to match by then)."""
        try:
            yield from gen
        except GeneratorExit:
            self._cached = (prompt + state.tokens)[: state.n_past]
            raise
        finally:
            gen.close()
            sampler.close()
        self._cached = (prompt + state.tokens)[: state.n_past]

    def tokenize(self, text: str) -> list[int]:
        return self.target.model.tokenize(text)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.target.model.detokenize(list(tokens))

    def _sampler(self, sampling: Optional[SamplingParams], ignore_eos: bool) -> Sampler:
        """llama.cpp's sampler chain for one generation; ignore_eos masks end-of-generation
        tokens out of sampling (llama.cpp's meaning of --ignore-eos)."""
        model = self.target.model
        return Sampler(sampling, n_vocab=model.n_vocab, banned=model.eog_tokens() if ignore_eos else ())


def _load_target_model(config: TargetConfig, model: Optional[Model], load_mtp: bool = False) -> tuple[Model, bool]:
    """The target model: the one passed in (shared, not ours to free) or a new one.  `load_mtp`:
    with its MTP blocks (a shared model must have been loaded so)."""
    if model is not None:
        if load_mtp and not getattr(model, "load_mtp", False):
            raise ValueError("draft-mtp needs the target model loaded with its MTP layers (Model(..., load_mtp=True))")
        return model, False
    return Model(config.model, n_gpu_layers=config.n_gpu_layers, repack=config.repack, load_mtp=load_mtp), True


class OrdinaryDecoding(_Decoder):
    """Plain decoding of the target, with the same prefill and sampler as the speculative engine."""

    def __init__(self, target: TargetConfig, *, model: Optional[Model] = None):
        close_at_exit(self)
        set_verbose(target.verbose)
        self.target_info: GGUFInfo = check_target_file(target.model)
        self._model, self._owns_model = _load_target_model(target, model)
        self.target = TargetContext(self._model, target)
        self._cut_allowed = not is_recurrent_model(self._model)
        self.last_stats = SpecStats()

    def close(self) -> None:
        if getattr(self, "target", None) is not None:
            self.target.close()
        if getattr(self, "_owns_model", False) and self._model is not None:
            self._model.close()
        self._model = None

    def stream(self, prompt: Sequence[int], max_tokens: int, sampling: Optional[SamplingParams] = None,
               *, ignore_eos: bool = False, state: Optional[GenerationState] = None,
               reuse_prefix: bool = False) -> Iterator[int]:
        """Yield generated tokens; `reuse_prefix` keeps the cache cells of the longest common
        prefix with the previous generation instead of decoding the prompt again."""
        self.last_stats = SpecStats(algorithm="ordinary")
        prompt = list(prompt)
        state = state if state is not None else GenerationState()
        n_reuse = self._n_reuse(prompt, reuse_prefix)
        sampler = self._sampler(sampling, ignore_eos)
        return self._track(ordinary_generate(self.target, prompt, max_tokens, sampler, state=state,
                                             stats=self.last_stats, n_reuse=n_reuse), prompt, state, sampler)

    def generate(self, prompt: Sequence[int], max_tokens: int, sampling: Optional[SamplingParams] = None,
                 *, ignore_eos: bool = False, reuse_prefix: bool = False) -> GenerationResult:
        state = GenerationState()
        tokens = list(self.stream(prompt, max_tokens, sampling, ignore_eos=ignore_eos, state=state,
                                  reuse_prefix=reuse_prefix))
        return GenerationResult(tokens, state.finish_reason, self.last_stats)


class LlamaDFlashDecoding(_Decoder):
    """Speculative decoding of one sequence (seq_id 0): a draft model (DFlash/DSpark, an EAGLE-3
    head or a classic draft model), the target's own MTP head, token-only drafters (llama.cpp's
    n-gram types, our lookup), a chain of them or `auto` over them (`SpecConfig.spec_type`).

    Both files are validated in Python before llama.cpp sees them (llama.cpp aborts the process
    on several incompatibilities).  The draft context shares the target's embeddings and LM head
    through `ctx_other`; target-layer inputs are captured after every target decode and injected
    into the draft's KV cache (on every step, whichever member of a chain drafted).
    """

    def __init__(self, target: TargetConfig, spec: SpecConfig, *, model: Optional[Model] = None):
        close_at_exit(self)
        set_verbose(target.verbose)
        ext.check_symbols()
        self.spec = spec
        # any architecture llama.cpp runs: only a draft model reading layer inputs needs more
        # (resolve_draft checks the target for the draft models that read them), and the MTP head
        # needs one in the file
        self.target_info: GGUFInfo = check_target_file(target.model)
        if spec.uses_mtp:
            check_mtp_target(self.target_info)
        self.draft_info: Optional[AnyDraftInfo] = None
        if spec.uses_draft_model:
            self.draft_info = resolve_draft(self.target_info, spec.draft_model, spec.algorithm)
        self._token_drafters = build_token_drafters(spec)
        self._auto_type = "auto" in spec.spec_types
        if not spec.spec_types:
            raise ValueError("spec_type 'none' drafts nothing: use OrdinaryDecoding")
        self.algorithm = self._algorithm_name()
        self._draft: Optional[Proposer] = None  # the draft model, of any kind
        self._mtp: Optional[MTPProposer] = None
        self._chain: Optional[ChainProposer] = None
        self._auto: Optional[AutoProposer] = None
        self.last_stats = self._new_stats()
        self._model, self._owns_model = _load_target_model(target, model, load_mtp=spec.uses_mtp)
        self.target = None  # type: ignore[assignment]
        self.proposer: Optional[Proposer] = None
        try:
            # recurrent state snapshots for native rollback are sized when the context is made
            n_rs_seq = self._native_depth(target, spec, is_recurrent_model(self._model))
            self.target = TargetContext(
                self._model, target, extract_layers=self.draft_info.target_layers if self.draft_info else (),
                n_rs_seq=n_rs_seq, n_outputs_max_per_seq=0,
            )
            if spec.uses_mtp:
                self._mtp = MTPProposer(spec, self.target, self.last_stats)
            if self.draft_info is not None:
                self._draft = build_draft_model(self.draft_info, spec, self.target, self.last_stats)
            self.proposer = build_proposer(spec, self._models(), drafters=self._token_drafters)
            if isinstance(self.proposer, AutoProposer):
                self._auto = self.proposer
            elif isinstance(self.proposer, ChainProposer):
                self._chain = self.proposer
            if self.proposer is not self._draft:
                self.proposer.stats = self.last_stats  # type: ignore[attr-defined]
            self.rewinder: Rewinder = make_rewinder(self.target, self.last_stats, spec.rollback)
            self._cut_allowed = self.rewinder.mode == "kv"
            # one controller per engine: repeated generations start with warm cost/acceptance models
            self._auto_controller: Optional[AdaptiveController] = None
            self.controller: Optional[AdaptiveController] = (
                self._adaptive() if spec.adaptive and self._single_model() is not None else None)
        except BaseException:
            self.close()
            raise

    @property
    def _dflash(self) -> Optional[DFlashProposer]:
        """The draft model where it is a DFlash/DSpark/DFlash2 draft."""
        draft = getattr(self, "_draft", None)
        return draft if isinstance(draft, DFlashProposer) else None

    def _model_names(self) -> list[str]:
        """The models' speculative-type names, in llama.cpp's priority (draft-simple, draft-eagle3,
        draft-mtp, draft-dflash, draft-dspark)."""
        names = ["draft-mtp"] if self.spec.uses_mtp else []
        if self.draft_info is not None:
            names.append(self._draft_type_name())
        return sorted(names, key=model_priority)

    def _models(self) -> list[tuple[str, Proposer]]:
        models: list[tuple[str, Proposer]] = []
        if self._mtp is not None:
            models.append(("draft-mtp", self._mtp))
        if self._draft is not None:
            models.append((self._draft_type_name(), self._draft))
        return order_models(models)

    def _single_model(self) -> Optional[Proposer]:
        """The model that drafts alone (no chain, no auto), if that is the setup."""
        models = self._models()
        return models[0][1] if len(models) == 1 and self.proposer is models[0][1] else None

    def _algorithm_name(self) -> str:
        """The draft's algorithm alone; the MTP head: "draft-mtp"; a chain: its members' names
        ("ngram-map-k,draft-dflash"); auto: "auto" and its models."""
        models = self._model_names()
        if self._auto_type:
            return ",".join(["auto"] + models)
        if not self._token_drafters and len(models) == 1:
            return draft_label(self.draft_info) if self.draft_info is not None else models[0]
        return ",".join([d.name for d in self._token_drafters] + models)

    def _draft_type_name(self) -> str:
        assert self.draft_info is not None
        return self.draft_info.kind

    @property
    def speculator_names(self) -> tuple[str, ...]:
        """The drafters asked at every step, in priority order."""
        if self._auto is not None:
            return ("auto",) + self._auto.names
        return self._chain.names if self._chain is not None else tuple(self._model_names())

    def _max_draft_tokens(self) -> int:
        n = [d.n_max for d in self._token_drafters]
        if self._auto_type:
            n.append(build_auto_lookup().n_max)
        if self.draft_info is not None:
            ceiling = draft_model_ceiling(self.draft_info)
            n.append(ceiling if self.spec.adaptive or isinstance(self.draft_info, DraftInfo)
                     else int(self.spec.draft_n_max))
        if self.spec.uses_mtp:
            n.append(DEFAULT_MTP_N_MAX if self.spec.adaptive else int(self.spec.draft_n_max))
        return max(n)

    def _native_depth(self, target: TargetConfig, spec: SpecConfig, recurrent: bool) -> int:
        """n_rs_seq for the target context: the draft's block, when native rollback is wanted and
        possible.  llama.cpp keeps a decode's last n_rs_seq + 1 tokens in one ubatch and aborts
        the process unless n_ubatch > n_rs_seq + 1 (llama-batch.cpp), so that is checked here."""
        if not recurrent or spec.rollback == "checkpoint":
            return 0
        depth = native_depth_needed(self._max_draft_tokens())
        if target.n_ubatch > depth + 1:  # (TargetConfig keeps n_ubatch <= n_batch)
            return depth
        if spec.rollback == "native":
            raise ValueError(
                f"rollback='native' keeps {depth} recurrent snapshots (the draft's block), which needs "
                f"n_ubatch > {depth + 1}, not {target.n_ubatch}; raise n_ubatch or use rollback='checkpoint'")
        return 0  # auto: checkpoints instead

    @property
    def draft_n_max(self) -> int:
        return self._draft.n_max if self._draft is not None else self.proposer.n_max

    def _ceiling(self) -> int:
        """The longest draft of the model that drafts alone under "auto": a DFlash draft's block,
        an autoregressive draft's default length, or the MTP head's."""
        return draft_model_ceiling(self.draft_info) if self._draft is not None else DEFAULT_MTP_N_MAX

    def _adaptive(self) -> AdaptiveController:
        if self._auto_controller is None:
            # this engine's loop scores probes without verifying them (adaptive.ShadowProbe)
            self._auto_controller = AdaptiveController(self._ceiling(), shadow_probes=True)
        return self._auto_controller

    def set_draft_n_max(self, n: "int | str") -> "int | str":
        """Change the draft length of later generations: an integer (clamped to the block) or
        "auto" (the adaptive controller, with the block as ceiling); returns what is used."""
        model = self._single_model()
        if model is None:
            raise ValueError("draft_n_max sets the length of a model drafting alone; these drafters have none "
                             f"({', '.join(self.speculator_names)})")
        if n == "auto":
            model.n_max = self._ceiling()
            self.controller = self._adaptive()
        else:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"draft_n_max must be an integer >= 1 or 'auto', not {n!r}")
            model.n_max = self._dflash._clamp_n_max(n) if model is self._dflash else n
            self.controller = None
        model.n_min = min(self.spec.draft_n_min, model.n_max)  # type: ignore[attr-defined]
        return "auto" if self.controller is not None else model.n_max

    def _new_stats(self) -> SpecStats:
        if getattr(self, "_draft", None) is not None:
            n_max = self._draft.n_max
        elif getattr(self, "proposer", None) is not None:
            n_max = self.proposer.n_max
        else:
            n_max = self._max_draft_tokens()
        return SpecStats(
            algorithm=self.algorithm,
            draft_n_max=n_max,
            adaptive=getattr(self, "controller", None) is not None,
            backend_sampling_requested=self.spec.backend_sampling is not False,
            backend_sampling_active=bool(getattr(getattr(self, "_dflash", None), "backend_sampling_active", False)),
        )

    def close(self) -> None:
        """Free draft, then target, then the model (if we loaded it). Safe to call twice."""
        proposer, self.proposer = getattr(self, "proposer", None), None
        if proposer is not None:
            proposer.close()
        rewinder = getattr(self, "rewinder", None)
        if rewinder is not None:
            rewinder.close()
        for name in ("_mtp", "_draft"):
            model = getattr(self, name, None)
            if model is not None:
                model.close()
        target = getattr(self, "target", None)
        if target is not None:
            target.close()
        if getattr(self, "_owns_model", False) and getattr(self, "_model", None) is not None:
            self._model.close()
        self._model = None

    @property
    def closed(self) -> bool:
        return self.proposer is None

    def use_proposer(self, proposer: Proposer) -> None:
        """Swap in another proposer (e.g. a ScriptedProposer wrapping this engine's draft)."""
        self.proposer = proposer

    def stream(self, prompt: Sequence[int], max_tokens: int, sampling: Optional[SamplingParams] = None,
               *, ignore_eos: bool = False, state: Optional[GenerationState] = None,
               controller: Optional[DraftController] = None, reuse_prefix: bool = False) -> Iterator[int]:
        """Yield generated tokens one by one; statistics land in `self.last_stats`.

        `reuse_prefix`: keep the cells of the longest common prefix with the previous
        generation in both caches (target and draft stay aligned) instead of decoding it again."""
        if self.proposer is None:
            raise RuntimeError("LlamaDFlashDecoding is closed")
        self.last_stats = stats = self._new_stats()
        for model in (self._draft, self._mtp):
            if model is not None:
                model.stats = stats
        if self._chain is not None:
            self._chain.stats = stats
        if self._auto is not None:
            self._auto.stats = stats
        if controller is None:
            controller = self.controller
        if isinstance(controller, AdaptiveController):
            controller.stats = stats
            stats.adaptive = True
        prompt = list(prompt)
        state = state if state is not None else GenerationState()
        n_reuse = self._n_reuse(prompt, reuse_prefix)
        if n_reuse and not getattr(self.proposer, "knows", lambda pos: True)(n_reuse):
            n_reuse = 0  # (the MTP head lost the hidden state it would resume from)
        sampler = self._sampler(sampling, ignore_eos)
        gen = speculative_generate(self.target, self.proposer, prompt, max_tokens, sampler, state=state,
                                   stats=stats, controller=controller, rewinder=self.rewinder, n_reuse=n_reuse)
        return self._track(gen, prompt, state, sampler)

    def generate(self, prompt: Sequence[int], max_tokens: int, sampling: Optional[SamplingParams] = None,
                 *, ignore_eos: bool = False, controller: Optional[DraftController] = None,
                 reuse_prefix: bool = False) -> GenerationResult:
        state = GenerationState()
        tokens = list(self.stream(prompt, max_tokens, sampling, ignore_eos=ignore_eos, state=state,
                                  controller=controller, reuse_prefix=reuse_prefix))
        return GenerationResult(tokens, state.finish_reason, self.last_stats)
