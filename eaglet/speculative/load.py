"""Which draft serves a target: the shipped default, none, or a directory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from eaglet.errors import EagletError
from eaglet.loading.target import Target
from eaglet.models.int8_linear import Int8Linear, int8_gemm_available
from eaglet.models.int8_matmul import CudaInt8Linear
from eaglet.models.slot_moves import HAS_TRITON
from eaglet.options import EngineOptions

DRAFTS_DIR = Path(__file__).resolve().parent.parent / "drafts"
# Tokens a frequency-ordered draft serves with by default where its LM head stays float32, per device type
# (absent: all). On the 2-core CPU that head is much of a draft step: 24,576 tokens cost a 5,2,8 iteration 1.96
# plain steps against 1.71 with 12,288 (+15%), more than the 3% more accepted tokens are worth; served in int8
# (the CPU's default, ``int8_head``) the whole head costs less than the cut float32 one (docs/performance.md).
SERVE_VOCAB = {"cpu": 12288}
# A draft's weight as served in int8 (its head, and its fc and layer with ``int8_layer``): fbgemm's on an x86 CPU,
# eaglet's Triton GEMM on CUDA.
INT8_LINEARS = (Int8Linear, CudaInt8Linear)
# Where the draft's head is extended to the target's whole vocabulary by default (``extend_vocab``; with the head in
# int8 and no --draft-vocab cut): on the 2-core CPU SmolLM2's 5,2,8 accepted 3.52 / 2.94 (bench / other prompts)
# against 3.43 / 2.91 at the same speed (session 39, docs/performance.md); on CUDA not yet measured.
EXTEND_ON = ("cpu",)
# Whether a CUDA target serves the draft's head in int8 by default (``--int8-draft-head`` either way): off, since on
# an H100 its 1.6% off SmolLM2's 6,8,48 iteration came with 0.03-0.07 less accepted a verify (session 37).
CUDA_INT8_HEAD = False
# Where the draft's fc and layer are served in int8 by default (``int8_layer``; with the head in int8): on the
# 2-core CPU speculation ran 4-7% faster, the accept length 0.00-0.03 lower (session 52, docs/performance.md). Not
# on CUDA: on an H100 SmolLM2's 6,8,48 iteration gained nothing (1.50 -> 1.53 plain steps), a Llama-3.1-8B-shaped
# draft's 1.40 -> 1.28 (session 53), which a large draft asks for with --int8-draft-head --int8-draft-layer.
INT8_LAYER_ON = ("cpu",)


def int8_served(draft) -> tuple[bool, bool]:
    """(head, layer): whether a served draft's LM head, and its fc and layer (``int8_projections``), are in int8."""
    return isinstance(draft.lm_head, INT8_LINEARS), isinstance(draft.fc, INT8_LINEARS)


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


def load_engine_draft(path: Path, target: Target, vocab: int | None = None, int8_head: bool | None = None,
                      extend: bool | None = None, int8_layer: bool | None = None):
    """The draft at ``path``, on the target's device and in its dtype, its projections fused for
    serving; a draft recorded for another target (hidden size, vocabulary, layers, tokenizer) is refused.

    ``vocab``: serve a frequency-ordered draft with its ``vocab`` most frequent tokens (``keep_vocab``, which
    refuses a draft listed by token id); default: all of them where the head is served in int8, else
    SERVE_VOCAB for the device, where the draft allows it. ``int8_head``: serve the LM head in int8
    (``Int8Linear`` for a float32 target on an x86 CPU, not under torch.compile; ``CudaInt8Linear`` on CUDA
    with Triton); None: the device's default (a CPU wherever possible, CUDA if CUDA_INT8_HEAD). ``extend``: serve
    over the target's whole vocabulary, the rows the draft lacks mapped from the target's LM head
    (``Eagle3Draft.extend_vocab``); None: where the head is served in int8 over all its tokens on a device of
    EXTEND_ON. ``int8_layer``: also ``fc`` and the decoder layer's projections in int8 (``int8_projections``;
    where an int8 head can be served); None: where the head is served in int8 on a device of INT8_LAYER_ON."""
    from eaglet.draft.compat import load_draft_for

    p = target.model.embed.weight
    on_cpu = p.device.type == "cpu" and p.dtype == torch.float32 and int8_gemm_available()
    on_cuda = p.device.type == "cuda" and HAS_TRITON
    if (int8_head or int8_layer) and not (on_cpu or on_cuda):
        what = "head" if int8_head else "layer"
        raise EagletError(f"an int8 draft {what} needs a float32 target on an x86 CPU (fbgemm's int8 GEMM) or a CUDA "
                          f"GPU with Triton; this one is {str(p.dtype).removeprefix('torch.')} on {p.device.type}")
    int8_head = (on_cpu or (on_cuda and CUDA_INT8_HEAD)) if int8_head is None else int8_head
    if int8_layer is None:
        int8_layer = bool(int8_head) and p.device.type in INT8_LAYER_ON
    if extend and vocab is not None:
        raise EagletError(f"--extend-draft-vocab serves the target's whole vocabulary and --draft-vocab {vocab} cuts "
                          "the draft's: give one of them")
    draft, _ = load_draft_for(path, target, device=p.device, dtype=p.dtype)
    if vocab is None and draft.config.vocab_by_frequency and not int8_head:
        vocab = SERVE_VOCAB.get(p.device.type)
    if vocab is not None:
        draft.keep_vocab(vocab)
    if extend or (extend is None and vocab is None and int8_head and p.device.type in EXTEND_ON):
        # whole rows on every rank under tensor parallelism too; each rank decides alike
        head = target.model.head_rows(torch.arange(target.config.vocab_size, device=p.device))  # [V, H]
        try:
            draft.extend_vocab(head)
        except EagletError as e:
            if extend:  # by default a draft it does not suit is served as trained
                raise EagletError(f"--extend-draft-vocab: {e} ({path}); leave the flag out") from None
    int8 = CudaInt8Linear if on_cuda else Int8Linear
    if int8_head:
        draft.lm_head = int8(draft.lm_head.weight)
    draft.fuse_projections()
    return draft.int8_projections(int8) if int8_layer else draft


def spec_engine(target: Target, path: Path, max_context: int | None, options: EngineOptions,
                log: Callable[[str], None] | None = None):
    """The SpecEngine ``options`` describe (tree, compile, policy, draft vocabulary) with the draft at ``path``."""
    from eaglet.speculative import SpecEngine  # the package's name, looked up when called (tests wrap it)

    kw = {} if log is None else {"log": log}  # None: the engine's own notes on stderr
    # A CPU's --compile traces the draft, and dynamo does not take fbgemm's packed weights: the head and the layer
    # stay float32. (CUDA's int8 GEMM is an operator that compiles.)
    on_cpu = target.model.embed.weight.device.type == "cpu"
    if on_cpu and options.compile and (options.int8_head or options.int8_layer):
        flag = "--int8-draft-head" if options.int8_head else "--int8-draft-layer"
        raise EagletError(f"{flag} does not go with --compile on a CPU (torch.compile cannot trace fbgemm's "
                          "packed int8 weights); leave one of them out")
    int8_head, int8_layer = (False, False) if on_cpu and options.compile else (options.int8_head, options.int8_layer)
    draft = load_engine_draft(path, target, options.draft_vocab, int8_head, options.extend_vocab, int8_layer)
    return SpecEngine(target, draft, max_context,
                      *options.tree_flags, compile=options.compile, adaptive=options.policy,
                      compile_prefill=options.fused_prefill(target.model.embed.weight.device), **kw)
