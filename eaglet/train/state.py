"""Resumable training state without pickle: safetensors for tensors, JSON for the rest.

``checkpoint/state.safetensors`` holds the draft's weights and buffers (``draft.*``), the
AdamW moments and step counts (``optim.<param index>.<key>``) and the RNG states
(``rng.*``); ``checkpoint/state.json`` holds the step, epoch, position in the epoch,
optimizer hyper-parameters and the run's configuration. The directory is written
beside the old one and swapped in, so an interrupt never leaves a torn checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eaglet.errors import EagletError
from eaglet.outputs import atomic_dir


def save_state(path: Path, draft: torch.nn.Module, optimizer: torch.optim.Optimizer, info: dict) -> None:
    tensors = {f"draft.{k}": v.detach().cpu().contiguous() for k, v in draft.state_dict().items()}
    opt = optimizer.state_dict()
    for idx, st in opt["state"].items():
        for key, val in st.items():
            tensors[f"optim.{idx}.{key}"] = torch.as_tensor(val).detach().cpu().contiguous()
    tensors["rng.cpu"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    meta = {**info, "param_groups": opt["param_groups"]}
    with atomic_dir(path) as tmp:
        save_file(tensors, str(tmp / "state.safetensors"))
        (tmp / "state.json").write_text(json.dumps(meta, indent=1))


def read_info(path: Path) -> dict | None:
    """The JSON half of a checkpoint, or None when there is none."""
    f = path / "state.json"
    if not (f.is_file() and (path / "state.safetensors").is_file()):
        return None
    return json.loads(f.read_text())


def load_state(path: Path, draft: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Restore weights, optimizer moments and RNG in place; returns the JSON info."""
    info = read_info(path)
    if info is None:
        raise EagletError(f"{path} holds no training checkpoint")
    tensors = load_file(str(path / "state.safetensors"))
    dev = next(draft.parameters()).device
    weights = {k.removeprefix("draft."): v.to(dev) for k, v in tensors.items() if k.startswith("draft.")}
    draft.load_state_dict(weights, strict=True)
    state: dict[int, dict] = {}
    for k, v in tensors.items():
        if k.startswith("optim."):
            _, idx, key = k.split(".", 2)
            state.setdefault(int(idx), {})[key] = v if key == "step" else v.to(dev)
    optimizer.load_state_dict({"state": state, "param_groups": info["param_groups"]})
    torch.set_rng_state(tensors["rng.cpu"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    return info
