"""Which target a draft (or a feature set) belongs to, and refusing the wrong one.

A draft records its target's identity (architecture, layer count, hidden size,
vocabulary size, tokenizer hash). Loading it against another target is one clear
error naming every difference, never a silent run with garbage acceptance.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eaglet.capture import CaptureSpec
from eaglet.draft.checkpoint import load_draft, save_draft
from eaglet.draft.model import Eagle3Draft
from eaglet.errors import EagletError
from eaglet.loading.target import Target


def target_identity(target: Target) -> dict:
    c = target.config
    return {"name": str(target.name), "model_type": c.model_type, "num_layers": c.num_layers,
            "hidden_size": c.hidden_size, "vocab_size": c.vocab_size, "tokenizer_hash": target.tokenizer_hash}


def mismatches(recorded: dict, actual: dict) -> list[str]:
    """Differences between a recorded target identity (keys may be missing) and the actual one."""
    out = []
    for key, what in (("hidden_size", "hidden size"), ("vocab_size", "vocabulary size"),
                      ("num_layers", "layer count"), ("tokenizer_hash", "tokenizer")):
        if recorded.get(key) is not None and actual.get(key) is not None and recorded[key] != actual[key]:
            out.append(f"{what} {recorded[key]} vs {actual[key]}")
    return out


def check_draft_target(cfg: dict, target: Target, where: str | Path = "the draft") -> None:
    """Refuse a draft config.json whose target is not ``target``."""
    recorded = dict((cfg.get("eaglet") or {}).get("target") or {})
    recorded.setdefault("hidden_size", cfg.get("target_hidden_size") or cfg.get("hidden_size"))
    recorded.setdefault("vocab_size", cfg.get("vocab_size"))
    bad = mismatches(recorded, target_identity(target))
    if bad:
        raise EagletError(f"{where} was trained for another target than {target.name}: {'; '.join(bad)}")


def load_draft_for(path: str | Path, target: Target, device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float32, ids: list[int] | None = None,
                   convention: str | None = None) -> tuple[Eagle3Draft, dict]:
    """load_draft plus the identity check against ``target``."""
    cfg_path = Path(path) / "config.json"
    if cfg_path.is_file():
        check_draft_target(json.loads(cfg_path.read_text()), target, path)
    return load_draft(path, target.config.num_layers, device, dtype, ids, convention)


def import_draft(src: str | Path, out: str | Path, target: Target, ids: list[int] | None = None,
                 convention: str | None = None, overwrite: bool = False) -> CaptureSpec:
    """Re-write a foreign EAGLE-3 draft (SGLang/SpecForge/vLLM layout) as an eaglet draft for ``target``.

    Capture ids come from ``ids`` in their ``convention`` or from the draft's own config;
    a draft with neither is refused by ``read_capture``. ``out`` is replaced atomically, and
    only when it is empty, a draft, or ``overwrite`` is set.
    """
    draft, cfg = load_draft_for(src, target, ids=ids, convention=convention)
    save_draft(draft, out, target=target_identity(target),
               extra={"imported_from": {"path": str(src), "convention": convention or "config"}}, overwrite=overwrite)
    return draft.config.capture
