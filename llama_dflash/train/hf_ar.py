"""The Hugging Face layouts of the autoregressive drafts, which serving engines load and llama.cpp's
`convert_hf_to_gguf.py` converts back (conversion/llama.py):

* EAGLE-3 (`LlamaForCausalLMEagle3`, the layout of the published EAGLE-3 heads that vLLM and SGLang
  read): `fc.weight`, the decoder layer as `midlayer.*` (`hidden_norm` for g's norm,
  `input_layernorm` for the token embedding's), `norm.weight`, `lm_head.weight` over
  `draft_vocab_size` rows, `d2t` (target id minus draft row, int64) and `t2d` (bool over the
  target vocabulary); config keys `draft_vocab_size` (which the converter detects EAGLE-3 by,
  with one hidden layer), `target_hidden_size`, `eagle_aux_hidden_state_layer_ids` (the GGUF's
  `eagle3.target_layers` unchanged: both are "input of layer i"), `norm_before_residual`.
* a plain llama (`LlamaForCausalLM`) for draft-simple, with the tokenizer files in the same
  directory (a llama checkpoint carries its own vocabulary).

Both store q/k rows in Hugging Face's rotate-half order: the converter permutes them into the
adjacent-pair order llama.cpp's "normal" rope reads, so the GGUF rows are put back here first.
"""

from __future__ import annotations

import json
import os

import numpy as np

from .hf_export import write_safetensors

__all__ = ["export_hf_eagle3", "export_hf_llama", "to_hf_rope_order"]

