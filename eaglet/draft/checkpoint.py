"""Draft checkpoints: an HF-style directory that eaglet, SGLang and SpecForge all read.

``config.json`` carries SGLang/SpecForge's keys (``architectures:
["LlamaForCausalLMEagle3"]``, ``draft_vocab_size``, ``target_hidden_size``,
``eagle_config.eagle_aux_hidden_state_layer_ids`` in their "output of layer i"
convention) and an ``eaglet`` block with the CaptureSpec in our point convention,
the target's identity and ``aux_norm`` when the draft normalises its captured points
before ``fc`` (``aux_norm.weight``; other engines know no such tensor, so such a draft
runs in eaglet only). Weights are safetensors shards of at most 16 MiB (so a draft
travels through size-limited channels), with ``d2t``/``t2d`` beside them. A tensor larger than a
shard (SmolLM2's 24,576-token LM head, 27 MiB) is split into row blocks ``<name>@rows<i>`` when the
export allows it (``split_rows``: eaglet joins them on load; other engines know no such names, so
drafts meant for them are written with whole tensors in larger shards). ``eaglet.vocab_order:
"frequency"`` says the draft vocabulary lies most frequent first (``Eagle3Draft.keep_vocab``).

Import never guesses capture points: a draft with no ids is an error, and when both
blocks are present they must agree.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eaglet.capture import CaptureSpec
from eaglet.draft.model import DraftConfig, Eagle3Draft
from eaglet.errors import EagletError
from eaglet.loading.hf import check_safetensors
from eaglet.outputs import atomic_dir, is_empty_dir

MAX_SHARD_BYTES = 16 * 1024 * 1024
ARCH = "LlamaForCausalLMEagle3"
ROWS = "@rows"  # <name>@rows<i>: row block i of a tensor larger than a shard


def draft_config_json(c: DraftConfig, target: dict | None = None) -> dict:
    return {
        "architectures": [ARCH],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.target_hidden,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "eagle_config": {
            "use_aux_hidden_state": True,
            "eagle_aux_hidden_state_layer_ids": c.capture.to_ids("sglang") if 0 not in c.capture.points else None,
        },
        "eaglet": {"capture": c.capture.to_json(), "target": target or {},
                   **({"aux_norm": True} if c.aux_norm else {}),
                   **({"vocab_order": "frequency"} if c.vocab_by_frequency else {})},
    }


def save_draft(draft: Eagle3Draft, path: str | Path, target: dict | None = None,
               dtype: torch.dtype = torch.bfloat16, extra: dict | None = None,
               max_shard_bytes: int = MAX_SHARD_BYTES, overwrite: bool = False, split_rows: bool = False) -> None:
    """Write the draft atomically: a temp directory renamed over ``path``.

    An existing ``path`` is replaced only when it is a draft already (a re-export) or
    ``overwrite`` says so: a folder eaglet did not write is never removed unasked.
    Shards hold at most ``max_shard_bytes`` (16 MiB by default, so a small target's draft
    travels through size-limited channels); a larger tensor is split into row blocks with ``split_rows``
    (an eaglet-only layout), else a large target's draft needs a larger limit.
    """
    path = Path(path)
    if not (overwrite or not path.exists() or is_empty_dir(path) or is_draft_dir(path)):
        raise EagletError(f"{path} exists and is not a draft; choose another output directory, "
                          "or pass --overwrite to replace it")
    tensors = {k: v.detach().to("cpu") for k, v in draft.state_dict().items()}
    tensors = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    blocks = [b for name, t in tensors.items() for b in _blocks(name, t, max_shard_bytes, split_rows)]
    for name, t in blocks:
        n = t.numel() * t.element_size()
        if size + n > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += n
    cfg = draft_config_json(draft.config, target)
    if extra:
        cfg["eaglet"].update(extra)
    with atomic_dir(path) as tmp:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(tmp / fname), metadata={"format": "pt"})
            weight_map.update({k: fname for k in shard})
        (tmp / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}, indent=1))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))


def _blocks(name: str, t: torch.Tensor, limit: int, split_rows: bool) -> list[tuple[str, torch.Tensor]]:
    """``t`` whole, or with ``split_rows`` in row blocks of at most ``limit`` bytes when it is larger."""
    n = t.numel() * t.element_size()
    if n <= limit:
        return [(name, t)]
    row = n // max(t.shape[0], 1) if t.dim() else n
    if not split_rows or row > limit:
        raise EagletError(f"draft tensor {name} is {n >> 20} MiB, over the {limit >> 20} MiB shard limit; "
                          "use a smaller draft vocabulary or bfloat16")
    return [(f"{name}{ROWS}{i}", b.contiguous()) for i, b in enumerate(t.split(limit // row))]


def row_block(key: str) -> tuple[str, int | None]:
    """(tensor name, block index) of a stored key; the index is None for a whole tensor."""
    name, rows, i = key.rpartition(ROWS)
    return (name, int(i)) if rows and i.isdigit() else (key, None)


def listed_by_frequency(cfg: dict) -> bool:
    """Whether a draft's config.json says its vocabulary lies most frequent first (``Eagle3Draft.keep_vocab``)."""
    return (cfg.get("eaglet") or {}).get("vocab_order") == "frequency"


def is_draft_dir(path: Path) -> bool:
    """A directory whose config.json names an EAGLE-3 draft (ours or another tool's)."""
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and ARCH in (cfg.get("architectures") or [])


