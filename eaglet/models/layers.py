"""Building blocks of a Llama-family decoder, written tensor-parallel-ready.

Every weight is created at its per-rank shape and filled by ``load(part, src)``, where
``src`` is a lazily sliceable checkpoint tensor (``TensorSource``): a rank reads only
its own rows or columns. At tp=1 the parallel layers are plain ``nn.Linear`` math.

Sharding (Megatron style): q/k/v and gate/up are column-parallel (output split by
heads or rows), o_proj and down_proj are row-parallel (input split, then all-reduce),
the embedding and LM head are vocab-parallel.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from eaglet.errors import EagletError
from eaglet.models.config import ModelConfig
from eaglet.parallel.state import SINGLE, TPGroup


class TensorSource(Protocol):
    """A checkpoint tensor that can be read in slices without loading all of it."""

    shape: tuple[int, ...]

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor: ...


def _copy(dst: torch.Tensor, src: torch.Tensor, what: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise EagletError(f"checkpoint tensor {what} has shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
    with torch.no_grad():
        dst.copy_(src.to(dst.dtype))


def _narrow(src: TensorSource, dim: int, start: int, length: int, full: int, what: str) -> torch.Tensor:
    """This rank's slice of ``src``, refusing a tensor whose sliced dimension is not ``full`` long
    (a plain narrow would silently read the first rows of a larger tensor)."""
    if src.shape[dim] != full:
        raise EagletError(
            f"checkpoint tensor {what} has shape {tuple(src.shape)}; the config implies {full} along dimension {dim}"
        )
    return src.narrow(dim, start, length)


# oneDNN's prepacked GEMM for CPU float32 inference (``pack_linears``). On the workplace's 2-core
# AMD EPYC, F.linear (MKL) ran the target's LM head [49152, 576] in 7.5 ms for one row and 15.2 ms
# for eight; the packed weight in 4.3 and 4.8 ms (one thread); the target's gate/up for eight rows
# 0.44 -> 0.16 ms. Verify (8 rows) and the draft's steps (1-2 rows) gain most.
_PACK_HINT = 8  # the rows oneDNN's layout is chosen for (a verify's); any row count works


def _has_packed_gemm() -> bool:
    # Private ops (the ones inductor's CPU backend uses): a torch without them keeps F.linear.
    try:
        return torch.backends.mkldnn.is_available() and all(
            hasattr(torch.ops.mkldnn, op) for op in ("_reorder_linear_weight", "_linear_pointwise"))
    except (AttributeError, RuntimeError):
        return False


_HAS_PACKED_GEMM = _has_packed_gemm()


def pack_linears(module: nn.Module) -> nn.Module:
    """Mark every 2-D float32 CPU weight of ``module`` for ``dense``'s oneDNN path (packed on first use).

    Inference only: ``dense`` falls back to F.linear while autograd records and under torch.compile
    (CUDA never reaches it); a weight changed after packing (its version or storage) is packed again."""
    if not _HAS_PACKED_GEMM:
        return module
    for t in (*module.parameters(), *module.buffers()):
        if t.dim() == 2 and t.dtype == torch.float32 and t.device.type == "cpu":
            t._eaglet_pack = True
    return module


def _packed(w: torch.Tensor) -> torch.Tensor | None:
    if not getattr(w, "_eaglet_pack", False) or w.requires_grad and torch.is_grad_enabled():
        return None
    try:
        key = (w._version, w.data_ptr())
    except RuntimeError:  # an inference tensor keeps no version: never packed
        return None
    cached = getattr(w, "_eaglet_packed", None)
    if cached is None or cached[0] != key:
        with torch.no_grad():
            cached = (key, torch.ops.mkldnn._reorder_linear_weight(w.detach(), _PACK_HINT))
        w._eaglet_packed = cached
    return cached[1]


def dense(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through oneDNN's packed weight where ``pack_linears`` marked it (CPU, float32, no grads)."""
    if x.is_cpu and x.dtype == torch.float32 and not torch.compiler.is_compiling() and not (
            x.requires_grad and torch.is_grad_enabled()):
        packed = _packed(weight)
        if packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear (same parameters and state-dict keys) whose forward is ``dense``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense(x, self.weight, self.bias)


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x over its root mean square along the last axis, computed in float32 (as the reference
    implementations do) and returned in x's dtype; no weight."""
    if torch.compiler.is_compiling():
        # Traced, the formula: the compiler fuses it with its neighbours (the residual add, the weight).
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    # Eagerly, torch's op: the same float32 math in one kernel on CUDA, where the formula launches six
    # (an eager prefill of tens of thousands of tokens, as regeneration admits and training captures, is
    # bound by such elementwise passes). On the CPU it is the formula itself.
    return F.rms_norm(x, (x.shape[-1],), eps=eps)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = _param(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * rms_norm(x, self.eps)

    def load(self, src: TensorSource) -> None:
        _copy(self.weight, src.narrow(0, 0, src.shape[0]), "norm.weight")


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Rotary inverse frequencies [head_dim/2], with Llama-3.1 scaling when configured."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    if cfg.rope_llama3 is None:
        return inv.float()
    factor, lo, hi, orig = cfg.rope_llama3
    wavelen = 2 * math.pi / inv
    lo_wave, hi_wave = orig / lo, orig / hi
    # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    smooth = (orig / wavelen - lo) / (hi - lo)
    blended = (1 - smooth) * inv / factor + smooth * inv
    out = torch.where(wavelen > lo_wave, inv / factor, inv)
    mid = (wavelen <= lo_wave) & (wavelen >= hi_wave)
    return torch.where(mid, blended, out).float()


class Rotary(nn.Module):
    """cos/sin tables [max_pos, head_dim], indexed by explicit per-token positions."""

    def __init__(self, cfg: ModelConfig | None, max_pos: int, inv_freq: torch.Tensor | None = None,
                 scale: float = 1.0):
        # ``inv_freq`` and ``scale`` (YaRN's factor on cos/sin) replace the config's when given.
        super().__init__()
        t = torch.arange(max_pos, dtype=torch.float32)
        freqs = torch.outer(t, rope_inv_freq(cfg) if inv_freq is None else inv_freq)  # [P, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [P, D]
        self.register_buffer("cos", emb.cos() * scale, persistent=False)
        self.register_buffer("sin", emb.sin() * scale, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions [B, T] -> cos, sin [B, T, 1, D] (broadcast over heads)
        return self.cos[positions].unsqueeze(2), self.sin[positions].unsqueeze(2)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [B, T, n, D]; rotate_half convention of HF Llama (halves, not interleaved pairs)
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def vocab_rows(weight: torch.Tensor, ids: torch.Tensor, start: int, tp: TPGroup) -> torch.Tensor:
    """Rows of the whole vocabulary for token ids [...] -> [..., H] on every rank, from ``weight`` [V / tp, H], this
    rank's rows from ``start``: a lookup at tp=1; above, a masked local lookup, then an all-reduce."""
    if tp.size == 1:
        return F.embedding(ids, weight)
    part = weight.shape[0]
    local = ids - start
    inside = (local >= 0) & (local < part)
    return tp.all_reduce(F.embedding(local.clamp(0, part - 1), weight) * inside.unsqueeze(-1))


class VocabParallelEmbedding(nn.Module):
    """Rows of the embedding split over ranks: masked local lookup, then all-reduce."""

    def __init__(self, vocab: int, dim: int, tp: TPGroup):
        super().__init__()
        if vocab % tp.size:
            raise EagletError(f"vocabulary size {vocab} does not divide by tp={tp.size}")
        self.tp = tp
        self.part = vocab // tp.size
        self.start = tp.rank * self.part
        self.weight = _param(self.part, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return vocab_rows(self.weight, ids, self.start, self.tp)

    def load(self, src: TensorSource) -> None:
        _copy(self.weight, _narrow(src, 0, self.start, self.part, self.part * self.tp.size, "embedding"), "embedding")


class ParallelLMHead(nn.Module):
    """LM head with vocab rows split over ranks; logits gathered to full width."""

    def __init__(self, vocab: int, dim: int, tp: TPGroup, tied: VocabParallelEmbedding | None):
        super().__init__()
        self.tp = tp
        self.part = vocab // tp.size
        self.start = tp.rank * self.part
        self.tied = tied is not None
        self.weight = tied.weight if tied is not None else _param(self.part, dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.tp.all_gather_last(dense(h, self.weight))  # [..., V]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Whole weight rows of the token ids [n] -> [n, H] on every rank."""
        return vocab_rows(self.weight, ids, self.start, self.tp)

    def load(self, src: TensorSource) -> None:
        _copy(self.weight, _narrow(src, 0, self.start, self.part, self.part * self.tp.size, "lm_head"), "lm_head")


class QKVParallelLinear(nn.Module):
    """Fused q/k/v projection, column-parallel by heads.

    Query heads split evenly; KV heads split too when tp <= num_kv_heads, else each
    rank keeps the one KV head its query heads read (replicated across ranks).
    """

    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__()
        if cfg.num_heads % tp.size:
            raise EagletError(f"num_attention_heads={cfg.num_heads} does not divide by tp={tp.size}")
        if tp.size > cfg.num_kv_heads and tp.size % cfg.num_kv_heads:
            raise EagletError(
                f"tp={tp.size} is larger than num_key_value_heads={cfg.num_kv_heads} and not a multiple of it"
            )
        if tp.size <= cfg.num_kv_heads and cfg.num_kv_heads % tp.size:
            raise EagletError(f"num_key_value_heads={cfg.num_kv_heads} does not divide by tp={tp.size}")
        d = cfg.head_dim
        self.n_q = cfg.num_heads // tp.size
        self.n_kv = max(1, cfg.num_kv_heads // tp.size)
        self.q_start = tp.rank * self.n_q
        self.kv_start = tp.rank * self.n_kv if tp.size <= cfg.num_kv_heads else tp.rank * cfg.num_kv_heads // tp.size
        self.d = d
        self.full_heads = {"q": cfg.num_heads, "k": cfg.num_kv_heads, "v": cfg.num_kv_heads}
        rows = (self.n_q + 2 * self.n_kv) * d
        self.weight = _param(rows, cfg.hidden_size)
        self.bias = _param(rows) if cfg.attention_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense(x, self.weight, self.bias)

    def _rows(self, part: str) -> tuple[int, int, int]:
        # (row offset in the fused weight, first head in the checkpoint, heads)
        nq, nkv, d = self.n_q, self.n_kv, self.d
        return {"q": (0, self.q_start, nq), "k": (nq * d, self.kv_start, nkv),
                "v": ((nq + nkv) * d, self.kv_start, nkv)}[part]

    def load(self, part: str, src: TensorSource, bias: bool = False) -> None:
        off, head, n = self._rows(part)
        dst = self.bias if bias else self.weight
        rows = _narrow(src, 0, head * self.d, n * self.d, self.full_heads[part] * self.d, f"{part}_proj")
        _copy(dst[off: off + n * self.d], rows, f"{part}_proj")


class MergedColumnParallelLinear(nn.Module):
    """gate_proj and up_proj fused into one column-parallel weight."""

    def __init__(self, dim: int, inter: int, tp: TPGroup):
        super().__init__()
        if inter % tp.size:
            raise EagletError(f"intermediate_size={inter} does not divide by tp={tp.size}")
        self.part = inter // tp.size
        self.full = inter
        self.start = tp.rank * self.part
        self.weight = _param(2 * self.part, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense(x, self.weight)

    def load(self, index: int, src: TensorSource) -> None:
        p = self.part
        rows = _narrow(src, 0, self.start, p, self.full, "gate/up_proj")
        _copy(self.weight[index * p: (index + 1) * p], rows, "gate/up_proj")


class RowParallelLinear(nn.Module):
    """Input split over ranks; partial products summed by all-reduce."""

    def __init__(self, in_features: int, out_features: int, tp: TPGroup, reduce: bool = True):
        # ``reduce=False``: the caller sums this partial product with others before one all-reduce.
        super().__init__()
        if in_features % tp.size:
            raise EagletError(f"row-parallel input {in_features} does not divide by tp={tp.size}")
        self.tp = tp
        self.reduce = reduce
        self.part = in_features // tp.size
        self.full = in_features
        self.start = tp.rank * self.part
        self.weight = _param(out_features, self.part)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = dense(x, self.weight)
        return self.tp.all_reduce(y) if self.reduce else y

    def load(self, src: TensorSource) -> None:
        cols = _narrow(src, 1, self.start, self.part, self.full, "o_proj/down_proj")
        _copy(self.weight, cols, "o_proj/down_proj")


class ColumnParallelLinear(nn.Module):
    """Output rows split evenly over ranks (callers check that whole heads land on each rank)."""

    def __init__(self, in_features: int, out_features: int, tp: TPGroup):
        super().__init__()
        if out_features % tp.size:
            raise EagletError(f"column-parallel output {out_features} does not divide by tp={tp.size}")
        self.part = out_features // tp.size
        self.full = out_features
        self.start = tp.rank * self.part
        self.weight = _param(self.part, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense(x, self.weight)

    def load(self, src: TensorSource) -> None:
        _copy(self.weight, _narrow(src, 0, self.start, self.part, self.full, "column-parallel weight"),
              "column-parallel weight")


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup = SINGLE, inter: int | None = None, reduce: bool = True):
        # ``inter`` overrides the config's width (a shared expert); ``reduce`` as in RowParallelLinear.
        super().__init__()
        inter = inter or cfg.intermediate_size
        self.gate_up = MergedColumnParallelLinear(cfg.hidden_size, inter, tp)
        self.down = RowParallelLinear(inter, cfg.hidden_size, tp, reduce)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)