_LAYER = {
    "attn_norm": "input_layernorm", "attn_norm_2": "hidden_norm", "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def to_hf_rope_order(w: np.ndarray, n_head: int) -> np.ndarray:
    """GGUF q/k rows (per head: pairs (0, d/2), (1, d/2+1), ... interleaved) -> Hugging Face's
    rotate-half order; the inverse of the converter's `LlamaModel.permute`."""
    rows, cols = w.shape
    d = rows // n_head
    return np.ascontiguousarray(w.reshape(n_head, d // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols))


def _layer_tensors(tensors: dict, prefix: str, n_head: int, n_head_kv: int) -> dict[str, np.ndarray]:
    out = {}
    for name, arr in tensors.items():
        parts = name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _LAYER:
            continue
        if parts[2] == "attn_q":
            arr = to_hf_rope_order(arr, n_head)
        elif parts[2] == "attn_k":
            arr = to_hf_rope_order(arr, n_head_kv)
        out[prefix.format(i=parts[1]) + _LAYER[parts[2]] + "." + parts[3]] = np.ascontiguousarray(arr, dtype=np.float32)
    return out


def _common_config(info, arch: str) -> dict:
    meta = info.get
    n_head = int(meta(f"{arch}.attention.head_count"))
    n_embd = info.n_embd
    cfg = {
        "model_type": "llama",
        "hidden_size": n_embd,
        "intermediate_size": int(meta(f"{arch}.feed_forward_length")),
        "num_hidden_layers": info.n_layer,
        "num_attention_heads": n_head,
        "num_key_value_heads": int(meta(f"{arch}.attention.head_count_kv", n_head)),
        "head_dim": int(meta(f"{arch}.attention.key_length", n_embd // n_head)),
        "rms_norm_eps": float(meta(f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta(f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta(f"{arch}.context_length", 2048)),
        "vocab_size": info.n_vocab,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }
    for key, gkey in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")):
        if isinstance(meta(gkey), int):
            cfg[key] = int(meta(gkey))
    return cfg


def _write(out_dir: str, cfg: dict, tensors: dict[str, np.ndarray]) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    return cfg


def export_hf_eagle3(draft_path: str, out_dir: str) -> dict:
    """`config.json` + `model.safetensors` of an `eagle3` draft GGUF in the EAGLE-3 layout."""
    from ..inspect import read_gguf
    from .draftfile import read_draft_tensors

    info = read_gguf(draft_path)
    if info.architecture != "eagle3":
        raise ValueError(f"{draft_path} is not an EAGLE-3 draft (architecture {info.architecture})")
    tensors = read_draft_tensors(draft_path)
    known = {"fc.weight", "enc.output_norm.weight", "output_norm.weight", "output.weight", "token_embd.weight", "d2t"}
    extra = sorted(n for n in tensors if n not in known and not (n.startswith("blk.0.") and n.split(".")[2] in _LAYER))
    if extra:
        raise ValueError(f"{draft_path}: tensor {extra[0]} has no place in the EAGLE-3 layout")
    if "output.weight" not in tensors:
        raise ValueError(f"{draft_path}: no output.weight: the EAGLE-3 layout needs the head's own lm_head")
    cfg = _common_config(info, "eagle3")
    layers = [int(x) for x in info.get("eagle3.target_layers") or []]
    n_draft = int(tensors["output.weight"].shape[0])
    cfg.update({
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": n_draft,
        "target_hidden_size": int(info.get("eagle3.target_hidden_size", info.n_embd)),
        "tie_word_embeddings": False,
        "norm_before_residual": bool(info.get("eagle3.norm_before_residual", False)),
        "norm_before_fc": bool(info.get("eagle3.norm_before_fc", False)),
        "eagle_aux_hidden_state_layer_ids": layers,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers, "use_aux_hidden_state": True,
                         "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True, "use_mtp": False},
    })
    out = {"fc.weight": tensors["fc.weight"]}
    if "enc.output_norm.weight" in tensors:
        out["input_norm.weight"] = tensors["enc.output_norm.weight"]
    out.update(_layer_tensors(tensors, "midlayer.", cfg["num_attention_heads"], cfg["num_key_value_heads"]))
    out["norm.weight"] = tensors["output_norm.weight"]
    out["lm_head.weight"] = tensors["output.weight"]
    if "token_embd.weight" in tensors:
        out["embed_tokens.weight"] = tensors["token_embd.weight"]
    d2t = tensors.get("d2t")
    ids = np.arange(n_draft, dtype=np.int64) if d2t is None else np.asarray(d2t, dtype=np.int64)
    if len(ids) != n_draft:
        raise ValueError(f"{draft_path}: d2t has {len(ids)} entries for {n_draft} head rows")
    out["d2t"] = ids - np.arange(n_draft, dtype=np.int64)  # the layout stores offsets
    t2d = np.zeros(info.n_vocab, dtype=bool)
    t2d[ids] = True
    out["t2d"] = t2d
    return _write(out_dir, cfg, out)


def export_hf_llama(draft_path: str, out_dir: str) -> dict:
    """`config.json`, `model.safetensors` and the tokenizer of a plain llama draft GGUF."""
    from ..inspect import read_gguf
    from .draftfile import read_draft_tensors
    from .hf_target import write_target_dir

    info = read_gguf(draft_path)
    if info.architecture != "llama":
        raise ValueError(f"{draft_path} is not a llama model (architecture {info.architecture})")
    tensors = read_draft_tensors(draft_path)
    cfg = _common_config(info, "llama")
    tied = "output.weight" not in tensors
    cfg.update({"architectures": ["LlamaForCausalLM"], "tie_word_embeddings": tied})
    out = {"model.embed_tokens.weight": np.ascontiguousarray(tensors["token_embd.weight"], dtype=np.float32)}
    out.update(_layer_tensors(tensors, "model.layers.{i}.", cfg["num_attention_heads"], cfg["num_key_value_heads"]))
    out["model.norm.weight"] = tensors["output_norm.weight"]
    if not tied:
        out["lm_head.weight"] = tensors["output.weight"]
    write_target_dir(draft_path, out_dir)  # the tokenizer files (and a config.json replaced below)
    return _write(out_dir, cfg, out)
