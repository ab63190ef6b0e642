"""Check 1, the contract: does this draft fit this target, by what its files declare?

Read without trusting: the draft's config.json and tensor shapes are inspected before
anything is loaded, so a bad draft becomes a failed check with evidence instead of an
exception. Each item below is one line of evidence:

- capture points: declared (eaglet block, with its convention, and/or SGLang's
  ``eagle_config.eagle_aux_hidden_state_layer_ids``), in range for this target, and the
  two declarations agree when both are present;
- ``fc`` reads ``k x`` the target's hidden size, through the per-point RMSNorm
  (``aux_norm.weight``, ``k*H``) exactly when the config declares ``eaglet.aux_norm``;
  hidden size, vocabulary and layer count
  recorded with the draft match the target's;
- the draft vocabulary: ``target id = i + d2t[i]`` is in range and injective, and ``t2d``
  marks exactly those ids;
- the tokenizer hash (vocabulary + chat template) recorded at training matches the
  target's, for the draft and for offline features (``--features``).

The draft is then loaded with the declared points given explicitly, so the later checks
run even when the declarations disagree (the search then scores both).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from eaglet.capture import CaptureSpec
from eaglet.data.features import FeatureSet
from eaglet.doctor.report import FAIL, WARN, Check
from eaglet.draft.checkpoint import ARCH, load_draft, row_block
from eaglet.draft.compat import mismatches, target_identity
from eaglet.draft.model import Eagle3Draft
from eaglet.errors import EagletError
from eaglet.loading.target import Target

TITLE = "contract"


@dataclass
class Contract:
    check: Check
    draft: Eagle3Draft | None = None  # None when it cannot run on this target
    declared: CaptureSpec | None = None  # what the draft says it reads (None: it says nothing usable)
    assumed: CaptureSpec | None = None  # what the later checks feed it: declared, else EAGLE-3's default
    alternatives: list[tuple[str, CaptureSpec]] = field(default_factory=list)  # other declarations found
    features: FeatureSet | None = None
    config: dict = field(default_factory=dict)


def sglang_ids(spec: CaptureSpec) -> str:
    """The spec as SGLang/SpecForge ids ("output of layer i" = point i+1), or why it has none."""
    return f"SGLang ids {spec.to_ids('sglang')}" if 0 not in spec.points else "no SGLang ids: point 0 has none"


def _tensor_facts(path: Path) -> tuple[dict[str, tuple[int, ...]], dict[str, torch.Tensor]]:
    """Shapes of every tensor, and the d2t/t2d tensors themselves (small), from safetensors headers."""
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() \
        else sorted(f.name for f in path.glob("*.safetensors"))
    if not files:
        raise EagletError(f"{path} holds no safetensors weights")
    shapes, small = {}, {}
    for f in files:
        with safe_open(str(path / f), framework="pt") as h:
            for k in h.keys():
                shape = tuple(h.get_slice(k).get_shape())
                name, block = row_block(k)
                if block is not None and name in shapes:  # a tensor stored in row blocks: rows add up
                    shape = (shapes[name][0] + shape[0], *shape[1:])
                shapes[name] = shape
                if k in ("d2t", "t2d"):
                    small[k] = h.get_tensor(k)
    return shapes, small


def _spec(ids, convention: str, num_layers: int, what: str, chk: Check) -> CaptureSpec | None:
    try:
        return CaptureSpec.from_ids(list(ids), convention, num_layers)
    except (EagletError, TypeError, ValueError) as e:
        chk.flag(FAIL, f"{what}: {e}")
        return None


def _declared(cfg: dict, n: int, chk: Check) -> tuple[CaptureSpec | None, list[tuple[str, CaptureSpec]]]:
    ours = (cfg.get("eaglet") or {}).get("capture")
    theirs = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    if top is not None and theirs is None:
        chk.flag(WARN, f"eagle_aux_hidden_state_layer_ids {top} sits at the top level of config.json, where "
                       "SGLang does not look (it reads eagle_config): that engine would use its defaults")
        theirs = top
    spec_ours = spec_theirs = None
    if ours is not None:
        conv = ours.get("convention")
        if conv is None:
            chk.flag(WARN, "the eaglet capture block names no convention; read as eaglet points")
        if ours.get("num_layers") is not None and int(ours["num_layers"]) != n:
            chk.flag(FAIL, f"the capture points were declared for a {ours['num_layers']}-layer target; "
                           f"this target has {n} layers")
        spec_ours = _spec(ours.get("points") or [], conv or "eaglet", n, "eaglet capture block", chk)
    if theirs is not None:
        spec_theirs = _spec(theirs, "sglang", n, f"eagle_aux_hidden_state_layer_ids {theirs}", chk)
    alternatives = []
    if spec_ours and spec_theirs and spec_ours != spec_theirs:
        chk.flag(FAIL, f"the eaglet block declares points {list(spec_ours.points)} but eagle_config's SGLang ids "
                       f"{theirs} mean points {list(spec_theirs.points)}: engines reading one or the other "
                       "capture different layers")
        alternatives.append(("config's SGLang ids", spec_theirs))
    if ours is None and theirs is None:
        chk.flag(FAIL, "config.json declares no capture points (neither an eaglet block nor "
                       "eagle_config.eagle_aux_hidden_state_layer_ids): engines would silently use their defaults")
    return spec_ours or spec_theirs, alternatives


def _vocab(cfg: dict, facts: dict[str, torch.Tensor], vocab: int, chk: Check) -> dict:
    vd = int(cfg.get("draft_vocab_size") or cfg.get("vocab_size") or 0)
    d2t, t2d = facts.get("d2t"), facts.get("t2d")
    ev = {"draft_vocab_size": vd}
    if d2t is None:
        if vd != vocab:
            chk.flag(FAIL, f"the draft vocabulary has {vd} of {vocab} tokens but the draft ships no d2t mapping")
        return ev
    d2t = d2t.long().reshape(-1)
    if d2t.numel() != vd:
        chk.flag(FAIL, f"d2t has {d2t.numel()} entries for a {vd}-token draft vocabulary")
        return ev
    ids = torch.arange(vd) + d2t  # target id of each draft id
    out = ((ids < 0) | (ids >= vocab)).nonzero().flatten()
    if out.numel():
        i = int(out[0])
        chk.flag(FAIL, f"d2t maps {out.numel()} draft ids outside the target vocabulary 0..{vocab - 1} "
                       f"(first: draft id {i} -> target id {int(ids[i])})")
    inside = ids.clamp(0, vocab - 1)
    uniq, counts = torch.unique(inside, return_counts=True)
    dup = uniq[counts > 1]
    if dup.numel():
        tok = int(dup[0])
        which = (inside == tok).nonzero().flatten()[:3].tolist()
        chk.flag(FAIL, f"d2t is not injective: {dup.numel()} target ids are reached by several draft ids "
                       f"(first: draft ids {which} -> target id {tok})")
    ev.update(d2t_out_of_range=int(out.numel()), d2t_collisions=int(dup.numel()))
    if t2d is not None:
        t2d = t2d.bool().reshape(-1)
        if t2d.numel() != vocab:
            chk.flag(FAIL, f"t2d has {t2d.numel()} entries for a {vocab}-token target vocabulary")
            return ev
        unmarked = (~t2d[inside]).nonzero().flatten()
        extra = int(t2d.sum()) - int(uniq.numel())
        if unmarked.numel() or extra:
            first = f"; first: draft id {int(unmarked[0])} -> target id {int(inside[unmarked[0]])}, " \
                    f"not marked in t2d" if unmarked.numel() else ""
            chk.flag(FAIL, f"d2t and t2d disagree: t2d marks {int(t2d.sum())} target ids, d2t reaches "
                           f"{uniq.numel()} ({unmarked.numel()} of them unmarked){first}")
        ev["t2d_marked"] = int(t2d.sum())
    return ev


def check_contract(target: Target, draft_path: Path, features: str | None, dtype: torch.dtype,
                   device: str | torch.device) -> Contract:
    chk = Check(1, TITLE)
    n = target.config.num_layers
    try:
        cfg = json.loads((draft_path / "config.json").read_text())
        shapes, facts = _tensor_facts(draft_path)
    except (OSError, ValueError, EagletError) as e:  # ValueError: malformed JSON
        chk.flag(FAIL, f"{draft_path} is not a readable draft directory ({e})")
        chk.summary = "no draft to check"
        return Contract(chk)
    res = Contract(chk, config=cfg)
    if ARCH not in (cfg.get("architectures") or []):
        chk.flag(FAIL, f"architectures {cfg.get('architectures')} is not {ARCH}")
    if int(cfg.get("num_hidden_layers", 1)) != 1:
        chk.flag(FAIL, f"the draft has {cfg['num_hidden_layers']} layers; EAGLE-3 drafts here have one")
    res.declared, res.alternatives = _declared(cfg, n, chk)
    res.assumed = res.declared or _default_or_none(n)
    runnable = _sizes(cfg, shapes, res.assumed, target, chk)
    actual = target_identity(target)
    recorded = (cfg.get("eaglet") or {}).get("target") or {}
    for bad in mismatches(recorded, actual):
        chk.flag(FAIL, f"trained for another target: {bad} (recorded with the draft vs this target)")
    if not recorded.get("tokenizer_hash"):
        chk.flag(WARN, "the draft records no tokenizer hash: nothing proves it was trained with this target's "
                       "tokenizer and chat template")
    vocab = _vocab(cfg, facts, target.config.vocab_size, chk)
    if features:
        res.features = _check_features(features, actual, res.assumed, chk)
    if runnable:
        try:
            res.draft, _ = load_draft(draft_path, n, device, dtype, ids=list(res.assumed.points), convention="eaglet")
        except (EagletError, RuntimeError) as e:  # RuntimeError: load_state_dict's shape mismatch
            chk.flag(FAIL, f"the draft does not load: {str(e).splitlines()[0]}")
    chk.evidence = {"declared": list(res.declared.points) if res.declared else None,
                    "assumed": list(res.assumed.points) if res.assumed else None,
                    "fc_shape": list(shapes.get("fc.weight") or []), "target_layers": n,
                    "target_hidden": target.config.hidden_size, "target_vocab": target.config.vocab_size,
                    "tokenizer_hash": actual["tokenizer_hash"], "recorded_target": recorded, **vocab}
    if res.declared is not None:
        fc = shapes.get("fc.weight")
        chk.lines.append(f"points {list(res.declared.points)} (eaglet convention; {sglang_ids(res.declared)}) of "
                         f"0..{n}; fc {fc[1] if fc else '?'} = {res.declared.k} x {target.config.hidden_size}")
        if "aux_norm.weight" in shapes:  # its own line: the points line alone nears the screen's width
            chk.lines.append("each point RMS-normalised first (aux_norm)")
    elif res.assumed is not None:
        chk.lines.append(f"no usable declaration: later checks assume EAGLE-3's default {list(res.assumed.points)}")
    chk.lines.append(f"draft vocabulary {vocab['draft_vocab_size']} of {target.config.vocab_size}; tokenizer "
                     f"{actual['tokenizer_hash']} (recorded {recorded.get('tokenizer_hash') or 'none'})")
    chk.summary = "the draft fits this target" if chk.status != FAIL else \
        f"{len(chk.problems)} problem(s) in what the draft declares"
    return res


def _sizes(cfg: dict, shapes: dict, spec: CaptureSpec | None, target: Target, chk: Check) -> bool:
    """fc width, target hidden size and vocabulary against the target; whether the draft can run on it."""
    hidden, vocab = target.config.hidden_size, target.config.vocab_size
    fc = shapes.get("fc.weight")
    ok = fc is not None and spec is not None
    if fc is None:
        chk.flag(FAIL, "the draft has no fc.weight")
    elif spec is not None and fc[1] != spec.k * hidden:
        k = fc[1] / hidden
        chk.flag(FAIL, f"fc reads {fc[1]} features but {spec.k} points x hidden {hidden} = {spec.k * hidden}"
                       + (f" (fc fits {int(k)} points)" if k.is_integer() else ""))
        ok = False
    declared, norm = bool((cfg.get("eaglet") or {}).get("aux_norm")), shapes.get("aux_norm.weight")
    if declared != (norm is not None):
        chk.flag(FAIL, "the config declares eaglet.aux_norm but the weights hold no aux_norm.weight" if declared
                 else "the weights hold aux_norm.weight but the config does not declare eaglet.aux_norm: serving "
                      "would skip the norm the draft was trained with")
        ok = False
    elif norm is not None and fc is not None and list(norm) != [fc[1]]:
        chk.flag(FAIL, f"aux_norm.weight has shape {list(norm)}; fc reads {fc[1]} features")
        ok = False
    t_hidden = cfg.get("target_hidden_size") or cfg.get("hidden_size")
    if t_hidden is not None and int(t_hidden) != hidden:
        chk.flag(FAIL, f"the draft reads a target of hidden size {t_hidden}; this target's is {hidden}")
        ok = False
    if cfg.get("vocab_size") is not None and int(cfg["vocab_size"]) != vocab:
        chk.flag(FAIL, f"the draft's vocabulary is {cfg['vocab_size']} tokens; this target's is {vocab}")
        ok = False
    return ok


def _default_or_none(n: int) -> CaptureSpec | None:
    try:
        return CaptureSpec.eagle3_default(n)
    except EagletError:  # a target too shallow for three distinct points
        return None


def _check_features(path: str, actual: dict, spec: CaptureSpec | None, chk: Check) -> FeatureSet | None:
    try:
        fs = FeatureSet(path)
    except EagletError as e:
        chk.flag(FAIL, f"--features: {e}")
        return None
    for bad in mismatches(fs.manifest.get("target", {}), actual):
        chk.flag(FAIL, f"the features in {path} were captured from another target: {bad}")
    if spec is not None and fs.capture.points != spec.points:
        chk.flag(FAIL, f"the features in {path} hold points {list(fs.capture.points)}; the draft reads "
                       f"{list(spec.points)}")
    return fs
