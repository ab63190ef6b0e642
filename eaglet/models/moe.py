"""DeepSeek-V3's mixture of experts: group-limited sigmoid routing, routed and shared experts.

Routing, per token: scores = sigmoid(router(x)); the correction bias is added only to choose
(it balances load, it never weights an output); experts sit in ``n_group`` groups, a group's
strength is the sum of its two best biased scores, only the ``topk_group`` strongest groups
may be chosen from, and the top ``num_experts_per_tok`` experts there are picked. Their
unbiased scores, normalised to sum to 1 when ``norm_topk_prob``, times
``routed_scaling_factor``, weight their outputs. The router runs in float32 on the full
residual stream, replicated on every rank, so every rank picks the same experts.

Tensor parallelism: every expert is split over the ranks (tensor-parallel inside each
expert: gate/up by rows, down by columns), not whole experts per rank (expert parallelism).
At decode batch sizes a step touches a few of the experts (8 of 256 per token): split
experts give every rank exactly 1/tp of the bytes the step reads whatever the routing,
while expert parallelism would leave 0..3 of a token's 8 experts on a rank and the step
waits for the most loaded one; and it needs no all-to-all, only the all-reduce a dense MLP
already has. Expert parallelism pays off when batches keep every expert busy (long
prefill, large batches); it is not built.

The routed experts' and the shared experts' partial sums are added before one all-reduce
(a fused reduce): the MoE output is complete on every rank before the residual add, so the
next capture point is the full residual stream.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from eaglet.errors import EagletError
from eaglet.models.deepseek_config import DeepseekConfig
from eaglet.models.layers import MLP, TensorSource, _copy, _narrow, _param
from eaglet.parallel.state import TPGroup


class Router(nn.Module):
    def __init__(self, cfg: DeepseekConfig):
        super().__init__()
        e = cfg.n_routed_experts
        # float32 whatever the model's dtype, as the reference keeps gate.weight and the bias.
        self.weight = nn.Parameter(torch.empty(e, cfg.hidden_size, dtype=torch.float32), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(e, dtype=torch.float32), requires_grad=False)
        self.groups, self.topk_group, self.k = cfg.n_group, cfg.topk_group, cfg.num_experts_per_tok
        self.normalise, self.scaling = cfg.norm_topk_prob, cfg.routed_scaling_factor

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [M, H] -> (weights [M, k] float32, expert ids [M, k])."""
        m, e = x.shape[0], self.weight.shape[0]
        scores = F.linear(x.float(), self.weight).sigmoid()  # [M, E]
        biased = scores + self.bias
        strength = biased.view(m, self.groups, e // self.groups).topk(2, dim=-1).values.sum(-1)  # [M, groups]
        allowed = torch.zeros_like(strength, dtype=torch.bool)
        allowed.scatter_(1, strength.topk(self.topk_group, dim=-1).indices, True)  # [M, groups]
        biased = biased.masked_fill(~allowed.repeat_interleave(e // self.groups, dim=1), float("-inf"))
        ids = biased.topk(self.k, dim=-1).indices  # [M, k]
        weights = scores.gather(1, ids)  # unbiased: the bias only chooses
        if self.normalise:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.scaling, ids

    def load(self, weight: TensorSource, bias: TensorSource) -> None:
        # Replicated: read whole (_copy refuses a shape other than [E, H] and [E]).
        _copy(self.weight, weight.narrow(0, 0, weight.shape[0]), "mlp.gate.weight")
        _copy(self.bias, bias.narrow(0, 0, bias.shape[0]), "mlp.gate.e_score_correction_bias")


def _grouped_mm(a: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Rows a[ends[g-1]:ends[g]] times expert g's weight w[g] [N, K] -> [rows, N]; empty groups cost nothing.

    F.grouped_mm serves CPU (any float dtype) and CUDA bfloat16; other CUDA dtypes loop over the
    experts in use (one host read of ``ends``).
    """
    if not a.is_cuda or a.dtype == torch.bfloat16:
        return F.grouped_mm(a, w.transpose(1, 2), offs=ends)
    out = a.new_empty(a.shape[0], w.shape[1])
    start = 0
    for g, end in enumerate(ends.tolist()):
        if end > start:
            out[start:end] = a[start:end] @ w[g].T
        start = end
    return out


class Experts(nn.Module):
    """The routed experts' weights stacked, each expert split over ranks."""

    def __init__(self, cfg: DeepseekConfig, tp: TPGroup):
        super().__init__()
        inter = cfg.moe_intermediate_size
        if inter % tp.size:
            raise EagletError(f"moe_intermediate_size={inter} does not divide by tp={tp.size}")
        self.full, self.part = inter, inter // tp.size
        self.start = tp.rank * self.part
        self.gate_up = _param(cfg.n_routed_experts, 2 * self.part, cfg.hidden_size)  # [E, 2*I/tp, H]
        self.down = _param(cfg.n_routed_experts, cfg.hidden_size, self.part)  # [E, H, I/tp]

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [M, H], weights and ids [M, k] -> this rank's partial sum [M, H] of the weighted expert outputs."""
        k = ids.shape[1]
        flat = ids.reshape(-1)  # [M*k]: one entry per (token, choice)
        order = flat.argsort(stable=True)  # entries grouped by expert
        token = order // k  # [M*k] the token of each sorted entry
        # Counted by scatter_add, not bincount: bincount reads its output size back to the host,
        # which a CUDA graph cannot hold.
        counts = torch.zeros(self.gate_up.shape[0], dtype=torch.long, device=ids.device)
        ends = counts.scatter_add_(0, flat, torch.ones_like(flat)).cumsum(0).to(torch.int32)  # [E]
        gate, up = _grouped_mm(x[token], self.gate_up, ends).chunk(2, dim=-1)  # [M*k, I/tp] each
        y = _grouped_mm(F.silu(gate) * up, self.down, ends)  # [M*k, H]
        y = (y * weights.reshape(-1)[order].unsqueeze(-1)).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, token, y)

    def load(self, e: int, gate: TensorSource, up: TensorSource, down: TensorSource) -> None:
        p, what = self.part, f"experts.{e}"
        _copy(self.gate_up[e, :p], _narrow(gate, 0, self.start, p, self.full, what + ".gate_proj"), what)
        _copy(self.gate_up[e, p:], _narrow(up, 0, self.start, p, self.full, what + ".up_proj"), what)
        _copy(self.down[e], _narrow(down, 1, self.start, p, self.full, what + ".down_proj"), what)


class MoE(nn.Module):
    def __init__(self, cfg: DeepseekConfig, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.router = Router(cfg)
        self.experts = Experts(cfg, tp)
        width = cfg.moe_intermediate_size * cfg.n_shared_experts
        self.shared = MLP(cfg, tp, inter=width, reduce=False) if width else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # [B*T, H]
        weights, ids = self.router(flat)
        out = self.experts(flat, weights, ids).view_as(x)  # [B, T, H] partial over ranks
        if self.shared is not None:
            out = out + self.shared(x)
        return self.tp.all_reduce(out)  # one all-reduce for routed + shared
