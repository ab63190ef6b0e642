"""Check 5's served draft: does the draft as the engine serves it propose what the trained one does?

Serving may change the head the draft was trained with: a CPU serves it in int8 (``Int8Linear``) over the target's
whole vocabulary (``extend_vocab``: rows for the tokens it lacks mapped from the target's head), or in float32 cut to
the most frequent tokens (``keep_vocab``); a GPU in int8 on request (``CudaInt8Linear``); ``--draft-vocab`` /
``--int8-draft-head`` / ``--extend-draft-vocab`` choose. A CPU also serves ``fc`` and the layer in int8 by default
(``--int8-draft-layer``, ``Eagle3Draft.int8_projections``). Each draft is unrolled teacher-forced as in training
(``TTTLoss.unroll``; the served one once more only where its trunk differs, and then through its serving copies,
which serve every forward autograd does not record), and each head reads its own draft's output of each step at
the answer anchors: how often each proposes the target's next token (acc_j, and the chain's predicted accept
length from them) and how often the two propose the same token. A served head that loses more than ``TAU_DROP``
of the predicted accept length warns: the serving setting spends what training bought.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglet.doctor.samples import anchors
from eaglet.speculative.load import int8_served
from eaglet.train.inputs import StepInputs
from eaglet.train.ttt import TTTLoss, predicted_accept_length

TAU_DROP = 0.1


@dataclass
class HeadComparison:
    served: str  # how the engine serves it, e.g. "int8, the whole vocabulary (24,576 tokens); the layer in int8"
    same_as_trained: bool  # float, the whole vocabulary: nothing compared, the lists below empty
    acc_trained: list[float]  # per draft step, over answer anchors
    acc_served: list[float]
    same_top1: list[float]  # the two heads' proposals equal (in target ids)
    anchors: int  # step 0's

    @property
    def tau_trained(self) -> float:
        return predicted_accept_length(self.acc_trained)

    @property
    def tau_served(self) -> float:
        return predicted_accept_length(self.acc_served)


def describe(trained, served) -> str:
    int8_head, int8_layer = int8_served(served)
    kind = "int8" if int8_head else str(served.norm.weight.dtype).removeprefix("torch.")
    layer = "; the layer in int8" if int8_layer else ""
    n, whole = served.config.draft_vocab_size, trained.config.draft_vocab_size
    if n > whole:  # extended (``extend_vocab``)
        return f"{kind}, its {whole:,} tokens and {n - whole:,} mapped from the target's head (all {n:,}){layer}"
    if n == whole:
        return f"{kind}, the whole vocabulary ({n:,} tokens){layer}"
    return f"{kind}, {n:,} of its {whole:,} tokens{layer}"


@torch.inference_mode()
def compare_heads(trained, served, aux: torch.Tensor, inp: StepInputs, prompt_lens: torch.Tensor,
                  steps: int) -> HeadComparison:
    """The trained draft against its serving copy ``served`` (``load_engine_draft``) over a ``steps`` chain."""
    int8_head, int8_layer = int8_served(served)
    if not (int8_head or int8_layer) and served.config.draft_vocab_size == trained.config.draft_vocab_size:
        return HeadComparison(describe(trained, served), True, [], [], [], 0)  # as trained: nothing to compare
    outs = TTTLoss(trained, steps).unroll(aux, inp.emb)
    served_outs = TTTLoss(served, steps).unroll(aux, inp.emb) if int8_layer else outs
    acc_t, acc_s, agree = [], [], []
    n0 = 0  # step 0's anchors
    for j, (out, served_out) in enumerate(zip(outs, served_outs)):
        rows, cols = anchors(inp, prompt_lens, j).nonzero(as_tuple=True)
        n0 = n0 if j else rows.numel()
        label = inp.target_top[rows, cols + j + 1]  # [n] the target's token step j proposes for
        pt = trained.to_target_ids(trained.logits(out[rows, cols]).argmax(-1))  # [n] from step j's output [n, H]
        ps = served.to_target_ids(served.logits(served_out[rows, cols]).argmax(-1))
        n = max(rows.numel(), 1)
        acc_t.append(int((pt == label).sum()) / n)
        acc_s.append(int((ps == label).sum()) / n)
        agree.append(int((pt == ps).sum()) / n if rows.numel() else 1.0)
    return HeadComparison(describe(trained, served), False, acc_t, acc_s, agree, n0)
