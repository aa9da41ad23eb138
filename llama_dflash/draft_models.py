"""Which kind of draft model a file is, and whether it can drive its target -- checked in Python
before llama.cpp sees either file.

Three kinds of draft files exist (llama.cpp's `--spec-type` names):

* ``draft-dflash`` / ``draft-dspark``: architecture ``dflash`` (`inspect.validate_pair`);
* ``draft-eagle3``: architecture ``eagle3``, an EAGLE-3 head (`validate_eagle3_pair`): one decoder
  layer fed the target's token embedding and a projection (``fc``) of three of the target's layer
  inputs; it borrows the target's embeddings and LM head through ``ctx_other`` where it has none;
* ``draft-simple``: any ordinary language model with the target's vocabulary
  (`validate_simple_pair`, then `check_vocab_compatible` on the loaded models: llama.cpp's rule).

`resolve_draft` picks the check from the requested algorithm, or from the file's architecture
when none was requested (a ``dflash`` or ``eagle3`` file is unambiguous; any other architecture
must be asked for as ``draft-simple``, so that a target passed as a draft by mistake is refused).

Where llama.cpp aborts the process on an EAGLE-3 file (a decoder that is not exactly one layer,
key and value heads of different sizes, a head's width differing from the target's where the
draft borrows the target's tensors, an integer-typed d2t it asserts on), the error comes here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Union

from .errors import GGUFFileError, IncompatibleModelError
from .inspect import (DraftInfo, GGUFInfo, _check_d2t, _check_float_weights, _check_shape, _check_vocab,
                      _entry, _layer_counts, check_gguf, check_target_file, get_bool, get_float, get_int, get_int_list,
                      get_per_layer, get_str, read_gguf, validate_pair, validate_target)

__all__ = ["Eagle3Info", "SimpleDraftInfo", "AnyDraftInfo", "draft_label", "resolve_draft", "validate_draft_files",
           "guess_algorithm", "draft_summary", "check_vocab_files", "validate_eagle3_pair",
           "validate_simple_pair", "check_vocab_compatible", "EAGLE3_N_LAYERS", "VOCAB_MAX_SIZE_DIFFERENCE",
           "VOCAB_CHECK_START"]

#: the eagle3 graph asserts a single decoder layer
EAGLE3_N_LAYERS = 1
#: llama.cpp's draft vocabulary rule (common/speculative.cpp): sizes within 128 tokens, and the
#: token texts equal from id 5 on
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START = 5
_U32_MAX = 2**32 - 1
_DRAFT_ARCHS = ("dflash", "eagle3")


@dataclass(frozen=True)
class Eagle3Info:
    """A validated EAGLE-3 head: what `proposers.eagle3.Eagle3Proposer` needs."""

    gguf: GGUFInfo
    target_layers: tuple[int, ...]  # inputs of these target layers, concatenated, feed `fc`
    n_embd: int  # the decoder's width
    target_hidden_size: int
    has_token_embd: bool
    has_output: bool
    reduced_vocab: Optional[int]  # rows of d2t, None for a full-vocabulary head
    norm_before_fc: bool
    norm_before_residual: bool

    algorithm = "eagle3"
    kind = "draft-eagle3"

    @property
    def path(self) -> str:
        return self.gguf.path


@dataclass(frozen=True)
class SimpleDraftInfo:
    """A file meant as a classic draft model (draft-simple); the vocabulary rule is checked once
    both models are loaded (`check_vocab_compatible`)."""

    gguf: GGUFInfo

    algorithm = "simple"
    kind = "draft-simple"
    target_layers: tuple[int, ...] = ()

    @property
    def path(self) -> str:
        return self.gguf.path


AnyDraftInfo = Union[DraftInfo, Eagle3Info, SimpleDraftInfo]


def draft_label(info: AnyDraftInfo) -> str:
    """What statistics call a draft model drafting alone: a DFlash-family draft its algorithm
    ("dflash", "dspark"), the others their type ("draft-eagle3", "draft-simple")."""
    return info.algorithm if isinstance(info, DraftInfo) else info.kind


def guess_algorithm(path: "str | os.PathLike[str]") -> str:
    """How to read a draft file given without a type (tables, `doctor`): by its own architecture
    (dflash, eagle3: "auto"), else as a classic draft model ("simple"); an unreadable file is left
    to `resolve_draft` to refuse ("auto")."""
    try:
        arch = get_str(read_gguf(path), "general.architecture", "")
    except (IncompatibleModelError, GGUFFileError):
        return "auto"
    return "auto" if arch in (*_DRAFT_ARCHS, "") else "simple"


def draft_summary(info: AnyDraftInfo) -> str:
    """One line on what a validated draft is (`doctor`'s check line)."""
    if isinstance(info, Eagle3Info):
        vocab = f", a draft vocabulary of {info.reduced_vocab} (d2t)" if info.reduced_vocab else ""
        return (f"an EAGLE-3 head for this target (draft-eagle3): reads target layers {list(info.target_layers)}"
                f"{vocab}")
    if isinstance(info, SimpleDraftInfo):
        g = info.gguf
        return (f"a classic draft model for this target (draft-simple): {g.architecture}, {g.n_layer} layers, "
                f"n_embd {g.n_embd} (its vocabulary is checked against the target's when both are loaded)")
    return (f"a {info.algorithm}{'2' if info.is_dflash2 else ''} draft for this target: block {info.block_size}, up to "
            f"{info.max_draft_tokens} draft tokens a step, reads target layers {list(info.target_layers)}"
            + (f", reduced vocabulary of {info.reduced_vocab}" if info.reduced_vocab else ""))


def validate_draft_files(target_path: "str | os.PathLike[str]", draft_path: "str | os.PathLike[str]",
                         algorithm: str = "auto") -> tuple[GGUFInfo, AnyDraftInfo]:
    """Both files checked before either reaches llama.cpp: the target as a model of its own, the
    draft against it (`resolve_draft`)."""
    target = check_target_file(target_path)
    return target, resolve_draft(target, draft_path, algorithm)


def resolve_draft(target: GGUFInfo, draft_path: "str | os.PathLike[str]", algorithm: str = "auto") -> AnyDraftInfo:
    """The draft file checked against its target for `algorithm` ("auto": by the file's
    architecture; "dflash", "dspark", "dflash2", "eagle3" or "simple")."""
    draft = read_gguf(draft_path)
    arch = get_str(draft, "general.architecture", "")
    if algorithm == "auto":
        if arch == "eagle3":
            algorithm = "eagle3"
        elif arch != "dflash":
            raise IncompatibleModelError(
                draft.path, "general.architecture", arch or None,
                "'dflash' (a DFlash/DSpark draft) or 'eagle3' (an EAGLE-3 head); a classic draft model of "
                "another architecture drafts as spec_type draft-simple (--spec-type draft-simple)")
    if algorithm == "eagle3":
        return validate_eagle3_pair(target, draft)
    if algorithm == "simple":
        return validate_simple_pair(target, draft)
    return validate_pair(target, draft, algorithm)


# ---- EAGLE-3 ---------------------------------------------------------------------------------------

def validate_eagle3_pair(target: GGUFInfo, draft: GGUFInfo) -> Eagle3Info:
    """Check an EAGLE-3 head (architecture eagle3) against its target (see the module docstring)."""
    validate_target(target)  # it reads the target's layer inputs
    arch = get_str(draft, "general.architecture", "")
    if arch != "eagle3":
        raise IncompatibleModelError(draft.path, "general.architecture", arch or None,
                                     "'eagle3' (an EAGLE-3 head, as llama.cpp's convert_hf_to_gguf.py writes it)")
    for key in ("eagle3.context_length", "eagle3.embedding_length", "eagle3.block_count",
                "eagle3.attention.head_count", "eagle3.attention.layer_norm_rms_epsilon"):
        if _entry(draft, key) is None:
            raise IncompatibleModelError(draft.path, key, None, "present (required by the eagle3 architecture)")
    n_layer, _ = _layer_counts(draft)
    if n_layer != EAGLE3_N_LAYERS:
        raise IncompatibleModelError(draft.path, "eagle3.block_count", n_layer,
                                     "1 (an EAGLE-3 head has one decoder layer; llama.cpp aborts otherwise)")
    get_int(draft, "eagle3.context_length", lo=1, hi=_U32_MAX)
    get_float(draft, "eagle3.attention.layer_norm_rms_epsilon", lo=0.0)
    n_embd = get_int(draft, "eagle3.embedding_length", lo=1, hi=1 << 20)

    layers = tuple(get_int_list(draft, "eagle3.target_layers", lo=0, hi=_U32_MAX, max_len=64))
    if len(layers) != 3:
        raise IncompatibleModelError(draft.path, "eagle3.target_layers", list(layers),
                                     "exactly 3 target layer ids (low, middle, high)")
    t_layers, t_nextn = _layer_counts(target)
    usable = t_layers - t_nextn
    if any(lid >= usable for lid in layers):
        raise IncompatibleModelError(
            draft.path, "eagle3.target_layers", list(layers),
            f"layer ids within 0..{usable - 1} (the target {target.basename} has {usable} layers; llama.cpp's "
            "driver reads the target's nextn output for an id equal to n_layer, which is not driven here)")
    hidden = get_int(draft, "eagle3.target_hidden_size", lo=1, hi=1 << 20)
    if hidden != target.n_embd:
        raise IncompatibleModelError(draft.path, "eagle3.target_hidden_size", hidden,
                                     f"{target.n_embd} (the embedding length of the target {target.basename})")
    has_token_embd = "token_embd.weight" in draft.tensor_names
    has_output = "output.weight" in draft.tensor_names
    if n_embd != target.n_embd and not (has_token_embd and has_output):
        borrowed = "token embeddings" if not has_token_embd else "LM head"
        raise IncompatibleModelError(
            draft.path, "eagle3.embedding_length", n_embd,
            f"{target.n_embd} (the head has no {borrowed} of its own and uses the target's, "
            f"{target.n_embd} wide)")
    _check_vocab(target, draft)
    d2t_rows = _check_d2t(target, draft) if "d2t" in draft.tensor_names else None
    norm_before_fc = get_bool(draft, "eagle3.norm_before_fc", False)
    norm_before_residual = get_bool(draft, "eagle3.norm_before_residual", False)
    _check_eagle3_shapes(draft, n_embd, 3 * hidden, target.n_vocab, d2t_rows, norm_before_fc)
    return Eagle3Info(draft, layers, n_embd, hidden, has_token_embd, has_output, d2t_rows, norm_before_fc,
                      norm_before_residual)


def _check_eagle3_shapes(draft: GGUFInfo, n_embd: int, n_enc: int, n_vocab: int, d2t_rows: Optional[int],
                         norm_before_fc: bool) -> None:
    """Every tensor llama.cpp's eagle3 loader creates, against the metadata (ggml shape order)."""
    n_head = get_per_layer(draft, "eagle3.attention.head_count", 1, lo=1, hi=1 << 16)[0]
    n_kv = get_per_layer(draft, "eagle3.attention.head_count_kv", 1, 0, lo=1, hi=1 << 16)[0] or n_head
    n_ff = get_per_layer(draft, "eagle3.feed_forward_length", 1, 0, lo=1, hi=1 << 24)[0]
    if n_head % n_kv:
        raise IncompatibleModelError(draft.path, "eagle3.attention.head_count_kv", n_kv,
                                     f"a positive divisor of head_count ({n_head})")
    key_len = get_int(draft, "eagle3.attention.key_length", 0, lo=1, hi=1 << 16)
    val_len = get_int(draft, "eagle3.attention.value_length", 0, lo=1, hi=1 << 16)
    if (not key_len or not val_len) and n_embd % n_head:
        raise IncompatibleModelError(draft.path, "eagle3.attention.head_count", n_head,
                                     f"a divisor of embedding_length ({n_embd})")
    hk, hv = key_len or n_embd // n_head, val_len or n_embd // n_head
    if hk != hv:
        raise IncompatibleModelError(draft.path, "eagle3.attention.value_length", hv,
                                     f"{hk} (the key length: the eagle3 graph asserts equal head sizes)")
    n_rot = get_int(draft, "eagle3.rope.dimension_count", hk, lo=0, hi=hk)
    if n_rot % 2:
        raise IncompatibleModelError(draft.path, "eagle3.rope.dimension_count", n_rot, f"an even number <= {hk}")
    if n_ff == 0:
        raise IncompatibleModelError(draft.path, "eagle3.feed_forward_length", None,
                                     "a positive integer (required by the eagle3 layer's FFN)")
    _check_float_weights(draft)
    _check_shape(draft, "fc.weight", (n_enc, n_embd), f"3 target layers x target_hidden_size = {n_enc} wide")
    if norm_before_fc:
        _check_shape(draft, "enc.output_norm.weight", (n_enc,), "the fused target features (norm_before_fc)")
    _check_shape(draft, "output_norm.weight", (n_embd,), "embedding_length")
    p = "blk.0."
    heads = f"head_count {n_head}, head_count_kv {n_kv}, key_length {hk}"
    for name in ("attn_norm", "attn_norm_2", "ffn_norm"):
        _check_shape(draft, f"{p}{name}.weight", (n_embd,), "embedding_length")
    _check_shape(draft, p + "attn_q.weight", (2 * n_embd, hk * n_head), heads + "; reads token and feature halves")
    _check_shape(draft, p + "attn_k.weight", (2 * n_embd, hk * n_kv), heads + "; reads token and feature halves")
    _check_shape(draft, p + "attn_v.weight", (2 * n_embd, hv * n_kv), heads + "; reads token and feature halves")
    _check_shape(draft, p + "attn_output.weight", (hk * n_head, n_embd), heads)
    ff = f"eagle3.feed_forward_length {n_ff}"
    _check_shape(draft, p + "ffn_gate.weight", (n_embd, n_ff), ff)
    _check_shape(draft, p + "ffn_up.weight", (n_embd, n_ff), ff)
    _check_shape(draft, p + "ffn_down.weight", (n_ff, n_embd), ff)
    _check_shape(draft, "rope_freqs.weight", (n_rot // 2,), "rope.dimension_count / 2", required=False)
    _check_shape(draft, "token_embd.weight", (n_embd, n_vocab), "embedding_length x vocabulary size",
                 required=False)
    rows = d2t_rows if d2t_rows is not None else n_vocab
    _check_shape(draft, "output.weight", (n_embd, rows), "embedding_length x draft vocabulary rows", required=False)


# ---- draft-simple ----------------------------------------------------------------------------------

def validate_simple_pair(target: GGUFInfo, draft: GGUFInfo) -> SimpleDraftInfo:
    """A classic draft model: any language model llama.cpp loads by itself -- not a draft file
    that needs a target to run (dflash, eagle3) -- with a vocabulary (the rest of llama.cpp's
    vocabulary rule needs both models loaded: `check_vocab_compatible`)."""
    check_gguf(draft)
    arch = get_str(draft, "general.architecture", "")
    if arch in _DRAFT_ARCHS:
        raise IncompatibleModelError(
            draft.path, "general.architecture", arch,
            f"a model that runs by itself for draft-simple (an {arch} file is a draft for "
            f"draft-{'eagle3' if arch == 'eagle3' else 'dflash'})")
    if _entry(draft, "tokenizer.ggml.tokens") is None:
        raise IncompatibleModelError(draft.path, "tokenizer.ggml.tokens", None,
                                     "a vocabulary (a draft model proposes token ids of the target's vocabulary)")
    return SimpleDraftInfo(draft)


def check_vocab_files(target_path: str, draft_path: str) -> None:
    """`check_vocab_compatible` on two files, their vocabularies loaded alone (no weights)."""
    from ._llama import Model

    with Model(target_path, n_gpu_layers=0, vocab_only=True) as target, \
            Model(draft_path, n_gpu_layers=0, vocab_only=True) as draft:
        check_vocab_compatible(target.vocab, draft.vocab, draft_path, f"the target {os.path.basename(target_path)}")


def check_vocab_compatible(target_vocab: int, draft_vocab: int, draft_path: str, target_name: str = "the target") -> None:
    """llama.cpp's rule for a draft model's vocabulary (common_speculative_are_compatible), on the
    two loaded vocabularies (llama_vocab pointers): the same type, the same BOS/EOS handling and
    ids, sizes within VOCAB_MAX_SIZE_DIFFERENCE, and the same token texts from id VOCAB_CHECK_START
    on.  IncompatibleModelError names the GGUF field that differs."""
    from llama_cpp import llama_cpp as ll

    t_type, d_type = int(ll.llama_vocab_type(target_vocab)), int(ll.llama_vocab_type(draft_vocab))
    if t_type != d_type:
        names = {0: "none", 1: "llama (SPM)", 2: "gpt2 (BPE)", 3: "bert (WPM)", 4: "t5 (UGM)", 5: "rwkv",
                 6: "plamo2"}
        raise IncompatibleModelError(draft_path, "tokenizer.ggml.model (vocabulary type)", names.get(d_type, d_type),
                                     f"{names.get(t_type, t_type)!r}, the vocabulary type of {target_name}")
    for what, get_add, get_id in (("bos", ll.llama_vocab_get_add_bos, ll.llama_vocab_bos),
                                  ("eos", ll.llama_vocab_get_add_eos, ll.llama_vocab_eos)):
        t_add, d_add = bool(get_add(target_vocab)), bool(get_add(draft_vocab))
        if t_add != d_add:
            raise IncompatibleModelError(draft_path, f"tokenizer.ggml.add_{what}_token", d_add,
                                         f"{t_add} (as {target_name}: the prompts must tokenize alike)")
        if t_add and int(get_id(target_vocab)) != int(get_id(draft_vocab)):
            raise IncompatibleModelError(draft_path, f"tokenizer.ggml.{what}_token_id", int(get_id(draft_vocab)),
                                         f"{int(get_id(target_vocab))} (the {what.upper()} token of {target_name})")
    n_t, n_d = int(ll.llama_vocab_n_tokens(target_vocab)), int(ll.llama_vocab_n_tokens(draft_vocab))
    if abs(n_t - n_d) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise IncompatibleModelError(draft_path, "tokenizer.ggml.tokens (vocabulary size)", n_d,
                                     f"{n_t} +- {VOCAB_MAX_SIZE_DIFFERENCE} (the vocabulary size of {target_name})")
    for i in range(VOCAB_CHECK_START, min(n_t, n_d)):
        a, b = ll.llama_vocab_get_text(target_vocab, i), ll.llama_vocab_get_text(draft_vocab, i)
        if a != b:
            raise IncompatibleModelError(draft_path, f"tokenizer.ggml.tokens[{i}]", b,
                                         f"{a!r} (token {i} of {target_name})")
