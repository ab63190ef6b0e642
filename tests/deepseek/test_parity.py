"""The DeepSeek-V3 target against transformers' DeepseekV3 on tiny random configurations (float32, CPU).

Each case saves a random HF model as safetensors, loads it through eaglet's loader and
checks logits, every residual-stream point, the cached forward (prefill in the expanded
form, decode in the absorbed latent form) and 64 greedy tokens.
"""

from __future__ import annotations

import pytest
import torch

from eaglet.models.deepseek import DeepseekTransformer
from tests.conftest import greedy_hf, greedy_ours, load_ours
from tests.deepseek.conftest import YARN, make_hf_deepseek, save_deepseek

# case id -> (config overrides, model_type written to config.json)
CASES = {
    "moe-grouped": ({}, None),
    "moe-yarn": ({"rope_parameters": YARN, "max_position_embeddings": 256}, None),
    "dense-full-rank-q-halves": ({"first_k_dense_replace": 3, "q_lora_rank": None, "rope_interleave": False}, None),
    "kimi-one-group-yarn": ({"n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.827,
                             "rope_parameters": dict(YARN, mscale=1.0), "max_position_embeddings": 256}, "kimi_k2"),
    "moe-unnormalised-2-shared": ({"norm_topk_prob": False, "n_shared_experts": 2, "first_k_dense_replace": 0,
                                   "num_experts_per_tok": 2}, None),
}
SEQ = 100  # longer than the YaRN cases' original window (64)
TOL = 1e-4


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    overrides, model_type = CASES[request.param]
    hf = make_hf_deepseek(seed=len(request.param), **overrides)
    path = save_deepseek(hf, tmp_path_factory.mktemp(request.param), model_type)
    ours, cfg = load_ours(path)
    return request.param, hf, ours, cfg


def _ids(vocab: int, b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


def test_config_read_as_expected(pair):
    name, hf, ours, cfg = pair
    hc = hf.config
    assert isinstance(ours, DeepseekTransformer)
    assert cfg.model_type == ("kimi_k2" if name.startswith("kimi") else "deepseek_v3")
    assert (cfg.num_layers, cfg.kv_lora_rank, cfg.qk_rope_head_dim) == (3, hc.kv_lora_rank, hc.qk_rope_head_dim)
    assert list(cfg.moe_layers) == list(range(hc.first_k_dense_replace, 3))
    assert (cfg.yarn is not None) == ("yarn" in name)
    assert cfg.q_lora_rank == hc.q_lora_rank and cfg.rope_interleave == hc.rope_interleave
    # The softmax scale carries YaRN's mscale(factor, mscale_all_dim)^2, as transformers' attention does.
    assert cfg.attention_scale == pytest.approx(hf.model.layers[0].self_attn.scaling, rel=1e-12)
    inv, factor = cfg.rope_tables()
    assert torch.equal(inv, hf.model.rotary_emb.inv_freq)
    assert factor == pytest.approx(hf.model.rotary_emb.attention_scaling)


@torch.no_grad()
def test_logits_and_every_point_match_hf(pair):
    name, hf, ours, cfg = pair
    n = cfg.num_layers
    ids = _ids(cfg.vocab_size, 2, SEQ)
    ref = hf(ids, output_hidden_states=True)
    capture = tuple(range(n + 1))
    h, aux = ours(ids, capture=capture)
    diff = (ours.logits(h) - ref.logits).abs().max().item()
    print(f"[{name}] max |logits - HF| = {diff:.3e}")
    assert diff < TOL
    points = aux.split(cfg.hidden_size, dim=-1)  # N+1 x [B, T, H]
    for p in range(n):
        d = (points[p] - ref.hidden_states[p]).abs().max().item()
        assert d < TOL, f"point {p}: {d:.3e}"
    assert torch.equal(points[0], ours.embed(ids))  # point 0 is the embedding output
    assert torch.equal(ours.norm(points[n]), h)  # point N is the last layer's output before the norm
    assert (h - ref.hidden_states[n]).abs().max().item() < TOL  # HF's last entry is normed


@torch.no_grad()
def test_cached_forward_matches_whole_sequence(pair):
    """Prefill over the cache (expanded form), then decode one token at a time (absorbed form)."""
    _, _, ours, cfg = pair
    ids = _ids(cfg.vocab_size, 1, SEQ, seed=3)
    whole, _ = ours(ids)
    cache = ours.new_cache(1, SEQ)
    parts = [ours(ids[:, :80], cache.append_meta(80), cache)[0]]
    cache.advance(80)
    for t in range(80, SEQ):
        parts.append(ours(ids[:, t:t + 1], cache.append_meta(1), cache)[0])
        cache.advance(1)
    assert cache.k[0].shape == (1, 1, SEQ, cfg.kv_lora_rank + cfg.qk_rope_head_dim) and cache.v == []
    assert (torch.cat(parts, dim=1) - whole).abs().max().item() < 1e-5


def test_greedy_64_tokens_match_hf_generate(pair):
    name, hf, ours, cfg = pair
    prompt = _ids(cfg.vocab_size, 1, 9, seed=7)
    ref = greedy_hf(hf, prompt, 64)
    got = greedy_ours(ours, prompt, 64)
    n_same = int((ref == got).cumprod(0).sum())
    print(f"[{name}] greedy: {n_same}/64 tokens identical to HF generate")
    assert len(ref) == 64 and torch.equal(got, ref), f"first mismatch at token {n_same}"
