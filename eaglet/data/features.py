"""Offline features: the target's captured points and final hidden states, in safetensors shards.

A feature directory holds ``manifest.json`` and ``shard-00000.safetensors``, ... Shard
``s`` holds conversations ``s*S .. (s+1)*S-1`` back to back:

- ``ids`` [N] int32, ``mask`` [N] uint8 (assistant tokens), ``offsets`` [n+1] int64
- ``aux`` [N, k*H]: the CaptureSpec's points concatenated in spec order (the draft's fc input)
- ``hidden`` [N, H]: the target's final-normed hidden state; the trainer applies the
  target's LM head to it, so the full-vocabulary logits are never stored

Each shard's metadata repeats the manifest (CaptureSpec in eaglet's point convention,
target identity, tokenizer hash, data fingerprint), so a shard is never read against the
wrong target or capture. Shards are written to a temporary name and renamed: a resumed
capture skips the shards that exist.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from eaglet.capture import CaptureSpec
from eaglet.data.dataset import TokenData, length_batches, pad_right
from eaglet.draft.compat import mismatches, target_identity
from eaglet.errors import EagletError
from eaglet.interrupt import Interrupted, stop_on_signal
from eaglet.loading.hf import check_safetensors
from eaglet.loading.target import Target
from eaglet.outputs import atomic_file, write_atomic

FORMAT = "eaglet-features/1"


def _manifest(target: Target, capture: CaptureSpec, data: TokenData, shard_samples: int, dtype) -> dict:
    return {"format": FORMAT, "capture": capture.to_json(), "target": target_identity(target),
            "num_samples": len(data), "num_tokens": data.num_tokens, "shard_samples": shard_samples,
            "data_fingerprint": data.fingerprint(), "dtype": str(dtype).removeprefix("torch.")}


def _same_run(a: dict, b: dict) -> bool:
    keys = ("format", "capture", "num_samples", "shard_samples", "data_fingerprint", "dtype")
    return all(a.get(k) == b.get(k) for k in keys) and not mismatches(a.get("target", {}), b["target"])


@torch.inference_mode()
def capture_features(target: Target, data: TokenData, out: Path, capture: CaptureSpec, shard_samples: int = 512,
                     batch_tokens: int = 16384, dtype: torch.dtype = torch.bfloat16, progress: bool = True) -> int:
    """Write (or complete) the feature shards of ``data``; returns how many shards were written now."""
    if capture.num_layers != target.config.num_layers:
        raise EagletError(f"the capture spec is for a {capture.num_layers}-layer target, "
                          f"{target.name} has {target.config.num_layers} layers")
    manifest = _manifest(target, capture, data, shard_samples, dtype)
    out.mkdir(parents=True, exist_ok=True)
    mpath = out / "manifest.json"
    if mpath.is_file() and not _same_run(json.loads(mpath.read_text()), manifest):
        raise EagletError(f"{out} holds features of other data, target or capture; pick another --out")
    write_atomic(mpath, json.dumps(manifest, indent=1))
    model = target.model
    n_shards = -(-len(data) // shard_samples)
    todo = [s for s in range(n_shards) if not (out / f"shard-{s:05d}.safetensors").is_file()]
    with stop_on_signal("shard") as stop:
        for done, s in enumerate(tqdm(todo, desc="capture", unit="shard", disable=not progress, dynamic_ncols=True)):
            if stop:
                raise Interrupted(f"{n_shards - len(todo) + done} of {n_shards} feature shards are in {out}; "
                                  "run the same command again to capture the rest")
            _capture_shard(model, data, out, capture, manifest, s, shard_samples, batch_tokens, dtype)
    return len(todo)


def _capture_shard(model, data: TokenData, out: Path, capture: CaptureSpec, manifest: dict, s: int,
                   shard_samples: int, batch_tokens: int, dtype: torch.dtype) -> None:
    """Shard ``s``: its conversations through the target, written to a temporary name and renamed."""
    device = model.embed.weight.device
    idx = list(range(s * shard_samples, min((s + 1) * shard_samples, len(data))))
    aux_of: dict[int, torch.Tensor] = {}
    hid_of: dict[int, torch.Tensor] = {}
    for group in length_batches([len(data.get(i)[0]) for i in idx], batch_tokens, seed=0):
        rows = [idx[g] for g in group]
        ids = pad_right([data.get(i)[0].long() for i in rows]).to(device)  # [B, T]
        h, aux = model(ids, capture=capture.points)  # [B, T, H], [B, T, k*H]
        for r, i in enumerate(rows):
            n = len(data.get(i)[0])
            aux_of[i], hid_of[i] = aux[r, :n].to("cpu", dtype), h[r, :n].to("cpu", dtype)
    a, b = int(data.offsets[idx[0]]), int(data.offsets[idx[-1] + 1])
    tensors = {"ids": data.ids[a:b].clone(), "mask": data.mask[a:b].to(torch.uint8),
               "offsets": data.offsets[idx[0]: idx[-1] + 2] - a,
               "aux": torch.cat([aux_of[i] for i in idx]), "hidden": torch.cat([hid_of[i] for i in idx])}
    with atomic_file(out / f"shard-{s:05d}.safetensors") as tmp:
        save_file(tensors, str(tmp), metadata={"eaglet": json.dumps(manifest)})


def check_feature_dir(path: Path) -> tuple[dict, list[Path]]:
    """(manifest, shard files) of a complete feature directory, read without loading features;
    a missing, unfinished or truncated one is refused in one sentence."""
    mpath = path / "manifest.json"
    if not mpath.is_file():
        raise EagletError(f"{path} is not a feature directory (no manifest.json); run `eaglet data capture`")
    try:
        manifest = json.loads(mpath.read_text())
        n, per = manifest["num_samples"], manifest["shard_samples"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise EagletError(f"cannot read {mpath} ({e!r})") from None
    if manifest.get("format") != FORMAT:
        raise EagletError(f"{path} holds features in format {manifest.get('format')!r}, not {FORMAT}")
    files = [path / f"shard-{s:05d}.safetensors" for s in range(-(-n // per))]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise EagletError(f"{path} lacks {len(missing)} shards (first {missing[0]}); "
                          "finish it with `eaglet data capture` (it resumes)")
    for f in files:
        check_safetensors(f)
    return manifest, files


class FeatureSet:
    """Read access to a feature directory, one conversation at a time (slices read lazily)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        mpath = self.path / "manifest.json"
        self.manifest, self._files = check_feature_dir(self.path)
        self._handles: dict[int, object] = {}
        self._where: list[tuple[int, int, int]] = []  # per sample: (shard, start, end)
        ids, masks = [], []
        for s in range(len(self._files)):
            h = self._open(s)
            meta = json.loads(h.metadata()["eaglet"])
            if meta.get("data_fingerprint") != self.manifest["data_fingerprint"]:
                raise EagletError(f"{self._files[s]} belongs to another capture run than {mpath}")
            off = h.get_tensor("offsets").tolist()
            self._where += [(s, off[i], off[i + 1]) for i in range(len(off) - 1)]
            ids.append(h.get_tensor("ids"))
            masks.append(h.get_tensor("mask").bool())
        self.ids, self.mask = torch.cat(ids), torch.cat(masks)  # all tokens, for vocabulary counts

    @property
    def capture(self) -> CaptureSpec:
        return CaptureSpec.from_json(self.manifest["capture"])

    def check(self, target: Target, capture: CaptureSpec | None = None) -> None:
        bad = mismatches(self.manifest["target"], target_identity(target))
        if bad:
            raise EagletError(f"the features in {self.path} were captured from another target: {'; '.join(bad)}")
        if capture is not None and capture != self.capture:
            raise EagletError(f"the features in {self.path} hold points {list(self.capture.points)}, "
                              f"the draft reads {list(capture.points)}")

    def _open(self, s: int):
        if s not in self._handles:
            self._handles[s] = safe_open(str(self._files[s]), framework="pt")
        return self._handles[s]

    def __len__(self) -> int:
        return len(self._where)

    @property
    def lengths(self) -> list[int]:
        return [e - a for _, a, e in self._where]

    def get(self, i: int) -> dict[str, torch.Tensor]:
        s, a, e = self._where[i]
        h = self._open(s)
        return {"ids": h.get_slice("ids")[a:e], "mask": h.get_slice("mask")[a:e].bool(),
                "aux": h.get_slice("aux")[a:e], "hidden": h.get_slice("hidden")[a:e]}
