"""A Hugging Face target directory rebuilt from a target GGUF's tokenizer.

llama.cpp's `convert_hf_to_gguf.py` takes a DFlash draft's vocabulary from `--target-model-dir`:
it reads that directory's `config.json` for the architecture and then runs that architecture's own
vocabulary code on the directory's tokenizer files.  Users who only have the GGUF can rebuild it
here: `config.json` plus `tokenizer.model` (SentencePiece vocabularies, GGUF `tokenizer.ggml.model`
"llama").  Other tokenizer families are refused with a clear message.
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


def write_target_dir(target_gguf: str, out_dir: str) -> str:
    """Write `config.json` and the tokenizer of `target_gguf` into `out_dir` for `--target-model-dir`."""
    from ..inspect import read_gguf

    info = read_gguf(target_gguf)
    model = info.get("tokenizer.ggml.model")
    if model != "llama":
        raise ValueError(f"{target_gguf}: tokenizer model {model!r} cannot be rebuilt as a Hugging Face tokenizer "
                         "(only SentencePiece 'llama' vocabularies are supported); pass the target's own HF directory")
    arch = _HF_ARCH.get(info.architecture, "LlamaForCausalLM")
    tokens = list(info.get("tokenizer.ggml.tokens"))
    n = len(tokens)
    scores = list(info.get("tokenizer.ggml.scores") or [0.0] * n)
    types = list(info.get("tokenizer.ggml.token_type") or [1] * n)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.model"), "wb") as f:
        f.write(_spm_model(tokens, scores, types))
    cfg = {"architectures": [arch], "model_type": "llama", "vocab_size": n}
    for key, gkey in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")):
        if isinstance(info.get(gkey), int):
            cfg[key] = int(info.get(gkey))
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    return out_dir
