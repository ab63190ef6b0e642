"""Hugging Face checkpoint directories: config.json plus safetensors (single or sharded)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from eaglet.errors import EagletError
from eaglet.models.config import ModelConfig, target_config
from eaglet.models.deepseek_config import DeepseekConfig


class SafetensorsSource:
    """One tensor of an open safetensors file, read in slices on demand."""

    def __init__(self, handle, name: str):
        self._slice = handle.get_slice(name)
        self.shape = tuple(self._slice.get_shape())

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, start + length)
        return self._slice[tuple(index)]


class MemorySource:
    """A tensor already in memory (GGUF dequantized, or tests)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self.shape = tuple(tensor.shape)

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        return self.tensor.narrow(dim, start, length)


def read_config(path: Path) -> ModelConfig | DeepseekConfig:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise EagletError(f"{path} has no config.json; pass a Hugging Face model directory or a .gguf file")
    try:
        return target_config(json.loads(cfg_file.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EagletError(f"{cfg_file} is not valid JSON ({e})") from None


def open_tensors(path: Path) -> dict[str, SafetensorsSource]:
    """Name -> lazily sliceable tensor for every safetensors file of the directory."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise EagletError(f"{path} has no model.safetensors or model.safetensors.index.json")
    out: dict[str, SafetensorsSource] = {}
    for f in files:
        check_safetensors(path / f)
        try:
            handle = safe_open(str(path / f), framework="pt")
        except (OSError, SafetensorError) as e:
            raise EagletError(f"cannot read {path / f}: not a safetensors file ({e})") from None
        for name in handle.keys():
            out[name] = SafetensorsSource(handle, name)
    return out


def check_safetensors(file: Path) -> None:
    """Refuse a truncated file up front (a lazy reader would fail mid-load otherwise)."""
    if not file.is_file():
        raise EagletError(f"{file} is missing")
    size = file.stat().st_size
    try:
        with open(file, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n)) if 8 + n <= size else None
    except (OSError, ValueError):
        header = None
    if header is None:
        raise EagletError(f"cannot read {file}: it is truncated or not a safetensors file")
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise EagletError(f"{file} is truncated: {size} bytes, its header promises {8 + n + end}")


def save_checkpoint(path: Path, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    """Write config.json + model.safetensors into ``path`` (which must be a fresh temp dir)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