def read_capture(cfg: dict, num_layers: int, ids: list[int] | None = None,
                 convention: str | None = None) -> CaptureSpec:
    """The draft's CaptureSpec, from explicit ids, our block, or SGLang/SpecForge's ids."""
    if ids is not None:
        if convention is None:
            raise EagletError("capture ids were given without their convention (eaglet, vllm, sglang, specforge)")
        return CaptureSpec.from_ids(ids, convention, num_layers)
    ours = (cfg.get("eaglet") or {}).get("capture")
    theirs = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ours is not None:
        spec = CaptureSpec.from_json(ours)
        if spec.num_layers != num_layers:
            raise EagletError(f"the draft was trained for a {spec.num_layers}-layer target; "
                              f"this target has {num_layers}")
        if theirs is not None and CaptureSpec.from_ids(theirs, "sglang", num_layers) != spec:
            raise EagletError(f"the draft's capture points {list(spec.points)} disagree with its "
                              f"eagle_aux_hidden_state_layer_ids {theirs}")
        return spec
    if theirs is not None:
        return CaptureSpec.from_ids(theirs, "sglang", num_layers)
    raise EagletError("the draft's config.json carries no capture layer ids (eagle_config."
                      "eagle_aux_hidden_state_layer_ids); pass them with their convention instead of guessing")


def load_draft(path: str | Path, num_layers: int, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, ids: list[int] | None = None,
               convention: str | None = None) -> tuple[Eagle3Draft, dict]:
    """(draft, its config.json) for a target with ``num_layers`` layers."""
    path = Path(path)
    cfg = check_draft_dir(path)
    capture = read_capture(cfg, num_layers, ids, convention)
    heads = int(cfg["num_attention_heads"])
    c = DraftConfig(
        hidden_size=int(cfg["hidden_size"]), intermediate_size=int(cfg["intermediate_size"]), num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        vocab_size=int(cfg["vocab_size"]), draft_vocab_size=int(cfg.get("draft_vocab_size") or cfg["vocab_size"]),
        capture=capture, rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        target_hidden_size=cfg.get("target_hidden_size"),
        aux_norm=bool((cfg.get("eaglet") or {}).get("aux_norm")),
        vocab_by_frequency=listed_by_frequency(cfg),
    )
    state = _read_tensors(path)
    if "aux_norm.weight" in state and not c.aux_norm:  # never serve without a norm the draft was trained with
        raise EagletError(f"{path} holds aux_norm.weight but its config.json does not declare eaglet.aux_norm")
    state.pop("embed_tokens.weight", None)  # some exporters duplicate the target's embedding
    with torch.device(device):
        draft = Eagle3Draft(c)
    missing = set(draft.state_dict()) - set(state)
    if "d2t" in missing and c.draft_vocab_size == c.vocab_size:  # full vocabulary: identity mapping
        state["d2t"] = torch.zeros(c.vocab_size, dtype=torch.long)
        state["t2d"] = torch.ones(c.vocab_size, dtype=torch.bool)
        missing -= {"d2t", "t2d"}
    if missing:
        raise EagletError(f"{path} lacks draft tensors: {', '.join(sorted(missing))}")
    state = {k: v for k, v in state.items() if k in draft.state_dict()}
    draft.load_state_dict({k: v.to(torch.long) if k == "d2t" else v.to(torch.bool) if k == "t2d" else v
                           for k, v in state.items()}, strict=True)
    return draft.to(dtype=dtype).eval(), cfg


def check_draft_dir(path: Path) -> dict:
    """The config.json of a complete one-layer EAGLE-3 draft directory, read without loading weights;
    a missing, foreign or truncated draft is refused in one sentence."""
    if not (path / "config.json").is_file():
        raise EagletError(f"{path} is not a draft directory (no config.json)")
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise EagletError(f"cannot read {path / 'config.json'} ({e})") from None
    if not isinstance(cfg, dict):
        raise EagletError(f"{path / 'config.json'} is not a JSON object")
    if not is_draft_dir(path):
        raise EagletError(f"{path} is not an EAGLE-3 draft (architectures: {cfg.get('architectures')})")
    if int(cfg.get("num_hidden_layers", 1)) != 1:
        raise EagletError(f"eaglet runs one-layer EAGLE-3 drafts; {path} has {cfg['num_hidden_layers']} layers")
    for f in _weight_files(path):
        check_safetensors(path / f)
    return cfg


def _weight_files(path: Path) -> list[str]:
    index = path / "model.safetensors.index.json"
    try:
        files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() \
            else [f.name for f in path.glob("*.safetensors")]
    except (OSError, ValueError, KeyError, AttributeError) as e:
        raise EagletError(f"cannot read {index} ({e!r})") from None
    if not files:
        raise EagletError(f"{path} holds no safetensors weights")
    return files


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the draft, row blocks joined in order."""
    out, blocks = {}, {}
    for f in _weight_files(path):
        with safe_open(str(path / f), framework="pt") as h:
            for k in h.keys():
                name, i = row_block(k)
                if i is None:
                    out[k] = h.get_tensor(k)
                else:
                    blocks.setdefault(name, {})[i] = h.get_tensor(k)
    for name, parts in blocks.items():
        if sorted(parts) != list(range(len(parts))):
            raise EagletError(f"{path} holds row blocks {sorted(parts)} of {name}; some are missing")
        out[name] = torch.cat([parts[i] for i in range(len(parts))])
    return out
