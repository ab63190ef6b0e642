"""GGUF files (llama.cpp): metadata -> HF config dict, tensors dequantized to float32.

llama.cpp's converter permutes the rows of q and k so that rotary pairs are
interleaved; we undo that permutation so the tensors match HF layout exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from eaglet.errors import EagletError

_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "mistral"}
_BLOCK = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}


def _reader(path: Path):
    try:
        import gguf
    except ImportError:
        raise EagletError("reading a GGUF file needs the 'gguf' package: pip install gguf") from None
    try:
        return gguf, gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError) as e:
        raise EagletError(f"cannot read {path}: it is truncated or not a GGUF file ({e})") from None


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def read_gguf(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(HF config.json dict, HF-named float32 tensors) of a GGUF file."""
    gguf, r = _reader(path)
    arch = _field(r, "general.architecture")
    if arch not in _ARCH:
        raise EagletError(f"unsupported architecture '{arch}' in {path.name}: "
                          "eaglet reads llama, mistral, qwen2, qwen3")
    heads = int(_field(r, f"{arch}.attention.head_count"))
    kv_heads = int(_field(r, f"{arch}.attention.head_count_kv", heads))
    hidden = int(_field(r, f"{arch}.embedding_length"))
    names = {t.name for t in r.tensors}
    vocab = len(r.fields["tokenizer.ggml.tokens"].data)
    config = {
        "model_type": _ARCH[arch],
        "vocab_size": int(_field(r, f"{arch}.vocab_size", vocab)),
        "hidden_size": hidden,
        "intermediate_size": int(_field(r, f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(_field(r, f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": int(_field(r, f"{arch}.attention.key_length", hidden // heads)),
        "rms_norm_eps": float(_field(r, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(_field(r, f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(r, f"{arch}.context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _field(r, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(r, "tokenizer.ggml.eos_token_id"),
    }
    tensors: dict[str, torch.Tensor] = {}
    for t in r.tensors:
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except (ValueError, NotImplementedError) as e:
            raise EagletError(f"cannot dequantize {t.name} ({t.tensor_type.name}) in {path.name}: {e}") from None
        arr = np.asarray(arr, dtype=np.float32).reshape(tuple(reversed([int(s) for s in t.shape])))
        name = _hf_name(t.name)
        w = torch.from_numpy(arr.copy())
        if arch in ("llama", "mistral") and name.endswith(("q_proj.weight", "k_proj.weight")):
            w = _unpermute(w, heads if "q_proj" in name else kv_heads)
        tensors[name] = w
    return config, tensors


def _hf_name(name: str) -> str:
    if name in _TOP:
        return _TOP[name]
    parts = name.split(".")
    if parts[0] != "blk" or parts[2] not in _BLOCK:
        raise EagletError(f"unexpected tensor '{name}' in the GGUF file")
    return f"model.layers.{parts[1]}.{_BLOCK[parts[2]]}.{parts[3]}"


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    # llama.cpp stored rows as [head, dim/2, 2]; HF wants [head, 2, dim/2].
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
