"""Training-time test (EAGLE-3, arXiv 2503.01840): the draft unrolled over its own outputs.

For anchor position ``t`` and draft step ``j`` (0-based), exactly as the engine runs it:

- step 0 reads ``fuse(target aux at t)`` and ``embed(x_{t+1})`` at rotary position ``t``;
- step ``j`` reads the draft's pre-norm output of step ``j-1`` at anchor ``t`` and
  ``embed(x_{t+j+1})`` at position ``t + j``;
- step ``j`` at anchor ``t`` attends to step-0 keys at anchors ``0..t`` (causal) and to
  the keys of steps ``1..j`` at anchor ``t`` only (its own chain);
- step ``j`` predicts ``x_{t+j+2}``. Its label is the target's distribution at position
  ``t+j+1`` restricted to the draft vocabulary and renormalised (soft cross-entropy);
  positions where ``x_{t+j+2}`` is not an assistant token, lies outside the draft
  vocabulary, or lies beyond the sequence are masked.

The loss is ``sum_j decay^j * CE_j`` (decay 0.8). With ``reach`` K > 0 (``--ttt-reach``, training only) step ``j``
counts an anchor only while each earlier step ``i`` had the token it predicts, ``x_{t+i+2}`` (the next step's input;
in greedy data the target's argmax), among the draft's top K: a tree whose nodes branch K ways never holds the other
chains, so their loss spends capacity on states serving never reaches (GRIFFIN's token-alignable training, arXiv
2502.11018, with EAGLE-3's unroll). ``acc_j`` is the fraction of unmasked
positions where the draft's argmax (mapped to target ids) equals the target's argmax at
``t+j+1``. Inputs are the data tokens (teacher forcing), so ``acc_j`` is conditioned on
ground-truth tokens; with self-distilled greedy data those are the target's own choices.
``acc_all_j`` counts the positions masked only for lying outside the draft vocabulary as misses
(serving cannot propose those tokens), so it is what a verify sees; ``acc_j`` is the figure other
EAGLE-3 trainers report. ``acc_serve_j`` is ``acc_all_j`` over labels among the first
``SERVE_WINDOW`` tokens of their assistant turn: the part of an answer a serving benchmark decodes.
Pooled figures are dominated by long answers' later tokens, which a small target often makes
repetitive and so easy (SmolLM2's shipped draft, step 0: held-back chats 0.74 over answer tokens
0-31, 0.99 over tokens 256-511; held-out Magpie prompts 0.65 and 0.85; docs/training.md).
"""

from __future__ import annotations

import torch
from torch import nn

from eaglet.draft.model import DraftAttention, Eagle3Draft
from eaglet.kv_cache import AttnMeta

SERVE_WINDOW = 128  # answer tokens ``acc_serve_j`` looks at: a typical benchmark answer's length
STATS = 6  # columns of TTTLoss's stats (see its forward)


def predicted_accept_length(acc: list[float]) -> float:
    """Expected tokens per verify of a k-step chain: 1 + sum_i prod_{j<=i} acc_j (bonus token included)."""
    total, run = 1.0, 1.0
    for a in acc:
        run *= a
        total += run
    return total


def ttt_mask(t: int, steps: int, device: torch.device | str) -> torch.Tensor:
    """[1, 1, T, steps*T] bool: causal over step-0 keys, then one diagonal block per later step.

    Step j uses the first (j+1)*T columns: its own keys are the j-th diagonal block.
    """
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * (steps - 1), dim=1).view(1, 1, t, steps * t)


def answer_index(mask: torch.Tensor) -> torch.Tensor:
    """mask [B, T] bool (assistant tokens) -> [B, T] long: each token's index within its run of True
    (its assistant turn), counting from 0; -1 outside."""
    count = mask.long().cumsum(1)
    before = torch.cummax(torch.where(mask, torch.zeros_like(count), count), dim=1).values  # count at the run's start
    return torch.where(mask, count - before - 1, torch.full_like(count, -1))


def shift_left(x: torch.Tensor, k: int) -> torch.Tensor:
    """x[:, k:] padded with zeros (False) at the end to keep length T: x [B, T, ...]."""
    pad = torch.zeros_like(x[:, :k])
    return torch.cat([x[:, k:], pad], dim=1)[:, : x.shape[1]]


