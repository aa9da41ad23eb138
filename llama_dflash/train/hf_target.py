"""A Hugging Face target directory rebuilt from a target GGUF's tokenizer.

llama.cpp's `convert_hf_to_gguf.py` takes a DFlash draft's vocabulary from `--target-model-dir`:
it reads that directory's `config.json` for the architecture and then runs that architecture's own
vocabulary code on the directory's tokenizer files.  Users who only have the GGUF can rebuild it
here: `config.json` plus `tokenizer.model` (SentencePiece vocabularies, GGUF `tokenizer.ggml.model`
"llama") or `tokenizer.json` (byte-level BPE, "gpt2", with the pre-tokenizer of the GGUF's
`tokenizer.ggml.pre` where it is known here).  Other tokenizer families are refused clearly.
"""

from __future__ import annotations

import json
import os

__all__ = ["write_target_dir"]

# GGUF general.architecture -> a Hugging Face architecture whose converter class reads SPM vocabularies
_HF_ARCH = {"llama": "LlamaForCausalLM"}


def _spm_model(tokens: list[str], scores: list[float], types: list[int]) -> bytes:
    """A SentencePiece ModelProto holding exactly these pieces, scores and types (ids preserved)."""
    from gguf import TokenType
    from sentencepiece import sentencepiece_model_pb2 as pb

    kind = {int(TokenType.NORMAL): pb.ModelProto.SentencePiece.NORMAL,
            int(TokenType.UNKNOWN): pb.ModelProto.SentencePiece.UNKNOWN,
            int(TokenType.CONTROL): pb.ModelProto.SentencePiece.CONTROL,
            int(TokenType.USER_DEFINED): pb.ModelProto.SentencePiece.USER_DEFINED,
            int(TokenType.UNUSED): pb.ModelProto.SentencePiece.UNUSED,
            int(TokenType.BYTE): pb.ModelProto.SentencePiece.BYTE}
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.vocab_size = len(tokens)
    m.trainer_spec.byte_fallback = any(int(t) == int(TokenType.BYTE) for t in types)
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = True
    for text, score, t in zip(tokens, scores, types):
        if int(t) not in kind:
            raise ValueError(f"token {text!r} has GGUF token type {t}, which SentencePiece cannot hold")
        m.pieces.add(piece=text, score=float(score), type=kind[int(t)])
    return m.SerializeToString()


# GGUF tokenizer.ggml.pre -> the Hugging Face pre-tokenizers in front of the byte-level split
_BPE_PRE = {"default": [], "gpt-2": [], "smollm": [{"type": "Digits", "individual_digits": True}]}


def _tokenizer_fields(path: str) -> dict:
    """Every `tokenizer.*` key of a GGUF, long arrays included (read_gguf skips merges and scores)."""
    from gguf import GGUFReader

    reader = GGUFReader(path, "r")
    return {name: f.contents() for name, f in reader.fields.items() if name.startswith("tokenizer.")}


def _bpe_tokenizer(path: str, info: dict) -> tuple[dict, dict]:
    """(tokenizer.json, tokenizer_config.json) of a byte-level BPE vocabulary with its merges."""
    pre = info.get("tokenizer.ggml.pre", "default")
    if pre not in _BPE_PRE:
        raise ValueError(f"{path}: BPE pre-tokenizer {pre!r} cannot be rebuilt here "
                         f"(known: {', '.join(sorted(_BPE_PRE))}); pass the target's own HF directory")
    tokens = list(info.get("tokenizer.ggml.tokens"))
    types = list(info.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = list(info.get("tokenizer.ggml.merges") or [])
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": int(k) == 3} for i, (t, k) in enumerate(zip(tokens, types)) if int(k) in (3, 4)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [*_BPE_PRE[pre], byte_level]},
        "post_processor": None, "decoder": dict(byte_level),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }
    cfg: dict = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 30}
    for name in ("bos", "eos", "unknown", "padding"):
        tid = info.get(f"tokenizer.ggml.{name}_token_id")
        if isinstance(tid, int) and 0 <= tid < len(tokens):
            cfg[{"unknown": "unk", "padding": "pad"}.get(name, name) + "_token"] = tokens[tid]
    return tok, cfg


def write_target_dir(target_gguf: str, out_dir: str) -> str:
    """Write `config.json` (architecture, vocabulary size, and the shape keys the converter reads
    for an EAGLE-3 draft: hidden size, layer count...) and the tokenizer of `target_gguf` into
    `out_dir` for `--target-model-dir`."""
    from ..inspect import read_gguf

    ginfo = read_gguf(target_gguf)
    arch = _HF_ARCH.get(ginfo.architecture, "LlamaForCausalLM")
    info = _tokenizer_fields(target_gguf)
    model = info.get("tokenizer.ggml.model")
    if model not in ("llama", "gpt2"):
        raise ValueError(f"{target_gguf}: tokenizer model {model!r} cannot be rebuilt as a Hugging Face tokenizer "
                         "(SentencePiece 'llama' and byte-level BPE 'gpt2' can); pass the target's own HF directory")
    tokens = list(info.get("tokenizer.ggml.tokens"))
    n = len(tokens)
    os.makedirs(out_dir, exist_ok=True)
    # whether the tokenizer adds BOS / EOS: llama.cpp compares them between a target and a draft-simple model
    flags = {key: bool(info.get(f"tokenizer.ggml.{key}")) for key in ("add_bos_token", "add_eos_token")
             if isinstance(info.get(f"tokenizer.ggml.{key}"), bool)}
    if model == "llama":
        scores = list(info.get("tokenizer.ggml.scores") or [0.0] * n)
        types = list(info.get("tokenizer.ggml.token_type") or [1] * n)
        with open(os.path.join(out_dir, "tokenizer.model"), "wb") as f:
            f.write(_spm_model(tokens, scores, types))
        files = [("tokenizer_config.json", flags)] if flags else []
    else:
        tok, tok_cfg = _bpe_tokenizer(target_gguf, info)
        files = [("tokenizer.json", tok), ("tokenizer_config.json", {**tok_cfg, **flags})]
    for name, obj in files:
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False)
    cfg = {"architectures": [arch], "model_type": "llama", "vocab_size": n}
    # the shape keys an EAGLE-3 conversion reads from the target (its default target layers, its hidden size)
    g = ginfo.architecture
    for key, gkey in (("hidden_size", "embedding_length"), ("num_hidden_layers", "block_count"),
                      ("intermediate_size", "feed_forward_length"), ("num_attention_heads", "attention.head_count"),
                      ("num_key_value_heads", "attention.head_count_kv"), ("max_position_embeddings", "context_length")):
        v = ginfo.get(f"{g}.{gkey}")
        if isinstance(v, int) and not isinstance(v, bool):
            cfg[key] = int(v)
    for key, gkey in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")):
        if isinstance(info.get(gkey), int):
            cfg[key] = int(info.get(gkey))
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    return out_dir
