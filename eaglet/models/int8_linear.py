"""A float32 weight served in int8 on a CPU, through fbgemm's dynamic int8 GEMM (serving copies only).

On the workplace's 2-core AVX2 CPU the draft's LM head is most of a draft step: [12288, 576] for two rows took
1.78 ms with oneDNN's packed float32 GEMM (``layers.dense``), 1.11 ms in fbgemm's fp16 and 0.57 ms in int8
([24576, 576]: 3.34 / 2.16 / 1.14 ms). The weights are quantized per output row, symmetric, to 8 bits; the
activations per call to 7 bits (``reduce_range``: without AVX-512 VNNI fbgemm's 8-bit products can saturate
their 16-bit sums). The logits move by 1-2% of their range, enough to swap close candidates now and then: for a
draft, which only proposes, acceptance is what counts (docs/performance.md, "The draft's LM head in int8").
A target's weights are never served this way: its outputs must stay those of plain decoding.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn


def int8_gemm_available() -> bool:
    """Whether this torch has fbgemm's dynamic int8 linear for this CPU (x86; not on an Arm host's qnnpack)."""
    try:
        return torch.backends.quantized.engine in ("x86", "fbgemm") and hasattr(torch.ops.quantized,
                                                                                 "linear_dynamic")
    except (AttributeError, RuntimeError):
        return False


def row_scales(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> float32 scales [N]: each row symmetric over its largest magnitude."""
    return (weight.detach().float().abs().amax(1) / 127).clamp_min(1e-12)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (int8 [N, K], float32 scales [N] from ``row_scales``)."""
    w, scales = weight.detach().float(), row_scales(weight)
    return torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8), scales


class Int8Linear(nn.Module):
    """``x @ weight.T`` with ``weight`` [out, in] prepacked in int8, one scale per output row; inference only."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        w = weight.detach().float().contiguous()
        self.out_features, self.in_features = w.shape
        scales = row_scales(w).double()  # torch's per-channel quantizer rounds the weight itself
        zeros = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # torch's quantized tensors warn that they will move to torchao
            warnings.simplefilter("ignore", UserWarning)
            q = torch.quantize_per_channel(w, scales, zeros, 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(q, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.quantized.linear_dynamic(x.reshape(-1, self.in_features), self.packed, True)
        return y.view(*x.shape[:-1], self.out_features)  # [..., out]
