"""DeepSeek-V3 / Kimi-K2 configs: what is read, and what is refused in one sentence."""

from __future__ import annotations

import json

import pytest
import torch

from eaglet.errors import EagletError
from eaglet.loading.hf import read_config
from eaglet.loading.target import load_model
from eaglet.models.config import target_config
from eaglet.models.deepseek_config import DeepseekConfig
from tests.deepseek.conftest import make_hf_deepseek, save_deepseek

# DeepSeek-V3's own config.json (transformers 4 spelling: rope_scaling with "type"), trimmed.
DSV3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
    "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-6,
    "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                          "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                          "type": "yarn"},
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False,
}
FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


def test_deepseek_v3_config_is_read():
    cfg = target_config(DSV3)
    assert isinstance(cfg, DeepseekConfig)
    assert cfg.yarn.factor == 40 and cfg.yarn.original_max_position == 4096
    assert list(cfg.moe_layers) == list(range(3, 61)) and cfg.qk_head_dim == 192
    # 1/sqrt(192) * (0.1 ln 40 + 1)^2: YaRN's correction of the softmax scale
    assert cfg.attention_scale == pytest.approx(192 ** -0.5 * (0.1 * torch.log(torch.tensor(40.0)).item() + 1) ** 2)
    assert cfg.draft_shape() == (18432, 56, 8, 128)  # SpecForge's DeepSeek-V3 draft has 56 heads, 8 KV heads
    assert target_config(dict(DSV3, model_type="kimi_k2")).model_type == "kimi_k2"


@pytest.mark.parametrize("change,words", [
    ({"quantization_config": FP8}, "quantised (fp8, weight_block_size [128, 128])"),
    ({"scoring_func": "softmax"}, "scoring_func='softmax' is not supported"),
    ({"topk_method": "greedy"}, "topk_method='greedy'"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "unsupported rope scaling 'dynamic'"),
    ({"n_group": 3}, "split evenly into groups"),
    ({"num_experts_per_tok": 200}, "cannot be chosen from 4 groups of 32 experts"),
    ({"kv_lora_rank": None}, "lacks the key 'kv_lora_rank'"),
])
def test_refused_in_one_sentence(change, words):
    d = {k: v for k, v in {**DSV3, **change}.items() if v is not None}
    with pytest.raises(EagletError, match="^[^\n]*$") as e:
        target_config(d)
    assert words in str(e.value)


def test_fp8_weights_without_their_config_are_refused(tmp_path):
    """Block scales in the checkpoint are refused even when config.json lost its quantization_config."""
    hf = make_hf_deepseek(num_hidden_layers=1, first_k_dense_replace=1)
    path = save_deepseek(hf, tmp_path)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    tensors["model.layers.0.self_attn.o_proj.weight_scale_inv"] = torch.ones(1, 1)
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(EagletError, match="FP8 block scales"):
        load_model(path)


def test_missing_expert_is_named(tmp_path):
    hf = make_hf_deepseek(num_hidden_layers=2)
    path = save_deepseek(hf, tmp_path)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.1.mlp.experts.5.up_proj.weight"]
    save_file(tensors, str(path / "model.safetensors"))
    assert read_config(path).n_routed_experts == 8
    with pytest.raises(EagletError, match="lacks the tensor 'model.layers.1.mlp.experts.5.up_proj.weight'"):
        load_model(path)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"]
