"""The training-time test's attention without its dense mask: a causal flash attention plus the chain's keys.

Step ``j`` of the unroll (``ttt.TTTLoss``) lets the query at anchor ``t`` see the step-0 keys of anchors
``0..t`` (causal) and one key of each later step ``1..j`` at anchor ``t`` itself (its own chain). The dense
form attends over ``(j+1)*T`` keys a query under a [T, (j+1)*T] mask that is mostly empty: on the H200 its
memory-efficient kernel and backward took 28 of a 16k-token step's 138 ms of kernels (session 16). Here the
causal part is one flash attention (which also returns its log-sum-exp) and the chain's ``j`` scores a
query are dot products; the two are merged by their log-sum-exps, exactly. Backward: the flash backward
given the merged output and log-sum-exp yields the causal keys' share of the merged attention's gradients
(what split-key attention relies on); the chain's share is written out below. An experiment until
``scripts/train_step_profile.py`` has timed it on the GPU (``eaglet train --fused-ttt-attention``).
"""

from __future__ import annotations

import torch


def _dots(x: torch.Tensor, chain: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] with each of the chain's J vectors at its own anchor, chain [B, H, T, J, D] -> [B, H, T, J]
    (an elementwise product and a sum: a batched GEMM of 1 x D x J matrices would be millions of tiny ones)."""
    return (x.float().unsqueeze(-2) * chain.float()).sum(-1)


def _mix(w: torch.Tensor, chain: torch.Tensor) -> torch.Tensor:
    """w [B, H, T, J], chain [B, H, T, J, D] -> sum_j w_j chain_j [B, H, T, D] (float32)."""
    return (w.unsqueeze(-1) * chain.float()).sum(-2)


def applies(q: torch.Tensor) -> bool:
    """The flash kernels behind it: any dtype on the CPU, half precision on CUDA."""
    return q.device.type == "cpu" or (q.is_cuda and q.dtype in (torch.bfloat16, torch.float16))


def _causal(q, k, v, scale):
    """q, k, v [B, H, T, D] -> (out [B, H, T, D], lse [B, H, T] float32, what the backward needs)."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
        return out, lse, ()
    res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False, scale=scale)
    return res[0], res[1], res[2:8]


def _causal_backward(dout, q, k, v, out, lse, scale, saved):
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, True, scale=scale)
    cum_q, cum_k, max_q, max_k, seed, offset = saved
    return torch.ops.aten._scaled_dot_product_flash_attention_backward(
        dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, True, seed, offset, scale=scale)


class _TTTAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k0, v0, kc, vc, scale):
        """q, k0, v0 [B, H, T, D]; kc, vc [B, H, T, J, D] the chain's keys and values (J >= 1)."""
        with torch.autocast(q.device.type, enabled=False):
            out_c, lse_c, saved = _causal(q, k0, v0, scale)
            s = _dots(q, kc) * scale  # [B, H, T, J]
            top = torch.maximum(lse_c, s.amax(-1))  # [B, H, T]
            w_c, w = (lse_c - top).exp(), (s - top.unsqueeze(-1)).exp()
            z = w_c + w.sum(-1)
            out = w_c.unsqueeze(-1) * out_c.float() + _mix(w, vc)
            out = (out / z.unsqueeze(-1)).to(q.dtype)
            lse = top + z.log()
        ctx.scale, ctx.saved = scale, saved
        ctx.save_for_backward(q, k0, v0, kc, vc, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k0, v0, kc, vc, out, lse = ctx.saved_tensors
        scale = ctx.scale
        with torch.autocast(q.device.type, enabled=False):
            dout = dout.contiguous()
            dq_c, dk0, dv0 = _causal_backward(dout, q, k0, v0, out, lse, scale, ctx.saved)
            p = (_dots(q, kc) * scale - lse.unsqueeze(-1)).exp()  # [B, H, T, J] the chain's share of attention
            delta = (dout.float() * out.float()).sum(-1, keepdim=True)  # [B, H, T, 1]
            ds = p * (_dots(dout, vc) - delta)  # [B, H, T, J]
            dq = dq_c.float() + _mix(ds, kc) * scale
            dkc = ds.unsqueeze(-1) * q.float().unsqueeze(-2) * scale  # [B, H, T, J, D]
            dvc = p.unsqueeze(-1) * dout.float().unsqueeze(-2)
        return dq.to(q.dtype), dk0, dv0, dkc.to(kc.dtype), dvc.to(vc.dtype), None


def ttt_attention(q: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """q [B, nq, T, D]; past: each step's (K, V) [B, nkv, T, D] so far, step 0 first -> [B, nq, T, D]."""
    g = q.shape[1] // past[0][0].shape[1]
    k0, v0 = (x.repeat_interleave(g, dim=1) for x in past[0])  # [B, nq, T, D]: the flash kernel has no GQA
    scale = q.shape[-1] ** -0.5
    if len(past) == 1:
        return torch.nn.functional.scaled_dot_product_attention(q, k0, v0, is_causal=True, scale=scale)
    kc, vc = (torch.stack([p[i] for p in past[1:]], dim=3).repeat_interleave(g, dim=1) for i in (0, 1))
    return _TTTAttention.apply(q, k0, v0, kc, vc, scale)  # kc, vc [B, nq, T, J, D]