def sharpen(target_logp: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs [..., V] -> the log-probs of the same distribution at ``temperature``: log_softmax(logits / T) for
    any logits they came from (a log-softmax shifts each row by a constant, which the division only scales)."""
    return (target_logp / temperature).log_softmax(-1)


def soft_ce(logits: torch.Tensor, target_logp: torch.Tensor, at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [n, Vd] (bf16 under autocast), target_logp [N, Vd] float32 log-probs, at [n] the label row of each
    -> (soft cross-entropy [n] float32, the argmax of each row of logits [n])."""
    logp = logits.float().log_softmax(-1)
    return -(target_logp[at].exp() * logp).sum(-1), logp.argmax(-1)


def in_top_k(logits: torch.Tensor, label: torch.Tensor, k: int) -> torch.Tensor:
    """logits [n, Vd], label [n] draft-vocabulary indices -> [n] bool: fewer than ``k`` logits exceed the label's
    (the label is among the top ``k``, ties in its favour)."""
    return (logits > logits.gather(1, label[:, None])).sum(-1) < k


# A few fused kernels each way instead of eager's passes over [n, Vd] float32 in every TTT step (the cast,
# the log-softmax, the labels' gather and exp, the product, the sum, the argmax, and their backward): on the
# H200 a 16k-token step of SmolLM2's draft (vocabulary 24,576) spent at least ~20 of its 138 ms of kernels in
# the softmaxes, exp, gathers and argmax alone (scripts/train_step_profile.py, session 16). An experiment
# until that script has timed it on the GPU. Dynamic: n changes with every batch and step; compiled at the
# first call.
fused_soft_ce = torch.compile(soft_ce, dynamic=True)


class TTTLoss(nn.Module):
    """The whole unroll as one module, so DDP sees a single forward per training step. ``compile_loss``: the
    soft cross-entropy through torch.compile (``fused_soft_ce``; --compile-loss); ``fused_attention``: the
    draft's attention without the dense mask (``draft.ttt_attention``; --fused-ttt-attention); ``reach``: the
    top-K mask of later steps (module docstring), applied where autograd records, so validation scores every
    anchor as before."""

    def __init__(self, draft: Eagle3Draft, steps: int = 7, decay: float = 0.8, compile_loss: bool = False,
                 fused_attention: bool = False, reach: int = 0):
        super().__init__()
        self.draft = draft
        self.steps = steps
        self.decay = decay
        self.reach = reach
        self.soft_ce = fused_soft_ce if compile_loss else soft_ce
        for m in draft.modules():
            if isinstance(m, DraftAttention):
                m.ttt_fused = fused_attention

    def forward(self, aux: torch.Tensor, emb: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor,
                target_logp: torch.Tensor, target_top: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """aux [B, T, k*H], emb [B, T, H] (target embeddings of ids), ids [B, T], mask [B, T] (assistant),
        target_logp [B, T, Vd] (target log-probs over the draft vocabulary), target_top [B, T] (target argmax).

        Returns (loss, stats [steps, STATS] = per step: sum of CE, correct argmaxes, counted positions, the
        assistant positions outside the draft vocabulary included (acc_all's denominator), and of those
        within the serving window its correct argmaxes and its positions).
        """
        draft = self.draft
        label_ok = mask & draft.t2d[ids]  # [B, T]: token p may be a label
        window = mask & (answer_index(mask) < SERVE_WINDOW)  # [B, T]
        loss = aux.new_zeros((), dtype=torch.float32)
        t, labels = ids.shape[1], target_logp.reshape(-1, target_logp.shape[-1])  # [B*T, Vd]
        reach = self.reach if torch.is_grad_enabled() else 0
        alive = torch.ones_like(label_ok)  # [B, T]: anchors whose chain a K-way tree still holds at step j
        next_ids = draft.to_draft_ids(ids).view(-1) if reach else None  # [B*T] (where label_ok holds, exact)
        stats = []
        for j, out in enumerate(self.unroll(aux, emb)):
            held = alive  # [B, T] this step's anchors (with reach, the statistics count these only)
            rows, cols = (shift_left(label_ok, j + 2) & held).nonzero(as_tuple=True)  # anchors with a label
            logits = draft.logits(out[rows, cols])  # [n, Vd]
            at = rows * t + cols + j + 1
            ce, top = self.soft_ce(logits, labels, at)  # [n] each
            if reach:  # a chain whose next token missed the top K, or had no label, ends here
                alive = torch.zeros_like(alive)
                alive[rows, cols] = in_top_k(logits.detach(), next_ids[at + 1], reach)
            n = ce.numel()
            loss = loss + self.decay**j * ce.sum() / max(n, 1)
            with torch.no_grad():
                hit = draft.to_target_ids(top) == target_top[rows, cols + j + 1]
                n_all = (shift_left(mask, j + 2) & held).sum().float()  # out-of-vocabulary labels count, as misses
                in_win = shift_left(window, j + 2) & held
                hit_win = (hit & in_win[rows, cols]).sum().float()
                stats.append(torch.stack([ce.detach().sum(), hit.sum().float(), ce.new_tensor(float(n)), n_all,
                                          hit_win, in_win.sum().float()]))
        return loss, torch.stack(stats)

    def unroll(self, aux: torch.Tensor, emb: torch.Tensor) -> list[torch.Tensor]:
        """The draft's pre-norm output of every step at every anchor: steps x [B, T, H]."""
        draft = self.draft
        b, t, _ = emb.shape
        attn = ttt_mask(t, self.steps, emb.device)
        hidden = draft.fuse(aux)  # [B, T, H]
        past: list = []
        outs = []
        for j in range(self.steps):
            pos = (torch.arange(t, device=emb.device) + j).expand(b, t)  # [B, T]
            meta = AttnMeta(pos, pos, attn[..., : (j + 1) * t])
            hidden = draft(hidden, shift_left(emb, j + 1), meta, past=past)  # [B, T, H]
            outs.append(hidden)
        return outs
