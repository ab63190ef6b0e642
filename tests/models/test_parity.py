"""Our Transformer against transformers' own implementation, family by family.

Each case builds a tiny random HF model, saves it as safetensors, loads it through
eaglet's loader, and checks logits, the capture points and 64 greedy tokens.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import greedy_hf, greedy_ours, load_ours, make_hf_model, save_and_load

pytestmark = pytest.mark.usefixtures("one_thread")

LLAMA3_ROPE = {
    "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
}

# case id -> (family, config overrides)
CASES = {
    "llama": ("llama", {}),
    "llama-tied-mha": ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    "llama3-rope": ("llama", {"rope_parameters": LLAMA3_ROPE}),
    "mistral": ("mistral", {}),
    "qwen2-bias": ("qwen2", {}),
    "qwen3-qknorm-mqa": ("qwen3", {"head_dim": 32, "num_key_value_heads": 1}),
}

SEQ = 100  # longer than the llama3 case's original_max_position_embeddings (64)


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    family, overrides = CASES[request.param]
    hf = make_hf_model(family, seed=len(request.param), **overrides)
    ours, cfg = save_and_load(hf, tmp_path_factory.mktemp(request.param))
    return request.param, hf, ours, cfg


def _ids(vocab: int, b: int, t: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (b, t), generator=g)


def test_config_read_as_expected(pair):
    name, hf, _, cfg = pair
    hc = hf.config
    assert cfg.num_layers == hc.num_hidden_layers
    assert cfg.num_kv_heads == hc.num_key_value_heads
    assert cfg.head_dim == getattr(hc, "head_dim", hc.hidden_size // hc.num_attention_heads)
    assert cfg.tie_word_embeddings == bool(hc.tie_word_embeddings)
    assert cfg.attention_bias == (name == "qwen2-bias")
    assert cfg.qk_norm == name.startswith("qwen3")
    assert (cfg.rope_llama3 is not None) == (name == "llama3-rope")
    if name == "llama3-rope":
        assert cfg.rope_llama3 == (8.0, 1.0, 4.0, 64)
    if name == "llama-tied-mha":
        assert cfg.num_kv_heads == cfg.num_heads
    elif name.startswith("qwen3"):
        assert cfg.head_dim != cfg.hidden_size // cfg.num_heads
    else:
        assert cfg.num_kv_heads < cfg.num_heads  # GQA


@torch.no_grad()
def test_logits_and_capture_match_hf(pair):
    name, hf, ours, cfg = pair
    n = cfg.num_layers
    ids = _ids(cfg.vocab_size, 2, SEQ)
    ref = hf(ids, output_hidden_states=True)
    capture = (0, 1, n - 1, n)
    h, aux = ours(ids, capture=capture)
    logits = ours.logits(h)
    diff = (logits - ref.logits).abs().max().item()
    print(f"[{name}] max |logits - HF| = {diff:.3e}")
    assert diff < 1e-4

    hsz = cfg.hidden_size
    assert aux.shape == (2, SEQ, len(capture) * hsz)
    points = aux.split(hsz, dim=-1)  # k x [B, T, H], in capture order
    for p, x in zip(capture, points, strict=True):
        if p < n:
            d = (x - ref.hidden_states[p]).abs().max().item()
            print(f"[{name}] point {p}: max |ours - HF hidden_states[{p}]| = {d:.3e}")
            assert d < 1e-4, f"point {p}"
    # Point N is the last layer's output before the final norm.
    last = points[-1]
    assert (ours.norm(last) - h).abs().max().item() < 1e-6
    assert (h - ref.hidden_states[n]).abs().max().item() < 1e-4  # HF's last entry is normed
    # Point 0 is the embedding output itself.
    assert torch.equal(points[0], ours.embed(ids))


@torch.no_grad()
def test_capture_order_is_spec_order(pair):
    _, _, ours, cfg = pair
    ids = _ids(cfg.vocab_size, 1, 12)
    _, a = ours(ids, capture=(2, 0))
    _, b = ours(ids, capture=(0, 2))
    hsz = cfg.hidden_size
    assert torch.equal(a[..., :hsz], b[..., hsz:]) and torch.equal(a[..., hsz:], b[..., :hsz])
    h1, none = ours(ids)
    h2, _ = ours(ids, capture=(1,))
    assert none is None and torch.equal(h1, h2)


@torch.no_grad()
def test_cached_prefill_matches_plain_forward(pair):
    _, _, ours, cfg = pair
    ids = _ids(cfg.vocab_size, 1, SEQ, seed=3)
    plain, _ = ours(ids)
    cache = ours.new_cache(1, SEQ + 4)
    h, _ = ours(ids[:, :60], cache.append_meta(60), cache)
    cache.advance(60)
    h2, _ = ours(ids[:, 60:], cache.append_meta(SEQ - 60), cache)
    cached = torch.cat([h, h2], dim=1)
    assert (cached - plain).abs().max().item() < 1e-5


def test_greedy_64_tokens_match_hf_generate(pair):
    name, hf, ours, cfg = pair
    prompt = _ids(cfg.vocab_size, 1, 9, seed=7)
    ref = greedy_hf(hf, prompt, 64)
    got = greedy_ours(ours, prompt, 64)
    assert len(ref) == 64
    n_same = int((ref == got).cumprod(0).sum())
    print(f"[{name}] greedy: {n_same}/64 tokens identical to HF generate")
    assert torch.equal(got, ref), f"first mismatch at token {n_same}"


@torch.no_grad()
def test_llama3_rope_transformers4_spelling(tmp_path):
    """A config.json in transformers 4.x form (rope_theta + rope_scaling) loads the same model."""
    hf = make_hf_model("llama", seed=5, rope_parameters=dict(LLAMA3_ROPE, rope_theta=500000.0))
    save_and_load(hf, tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    rope = d.pop("rope_parameters")
    d["rope_theta"] = rope.pop("rope_theta")
    d["rope_scaling"] = rope  # {"rope_type": "llama3", "factor": 8.0, ...}
    (tmp_path / "config.json").write_text(json.dumps(d))
    ours, cfg = load_ours(tmp_path)
    assert cfg.rope_theta == 500000.0 and cfg.rope_llama3 == (8.0, 1.0, 4.0, 64)
    ids = _ids(cfg.vocab_size, 1, SEQ)
    h, _ = ours(ids)
    diff = (ours.logits(h) - hf(ids).logits).abs().max().item()
    print(f"[llama3-rope, 4.x config] max |logits - HF| = {diff:.3e}")
    assert diff < 1e-4


@torch.no_grad()
def test_llama3_rope_scaling_is_not_ignored(tiny_pair):
    """The llama3 case must actually differ from plain rope past the original context."""
    _, ours, cfg = tiny_pair("llama", seed=5, rope_parameters=LLAMA3_ROPE)
    plain = make_hf_model("llama", seed=5)  # same weights (same seed), default rope
    ids = _ids(cfg.vocab_size, 1, SEQ)
    h, _ = ours(ids)
    assert (ours.logits(h) - plain(ids).logits).abs().max().item() > 1e-3


@pytest.mark.parametrize("family,value", [("qwen2", False), ("mistral", True)])
@torch.no_grad()
def test_attention_bias_key_follows_transformers(tmp_path, family, value):
    """transformers gives qwen2 q/k/v biases and mistral none, whatever config.json's attention_bias says."""
    hf = make_hf_model(family, seed=3, num_hidden_layers=1)
    save_and_load(hf, tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    d["attention_bias"] = value
    (tmp_path / "config.json").write_text(json.dumps(d))
    ours, cfg = load_ours(tmp_path)
    assert cfg.attention_bias == (family == "qwen2")
    ids = _ids(cfg.vocab_size, 1, 16)
    h, _ = ours(ids)
    assert (ours.logits(h) - hf(ids).logits).abs().max().item() < 1e-4
