"""Which draft serves a target: the shipped default, none, or a directory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from eaglet.loading.target import Target
from eaglet.options import EngineOptions

DRAFTS_DIR = Path(__file__).resolve().parent.parent / "drafts"
# Tokens a frequency-ordered draft serves with by default, per device type (absent: all). On the 2-core CPU
# the draft's LM head is much of a draft step: 24,576 tokens cost a 5,2,8 iteration 1.96 plain steps against
# 1.71 with 12,288 (+15%), more than the 6-8% more accepted tokens they gave on the H200 (docs/training.md);
# the shipped SmolLM2 draft served cut ran 1.60x plain decoding there, whole 1.53x (docs/performance.md).
SERVE_VOCAB = {"cpu": 12288}


def default_draft_path(target_name: str) -> Path | None:
    """``eaglet/drafts/<target-name>/`` when a draft ships for this target, else None."""
    path = DRAFTS_DIR / Path(str(target_name).rstrip("/")).name
    return path if (path / "config.json").is_file() else None


def shipped_draft_for(target: Target) -> Path | None:
    """The shipped draft whose recorded target is this one (same tokenizer and sizes), whatever
    the target was called: the embedded name, its GGUF file or a converted directory."""
    from eaglet.draft.compat import mismatches, target_identity

    found = default_draft_path(target.name)
    if found is not None or not DRAFTS_DIR.is_dir():
        return found
    actual = target_identity(target)
    for cfg_path in sorted(DRAFTS_DIR.glob("*/config.json")):
        recorded = (json.loads(cfg_path.read_text()).get("eaglet") or {}).get("target") or {}
        if recorded.get("tokenizer_hash") and not mismatches(recorded, actual):
            return cfg_path.parent
    return None


def resolve_draft(spec: str, target: Target) -> Path | None:
    """'none' -> None; 'default' -> the shipped draft or None; anything else -> that directory."""
    if spec == "none":
        return None
    if spec == "default":
        return shipped_draft_for(target)
    return Path(spec).expanduser()


def load_engine_draft(path: Path, target: Target, vocab: int | None = None):
    """The draft at ``path``, on the target's device and in its dtype, its projections fused for
    serving; a draft recorded for another target (hidden size, vocabulary, layers, tokenizer) is refused.

    ``vocab``: serve a frequency-ordered draft with its ``vocab`` most frequent tokens (``keep_vocab``, which
    refuses a draft listed by token id); default: SERVE_VOCAB for the device, where the draft allows it."""
    from eaglet.draft.compat import load_draft_for

    p = target.model.embed.weight
    draft, _ = load_draft_for(path, target, device=p.device, dtype=p.dtype)
    if vocab is None and draft.config.vocab_by_frequency:
        vocab = SERVE_VOCAB.get(p.device.type)
    if vocab is not None:
        draft.keep_vocab(vocab)
    return draft.fuse_projections()


def spec_engine(target: Target, path: Path, max_context: int | None, options: EngineOptions,
                log: Callable[[str], None] | None = None):
    """The SpecEngine ``options`` describe (tree, compile, policy, draft vocabulary) with the draft at ``path``."""
    from eaglet.speculative import SpecEngine  # the package's name, looked up when called (tests wrap it)

    kw = {} if log is None else {"log": log}  # None: the engine's own notes on stderr
    return SpecEngine(target, load_engine_draft(path, target, options.draft_vocab), max_context,
                      *options.tree_flags, compile=options.compile, adaptive=options.policy,
                      compile_prefill=options.fused_prefill(target.model.embed.weight.device), **kw)
