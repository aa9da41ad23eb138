"""Configuration dataclasses: what the user asks for, validated before any model is loaded."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Optional, Sequence, Union

__all__ = ["SpecConfig", "TargetConfig", "SpeculativeType", "ALGORITHMS", "ROLLBACK_MODES", "FLASH_ATTN_MODES",
           "SPEC_TYPE_NAMES", "DRAFT_SPEC_TYPES", "MTP_SPEC_TYPE", "MODEL_TYPE_ORDER", "model_priority"]

# "dflash2": a DFlash2 draft (DFlash with a selector lattice), checked against the file; "dflash"
# accepts DFlash2 files too; "eagle3": an EAGLE-3 head (architecture eagle3); "simple": a classic
# autoregressive draft model of any architecture (llama.cpp's draft-simple)
ALGORITHMS = ("auto", "dflash", "dspark", "dflash2", "eagle3", "simple")
ROLLBACK_MODES = ("auto", "native", "checkpoint")
FLASH_ATTN_MODES = ("auto", "on", "off")


class SpeculativeType(str, Enum):
    """What drafts: llama.cpp's `--spec-type` names, plus our own LOOKUP and AUTO.

    The members are strings (`SpeculativeType.NGRAM_MAP_K == "ngram-map-k"`), so either spelling
    can be given to `SpecConfig(spec_type=...)`.
    """

    NONE = "none"
    # a small autoregressive model with the target's vocabulary (its own context and KV cache)
    DRAFT_SIMPLE = "draft-simple"
    # an EAGLE-3 head reading three of the target's layers
    DRAFT_EAGLE3 = "draft-eagle3"
    # the target's own multi-token-prediction head (no draft file)
    DRAFT_MTP = "draft-mtp"
    DRAFT_DFLASH = "draft-dflash"
    DRAFT_DSPARK = "draft-dspark"
    NGRAM_SIMPLE = "ngram-simple"
    NGRAM_MAP_K = "ngram-map-k"
    NGRAM_MAP_K4V = "ngram-map-k4v"
    NGRAM_MOD = "ngram-mod"
    NGRAM_CACHE = "ngram-cache"
    # ours: suffix lookup over prompt + output (llama_dflash.proposers.lookup)
    LOOKUP = "lookup"
    # ours: per step, the lookup, the draft model's block or no draft, chosen by measured cost
    AUTO = "auto"

    def __str__(self) -> str:
        return self.value


# the draft model, its algorithm detected from the file later (what algorithm="auto" asks for);
# a canonical name of ours, deliberately not a SpeculativeType member
GENERIC_DRAFT = "draft"
DRAFT_SPEC_TYPES = (GENERIC_DRAFT, SpeculativeType.DRAFT_SIMPLE.value, SpeculativeType.DRAFT_EAGLE3.value,
                    SpeculativeType.DRAFT_DFLASH.value, SpeculativeType.DRAFT_DSPARK.value)
#: drafters that are models but need no draft file: the target's MTP head
MTP_SPEC_TYPE = SpeculativeType.DRAFT_MTP.value
# llama.cpp's fixed priority (common/speculative.cpp, common_speculative_init): the n-gram types,
# then the model types (draft-simple, draft-eagle3, draft-mtp, draft-dflash, draft-dspark); our
# lookup (and auto, which picks among the lookup and the models) in between.  "draft" (the draft
# model, its type read from the file) sits with the DFlash types; engines order the models by the
# type the file turns out to be (`model_priority`).
_PRIORITY = (
    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
    "lookup", "auto",
    "draft-simple", "draft-eagle3", MTP_SPEC_TYPE, GENERIC_DRAFT, "draft-dflash", "draft-dspark",
)
#: the model types in llama.cpp's priority (a chain asks them in this order)
MODEL_TYPE_ORDER = ("draft-simple", "draft-eagle3", MTP_SPEC_TYPE, "draft-dflash", "draft-dspark")


def model_priority(name: str) -> int:
    """Where a model type ("draft-eagle3", "draft-mtp", ...) stands in llama.cpp's priority."""
    return MODEL_TYPE_ORDER.index(name) if name in MODEL_TYPE_ORDER else len(MODEL_TYPE_ORDER)

