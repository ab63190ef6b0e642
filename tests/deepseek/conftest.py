"""Tiny random DeepSeek-V3 models (transformers' DeepseekV3ForCausalLM) and their eaglet twins (CPU, float32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

# Small but not degenerate: 4 heads of MLA with q and kv low rank, 3 layers (1 dense + 2 MoE),
# 8 experts in 4 groups of which 2 may be chosen, 3 experts a token, one shared expert.
TINY_DS = dict(
    vocab_size=384, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
    kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, v_head_dim=24, qk_nope_head_dim=16,
    n_group=4, topk_group=2, num_experts_per_tok=3, first_k_dense_replace=1, routed_scaling_factor=2.5,
    norm_topk_prob=True, max_position_embeddings=512, rms_norm_eps=1e-6,
    # As tests/conftest.py's TINY: a large init keeps greedy argmax away from near-ties.
    initializer_range=0.15, bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 1.0}


def make_hf_deepseek(seed: int = 0, **overrides):
    """A tiny randomly initialised DeepseekV3ForCausalLM (eval, float32) with random norms and routing bias."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**{**TINY_DS, **overrides})).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # transformers initialises them to 1: a swapped norm would not show
                p.uniform_(0.5, 1.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # zeros by default: the bias must change choices
                b.normal_(0.0, 0.2)
    return model


def save_deepseek(hf, path: Path, model_type: str | None = None) -> Path:
    """Save as an HF directory; ``model_type`` rewrites config.json (Kimi-K2 says ``kimi_k2``)."""
    path.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(path), safe_serialization=True)
    if model_type is not None:
        cfg = json.loads((path / "config.json").read_text())
        cfg["model_type"] = model_type
        (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture(autouse=True, scope="module")
def one_thread(one_thread):
    yield


def make_tiny_deepseek_dir(path: Path, seed: int = 0, head_scale: float = 4.0, **overrides) -> Path:
    """An HF directory (config, safetensors, tokenizer) of a 4-layer random DeepSeek-V3 (1 dense + 3 MoE),
    with tests/train's byte-level tokenizer and chat template (vocabulary 260)."""
    from tests.train.helpers import tiny_tokenizer

    tok = tiny_tokenizer()
    hf = make_hf_deepseek(seed=seed, vocab_size=len(tok), num_hidden_layers=4,
                          eos_token_id=tok.convert_tokens_to_ids("<|end|>"), **overrides)
    with torch.no_grad():
        hf.lm_head.weight.mul_(head_scale)  # peaked next-token distributions, as tests/train's target
    save_deepseek(hf, path)
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def ds_target_dir(tmp_path_factory) -> Path:
    return make_tiny_deepseek_dir(tmp_path_factory.mktemp("ds-target-dir"))
