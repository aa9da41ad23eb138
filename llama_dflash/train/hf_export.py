"""A draft GGUF in the Hugging Face layout of the z-lab DFlash / DSpark checkpoints (`config.json` +
`model.safetensors`), the layout serving engines (vLLM, SGLang) load and llama.cpp's
`convert_hf_to_gguf.py` (conversion/qwen.py DFlashModel / DSparkModel) converts back.

Conventions of that layout: Qwen3-style hyper-parameters, `dflash_config.target_layer_ids` are the
target's hidden-state indices (GGUF `dflash.target_layers` minus 1), a reduced vocabulary is
`draft_vocab_size` + `d2t` stored as offsets (target id minus draft row) + `lm_head.weight`; the
converter reads `d2t` only for DSpark-family architectures, so a reduced-vocabulary DFlash draft is
written as `DSparkDraftModel` without Markov head (llama.cpp then runs it as DFlash).
Weights are written as float32; numpy only (the safetensors format is written directly).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Mapping

import numpy as np

__all__ = ["hf_tensor_name", "export_hf", "write_safetensors", "read_safetensors"]

# `eagle3` drafts and plain llama drafts (`draft-simple`): their layouts are in hf_ar.py

_LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GLOBAL = {
    "fc.weight": "model.fc.weight", "enc.output_norm.weight": "model.hidden_norm.weight",
    "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight",
    "token_embd.weight": "model.embed_tokens.weight", "markov_w1.weight": "model.markov_head.markov_w1.weight",
    "markov_w2.weight": "model.markov_head.markov_w2.weight", "conf_proj.weight": "model.confidence_head.proj.weight",
    "conf_proj.bias": "model.confidence_head.proj.bias", "d2t": "d2t",
    # DFlash2 selector: the converter appends ".weight" to the two codebooks itself
    "selector_predecessor.weight": "model.candidate_selector.predecessor_codebook",
    "selector_successor.weight": "model.candidate_selector.successor_codebook",
    "selector_hidden.weight": "model.candidate_selector.hidden_projection.weight",
}
# DFlash2 per-layer convolutions: GGUF blk.{i}.<key>[.weight] -> model.layers.{i}.<value>[.weight]
_CONV = {"attn_conv_base": "attention_conv.base_kernel", "attn_conv_proj": "attention_conv.kernel_projection",
         "ffn_conv_base": "mlp_conv.base_kernel", "ffn_conv_proj": "mlp_conv.kernel_projection"}
# dflash_config fields of a DFlash2 checkpoint <- GGUF keys
_DFLASH2_KEYS = {"conv_kernel_size": "dflash.conv_kernel_size", "conv_group_size": "dflash.conv_group_size",
                 "selector_rank": "dflash.selector_rank", "selector_top_k": "dflash.selector_top_k"}
_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64",
           np.dtype(np.bool_): "BOOL"}


def hf_tensor_name(gguf_name: str) -> str:
    """The Hugging Face name of a draft GGUF tensor."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER:
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{parts[3]}"
    if len(parts) in (3, 4) and parts[0] == "blk" and parts[2] in _CONV:
        return ".".join([f"model.layers.{parts[1]}.{_CONV[parts[2]]}", *parts[3:]])
    raise ValueError(f"draft tensor {gguf_name} has no Hugging Face counterpart (DeepSeek-style drafts are not supported)")


def write_safetensors(path: str, tensors: Mapping[str, np.ndarray]) -> None:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    arrays = []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        if arr.dtype not in _DTYPES:
            raise ValueError(f"{name}: dtype {arr.dtype} cannot be written")
        header[name] = {"dtype": _DTYPES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
        arrays.append(arr)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for arr in arrays:
            f.write(arr.tobytes())


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    inv = {v: k for k, v in _DTYPES.items()}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=inv[h["dtype"]]).reshape(h["shape"])
    return out


def export_hf(draft_path: str, out_dir: str) -> dict:
    """Write `config.json` and `model.safetensors` for a draft GGUF (DFlash/DSpark, EAGLE-3, or a
    plain llama for draft-simple, which also gets its tokenizer); returns the config."""
    from ..inspect import read_gguf
    from .draftfile import read_draft_tensors

    info = read_gguf(draft_path)
    if info.architecture in ("eagle3", "llama"):
        from .hf_ar import export_hf_eagle3, export_hf_llama

        return (export_hf_eagle3 if info.architecture == "eagle3" else export_hf_llama)(draft_path, out_dir)
    if info.architecture != "dflash":
        raise ValueError(f"{draft_path} is not a DFlash/DSpark/EAGLE-3/llama draft (architecture {info.architecture})")
    tensors = read_draft_tensors(draft_path)
    names = {k: hf_tensor_name(k) for k in tensors}  # refuses unknown tensors before writing anything
    meta = info.get
    n_head = int(meta("dflash.attention.head_count"))
    n_embd = info.n_embd
    layers = meta("dflash.target_layers")
    if not isinstance(layers, (list, tuple)) or not layers:
        raise ValueError(f"{draft_path}: no dflash.target_layers")
    dspark = "markov_w1.weight" in tensors
    reduced = "d2t" in tensors
    dflash2 = "selector_hidden.weight" in tensors
    if dflash2 and (dspark or reduced):
        raise ValueError(f"{draft_path}: a DFlash2 draft with a Markov head or a reduced vocabulary has no "
                         "Hugging Face layout the converter reads")
    block = int(meta("dflash.block_size", 16))
    cfg: dict = {
        "architectures": ["DSparkDraftModel" if dspark or reduced else
                          "DFlash2DraftModel" if dflash2 else "DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": n_embd,
        "intermediate_size": int(meta("dflash.feed_forward_length")),
        "num_hidden_layers": info.n_layer,
        "num_attention_heads": n_head,
        "num_key_value_heads": int(meta("dflash.attention.head_count_kv", n_head)),
        "head_dim": int(meta("dflash.attention.key_length", n_embd // n_head)),
        "rms_norm_eps": float(meta("dflash.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta("dflash.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta("dflash.context_length", 8192)),
        "vocab_size": info.n_vocab,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "block_size": block,
        "dflash_config": {
            "mask_token_id": int(meta("tokenizer.ggml.mask_token_id")),
            "target_layer_ids": [int(x) - 1 for x in layers],
            "block_size": block,
        },
    }
    if dflash2:
        for field, key in _DFLASH2_KEYS.items():
            if meta(key) is None:
                raise ValueError(f"{draft_path}: DFlash2 draft without {key}")
            cfg["dflash_config"][field] = int(meta(key))
    if meta("dflash.attention.causal") is not None:
        cfg["is_causal"] = bool(meta("dflash.attention.causal"))
    if dspark or reduced:
        # a plain DFlash draft (written here as DSpark for its d2t) samples from the anchor too
        cfg["sample_from_anchor"] = bool(meta("dflash.sample_from_anchor", True))
        cfg["markov_head_type"] = "vanilla"
    if dspark:
        cfg["markov_rank"] = int(tensors["markov_w1.weight"].shape[1])
    out: dict[str, np.ndarray] = {}
    for k, arr in tensors.items():
        if k == "d2t":
            arr = arr - np.arange(len(arr), dtype=np.int64)  # the layout stores offsets
            cfg["draft_vocab_size"] = int(len(arr))
        out[names[k]] = arr
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), out)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    return cfg