#: every name `spec_type` accepts
SPEC_TYPE_NAMES = ("none", *_PRIORITY)
# the n-gram types that take ngram_size_n / ngram_size_m / ngram_min_hits
_NGRAM_MAP_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v")
_DRAFT_ALGORITHM = {"draft-dflash": "dflash", "draft-dspark": "dspark", "draft-eagle3": "eagle3",
                    "draft-simple": "simple"}
_GPU_LAYER_WORDS = ("all", "auto")
_U16_MAX = 0xFFFF

SpecTypeArg = Union[None, str, SpeculativeType, Sequence[Union[str, SpeculativeType]]]


class _DefaultInt(int):
    """An int that marks a field left at its default: where the draft file caps it (draft_n_max
    over what its block yields) it is lowered without the warning an explicit value gets."""

    def __repr__(self) -> str:
        return int.__repr__(self)


def is_default(value: object) -> bool:
    """Whether `value` is a SpecConfig field's default (the user did not set it)."""
    return isinstance(value, _DefaultInt)


DEFAULT_DRAFT_N_MAX = _DefaultInt(7)


def _check_int(name: str, value: object, minimum: int, maximum: Optional[int] = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, not {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ValueError(f"{name} must be {bound}, not {value}")


#: llama.cpp's llama_split_mode values by name
SPLIT_MODE_NAMES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}


def split_mode_value(name: str, value: object) -> int:
    """A split mode given by name or llama_split_mode value, as the value."""
    if isinstance(value, str):
        key = value.strip().lower()
        if key not in SPLIT_MODE_NAMES:
            raise ValueError(f"{name} must be one of {', '.join(SPLIT_MODE_NAMES)} or 0..3, not {value!r}")
        return SPLIT_MODE_NAMES[key]
    _check_int(name, value, 0, max(SPLIT_MODE_NAMES.values()))
    return int(value)  # type: ignore[arg-type]


def _path_or_none(name: str, value: object) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise ValueError(f"{name} must be a path to a draft GGUF, not {value!r}")
    path = os.fspath(value)
    if not isinstance(path, str):  # a bytes path
        raise ValueError(f"{name} must be a path to a draft GGUF, not {value!r}")
    return path


def _spec_type_names(value: SpecTypeArg) -> list[str]:
    """The names in `spec_type` as given (a name, a member, "a,b", or a sequence of those)."""
    if isinstance(value, (str, SpeculativeType)):
        items: list[object] = [value]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ValueError(f"spec_type must be a name, a SpeculativeType, a comma-separated string or a list "
                         f"of those, not {value!r}")
    names: list[str] = []
    for item in items:
        if isinstance(item, SpeculativeType):
            names.append(item.value)
            continue
        if not isinstance(item, str):
            raise ValueError(f"spec_type entries must be names or SpeculativeType members, not {item!r}")
        for part in item.split(","):
            name = part.strip().lower().replace("_", "-")
            if not name:
                raise ValueError(f"spec_type has an empty name in {value!r} (use 'none' for no speculation)")
            if name not in SPEC_TYPE_NAMES:
                raise ValueError(f"spec_type {part.strip()!r} is not a speculative type; valid: "
                                 f"{', '.join(SPEC_TYPE_NAMES)}")
            names.append(name)
    if not names:
        raise ValueError("spec_type names no type (use 'none' for no speculation)")
    return names


@dataclass
class SpecConfig:
    """How to draft: which speculative types, which draft file and algorithm, how many tokens and
    how picky.

    `spec_type` (llama-cpp-python's preview API) selects the drafters; they are normalised into
    `spec_types`, a tuple of canonical names in llama.cpp's priority order.  Without it the draft
    model alone drafts, as `algorithm` says.  `draft_model_path` and `draft_backend_sampling` are
    the preview's names of `draft_model` and `backend_sampling`: after construction each pair
    holds the same value.

    `draft_n_max` is clamped to what the draft's block can yield once the draft file is known
    (with a warning where it was given; the default, 7, is lowered silently); see
    `LlamaDFlashDecoding`.
    """

    draft_model: Optional[str] = None  # required iff spec_types has a draft type
    # auto | dflash | dspark | dflash2 (a DFlash2 draft file required) | eagle3 | simple
    algorithm: str = "auto"
    draft_n_max: int | str = DEFAULT_DRAFT_N_MAX  # 7, or "auto": adaptive length, the draft's block as the ceiling
    draft_n_min: int = 0
    draft_p_min: float = 0.0
    # the draft's top candidates picked by a top-k sampler inside its graph: True, False, or "auto"
    # (only where the draft runs on a GPU: on the CPU reading the rows costs less, 2.1 vs 3.1 ms per
    # 5-row block of the default draft, bench/draft_cost.py)
    backend_sampling: bool | str = "auto"
    # an integer >= -1 (-1: all), "all", or "auto" (the default: where the target is -- on the CPU
    # if the target offloads nothing, else every draft layer on the GPU); see draft_gpu_layers()
    draft_n_gpu_layers: int | str = "auto"
    # llama_dflash.Llama: the draft model's split mode ("none", "layer", "row", "tensor" or its
    # llama_split_mode value) and main GPU; None (the default): the target's, as its tensor_split
    # (e.g. pin a small draft to one GPU of a multi-GPU target: draft_split_mode="none",
    # draft_main_gpu=1)
    draft_split_mode: Optional[int | str] = None
    draft_main_gpu: Optional[int] = None
    draft_n_threads: Optional[int] = None
    # recurrent/hybrid targets: "auto", "native" (n_rs_seq snapshots) or "checkpoint" (see rewind)
    rollback: str = "auto"
    # ---- llama-cpp-python preview (0.3.49) names ----------------------------------------------
    # None (the draft model, as `algorithm` says), a name or SpeculativeType, "a,b", or a list
    spec_type: SpecTypeArg = None
    draft_model_path: Optional[str] = None  # = draft_model
    draft_backend_sampling: Optional[bool | str] = None  # = backend_sampling
    # n-gram settings of ngram-simple / ngram-map-k / ngram-map-k4v; None: llama.cpp's default
    ngram_size_n: Optional[int] = None
    ngram_size_m: Optional[int] = None
    ngram_min_hits: Optional[int] = None
    # normalised spec_type: canonical names, de-duplicated, in llama.cpp's priority order
    spec_types: tuple[str, ...] = field(init=False, default=())

    @property
    def adaptive(self) -> bool:
        return self.draft_n_max == "auto"

    @property
    def uses_draft_model(self) -> bool:
        """Whether a draft-file type ("draft", "draft-simple", "draft-eagle3", "draft-dflash",
        "draft-dspark") is among `spec_types`."""
        return any(t in DRAFT_SPEC_TYPES for t in self.spec_types)

    @property
    def uses_mtp(self) -> bool:
        """Whether the target's own MTP head drafts ("draft-mtp" among `spec_types`)."""
        return MTP_SPEC_TYPE in self.spec_types

    @property
    def token_types(self) -> tuple[str, ...]:
        """The names in `spec_types` that are not model types (n-gram, lookup, auto)."""
        return tuple(t for t in self.spec_types if t not in DRAFT_SPEC_TYPES and t != MTP_SPEC_TYPE)

    def draft_gpu_layers(self, target_n_gpu_layers: int) -> int:
        """`draft_n_gpu_layers` as a layer count for llama.cpp: "auto" follows the target's
        placement (`target_n_gpu_layers`): 0 (the CPU) where the target offloads no layer, else -1
        (every draft layer) -- llama.cpp puts a model's output head on the GPU as soon as one layer
        is offloaded, and the draft reads the target's head through ctx_other on every block.
        "all" is -1, an integer stays itself."""
        _check_int("target_n_gpu_layers", target_n_gpu_layers, -1)
        if self.draft_n_gpu_layers == "auto":
            return 0 if target_n_gpu_layers == 0 else -1
        if self.draft_n_gpu_layers == "all":
            return -1
        return int(self.draft_n_gpu_layers)

    def __post_init__(self) -> None:
        self._resolve_aliases()
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, not {self.algorithm!r}")
        self.spec_types = self._resolve_spec_types()
        if self.uses_draft_model and self.draft_model is None:
            raise ValueError(f"draft_model (or draft_model_path) is required: spec_type "
                             f"{','.join(self.spec_types)} drafts with a draft model")
        if not self.uses_draft_model and self.draft_model is not None:
            raise ValueError(f"draft_model {self.draft_model!r} is given but spec_type "
                             f"{','.join(self.spec_types) or 'none'} selects no draft-model type "
                             f"({', '.join(DRAFT_SPEC_TYPES)})")
        if self.draft_n_max != "auto":
            if isinstance(self.draft_n_max, str):
                raise ValueError(f"draft_n_max must be an integer >= 1 or 'auto', not {self.draft_n_max!r}")
            _check_int("draft_n_max", self.draft_n_max, 1)
        _check_int("draft_n_min", self.draft_n_min, 0)
        if self.draft_n_max != "auto" and self.draft_n_min > self.draft_n_max:
            raise ValueError(
                f"draft_n_min ({self.draft_n_min}) must not exceed draft_n_max ({self.draft_n_max})"
            )
        if isinstance(self.draft_p_min, bool) or not isinstance(self.draft_p_min, (int, float)):
            raise ValueError(f"draft_p_min must be a number in [0, 1], not {self.draft_p_min!r}")
        if not 0.0 <= float(self.draft_p_min) <= 1.0:
            raise ValueError(f"draft_p_min must be in [0, 1], not {self.draft_p_min}")
        self.draft_p_min = float(self.draft_p_min)
        if isinstance(self.draft_n_gpu_layers, str):
            if self.draft_n_gpu_layers not in _GPU_LAYER_WORDS:
                raise ValueError(f"draft_n_gpu_layers must be an integer >= -1, 'all' or 'auto', "
                                 f"not {self.draft_n_gpu_layers!r}")
        else:
            _check_int("draft_n_gpu_layers", self.draft_n_gpu_layers, -1)
        if self.draft_split_mode is not None:
            self.draft_split_mode = split_mode_value("draft_split_mode", self.draft_split_mode)
        if self.draft_main_gpu is not None:
            _check_int("draft_main_gpu", self.draft_main_gpu, -1)
        if self.rollback not in ROLLBACK_MODES:
            raise ValueError(f"rollback must be one of {', '.join(ROLLBACK_MODES)}, not {self.rollback!r}")
        if self.draft_n_threads is not None:
            _check_int("draft_n_threads", self.draft_n_threads, 1)
        for name in ("ngram_size_n", "ngram_size_m", "ngram_min_hits"):
            value = getattr(self, name)
            if value is None:
                continue
            _check_int(name, value, 1, _U16_MAX)
            if not any(t in _NGRAM_MAP_TYPES for t in self.spec_types):
                raise ValueError(f"{name} applies to {', '.join(_NGRAM_MAP_TYPES)}, and spec_type "
                                 f"{','.join(self.spec_types) or 'none'} has none of them")

    def _resolve_aliases(self) -> None:
        """draft_model_path -> draft_model, draft_backend_sampling -> backend_sampling; each pair
        holds one value afterwards."""
        model = _path_or_none("draft_model", self.draft_model)
        alias = _path_or_none("draft_model_path", self.draft_model_path)
        if model is not None and alias is not None and os.path.normpath(model) != os.path.normpath(alias):
            raise ValueError(f"draft_model ({model!r}) and draft_model_path ({alias!r}) name different files; "
                             "give one of them")
        self.draft_model = self.draft_model_path = model if model is not None else alias

        for name in ("backend_sampling", "draft_backend_sampling"):
            value = getattr(self, name)
            if not (value is None and name == "draft_backend_sampling") and \
                    not isinstance(value, bool) and value != "auto":
                raise ValueError(f"{name} must be True, False or 'auto', not {value!r}")
        if self.draft_backend_sampling is not None:
            if self.backend_sampling != "auto" and self.backend_sampling != self.draft_backend_sampling:
                raise ValueError(f"backend_sampling ({self.backend_sampling!r}) and draft_backend_sampling "
                                 f"({self.draft_backend_sampling!r}) differ; give one of them")
            self.backend_sampling = self.draft_backend_sampling
        self.draft_backend_sampling = self.backend_sampling

    def _resolve_spec_types(self) -> tuple[str, ...]:
        """`spec_type` as canonical names in priority order; may set `algorithm` from a draft type."""
        if self.spec_type is None:
            return (self._default_draft_type(),)
        names = _spec_type_names(self.spec_type)
        if "none" in names:
            if any(n != "none" for n in names):
                raise ValueError(f"spec_type 'none' cannot be combined with other types "
                                 f"({', '.join(n for n in dict.fromkeys(names) if n != 'none')})")
            return ()
        unique = sorted(set(names), key=_PRIORITY.index)
        drafts = [n for n in unique if n in DRAFT_SPEC_TYPES]
        if len(drafts) > 1:
            raise ValueError(f"spec_type names {len(drafts)} draft types ({', '.join(drafts)}); "
                             "there is one draft model, give one of them")
        models = drafts + [n for n in unique if n == MTP_SPEC_TYPE]
        if "auto" in unique and len(unique) - len(models) > 1:
            raise ValueError(f"spec_type 'auto' picks among the lookup, the draft models and no draft by itself: "
                             f"give it alone or with draft-mtp and one draft type, not with "
                             f"{', '.join(n for n in unique if n != 'auto' and n not in models)}")
        if drafts:
            draft = drafts[0]
            wanted = _DRAFT_ALGORITHM.get(draft)
            if wanted is not None:
                given = "dflash" if self.algorithm == "dflash2" else self.algorithm
                if given == "auto":
                    self.algorithm = wanted
                elif given != wanted:
                    raise ValueError(f"spec_type {draft} and algorithm {self.algorithm!r} disagree "
                                     f"(spec_type {draft} means algorithm '{wanted}')")
            else:  # "draft": named after the algorithm where that is known
                unique[unique.index(draft)] = self._default_draft_type()
        elif "auto" in unique and self.draft_model is not None:
            # auto with a draft model: the draft's block is one of its choices
            unique.append(self._default_draft_type())
        elif self.algorithm != "auto":
            raise ValueError(f"algorithm {self.algorithm!r} names a draft algorithm but spec_type "
                             f"{','.join(unique)} has no draft type")
        return tuple(unique)

    def _default_draft_type(self) -> str:
        if self.algorithm in ("dflash", "dflash2"):
            return "draft-dflash"
        if self.algorithm in ("dspark", "eagle3", "simple"):
            return {"dspark": "draft-dspark", "eagle3": "draft-eagle3", "simple": "draft-simple"}[self.algorithm]
        return GENERIC_DRAFT


@dataclass
class TargetConfig:
    """How to load the target model and size its context."""

    model: str
    n_ctx: int = 2048
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: Optional[int] = None
    n_gpu_layers: int = -1
    seed: int = 0
    verbose: bool = False
    repack: Optional[bool] = None  # llama.cpp CPU weight repacking; None: off on AMX CPUs (crashes there)
    flash_attn: str = "auto"  # "auto" (llama.cpp's default), "on" or "off"

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, os.PathLike)) or not os.fspath(self.model):
            raise ValueError(f"model must be a path to a target GGUF, not {self.model!r}")
        self.model = os.fspath(self.model)
        _check_int("n_ctx", self.n_ctx, 16)
        _check_int("n_batch", self.n_batch, 1)
        _check_int("n_ubatch", self.n_ubatch, 1)
        if self.n_ubatch > self.n_batch:
            raise ValueError(f"n_ubatch ({self.n_ubatch}) must not exceed n_batch ({self.n_batch})")
        if self.n_threads is not None:
            _check_int("n_threads", self.n_threads, 1)
        _check_int("n_gpu_layers", self.n_gpu_layers, -1)
        if self.flash_attn not in FLASH_ATTN_MODES:
            raise ValueError(f"flash_attn must be one of {', '.join(FLASH_ATTN_MODES)}, not {self.flash_attn!r}")
