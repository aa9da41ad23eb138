"""From a `SpecConfig` to what drafts: its token drafters (n-gram types, our lookup) in chain order,
the chain or `auto` around them, and the draft model of a validated draft file."""

from __future__ import annotations

from typing import Optional, Sequence, Union

from ..config import model_priority
from ..draft_models import Eagle3Info, SimpleDraftInfo
from .auto import AutoProposer
from .base import Proposer, TokenDrafter
from .chain import ChainProposer, ModelMember
from .dflash import DFlashProposer
from .eagle3 import Eagle3Proposer
from .lookup import SuffixLookup
from .ngram import NGRAM_TYPES, make_ngram_drafter
from .simple import DEFAULT_AR_N_MAX, SimpleDraftProposer

MAP_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v")  # the types ngram_size_n/_m/min_hits set

__all__ = ["build_token_drafters", "build_auto_lookup", "build_proposer", "draft_type_name", "build_draft_model",
           "draft_model_ceiling", "order_models", "LOOKUP_N_MAX"]

LOOKUP_N_MAX = 16  # the lookup's longest draft when draft_n_max is "auto", and under `auto`


#: trial weight of a match-length bucket under `auto`: its choice must follow a change of workload
#: within a few dozen steps (bench/speculators.py runs prose after copy-heavy requests: with the
#: lookup's default 256, auto went on drafting copy-heavy confidence into prose, 0.82x ordinary)
AUTO_LOOKUP_WEIGHT = 32.0


def build_auto_lookup() -> SuffixLookup:
    """The lookup `auto` chooses from: it picks the length per step, so n_max is only a ceiling."""
    return SuffixLookup(n_max=LOOKUP_N_MAX, session=True, max_weight=AUTO_LOOKUP_WEIGHT)


def build_token_drafters(spec) -> list[TokenDrafter]:
    """One drafter per token-only type of `spec.spec_types` (already in llama.cpp's priority);
    `auto` is not one (see `build_auto_lookup`)."""
    drafters: list[TokenDrafter] = []
    for name in spec.token_types:
        if name == "auto":
            continue
        if name == "lookup":
            n_max = spec.draft_n_max if isinstance(spec.draft_n_max, int) else LOOKUP_N_MAX
            drafters.append(SuffixLookup(n_max=n_max, session=True))
        elif name in MAP_TYPES:
            drafters.append(make_ngram_drafter(name, size_n=spec.ngram_size_n, size_m=spec.ngram_size_m,
                                               min_hits=spec.ngram_min_hits))
        elif name in NGRAM_TYPES:  # ngram-mod, ngram-cache: llama.cpp's own sizes
            drafters.append(make_ngram_drafter(name))
        else:
            raise ValueError(f"spec_type {name!r} has no token drafter")
    return drafters


def draft_type_name(algorithm: str) -> str:
    """The speculative-type name of a draft model of this algorithm ("draft-dflash", "draft-dspark",
    "draft-eagle3", "draft-simple")."""
    return {"dspark": "draft-dspark", "eagle3": "draft-eagle3", "simple": "draft-simple"}.get(algorithm,
                                                                                           "draft-dflash")


def build_draft_model(info, spec, target, stats) -> Proposer:
    """The proposer of a validated draft file (`draft_models.resolve_draft`): a DFlash/DSpark/
    DFlash2 draft, an EAGLE-3 head or a classic draft model, attached to `target`."""
    if isinstance(info, Eagle3Info):
        return Eagle3Proposer(info, spec, target, stats)
    if isinstance(info, SimpleDraftInfo):
        return SimpleDraftProposer(info, spec, target, stats)
    return DFlashProposer(info, spec, target, stats)


def draft_model_ceiling(info) -> int:
    """The longest draft of a draft file's model under draft_n_max "auto": a DFlash block's
    yield, an autoregressive draft's default length."""
    limit = getattr(info, "max_draft_tokens", None)
    return int(limit) if limit is not None else DEFAULT_AR_N_MAX


def order_models(models: Sequence[tuple[str, Proposer]]) -> list[tuple[str, Proposer]]:
    """`(name, model)` pairs in llama.cpp's priority (draft-simple, draft-eagle3, draft-mtp,
    draft-dflash, draft-dspark): the order a chain asks them in."""
    return sorted(models, key=lambda pair: model_priority(pair[0]))


def build_proposer(spec, model: Union[None, Proposer, Sequence[tuple[str, Proposer]]],
                   model_name: str = "draft-dflash", *,
                   drafters: Optional[Sequence[TokenDrafter]] = None) -> Proposer:
    """What drafts for `spec`: `auto` over the lookup and the models, a chain of the token drafters
    (and the models last), or a model alone.  `model`: one model named `model_name`, or
    `(name, model)` pairs in llama.cpp's priority (the MTP head before a draft model).  The
    models stay owned by the caller."""
    if model is None:
        models: list[tuple[str, Proposer]] = []
    elif isinstance(model, (list, tuple)):
        models = list(model)
    else:
        models = [(model_name, model)]  # type: ignore[list-item]
    if "auto" in spec.spec_types:
        return AutoProposer(build_auto_lookup(), models)
    drafters = list(drafters) if drafters is not None else build_token_drafters(spec)
    if drafters or len(models) > 1:
        return ChainProposer(drafters, [ModelMember(p, name) for name, p in models])
    if not models:
        raise ValueError(f"spec_type {','.join(spec.spec_types) or 'none'} selects no drafter")
    return models[0][1]
