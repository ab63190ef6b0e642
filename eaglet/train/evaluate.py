"""Scoring a draft offline: acc_j and the predicted accept length on conversations it never trained on.

``score`` is the validation loop the trainer runs; ``evaluate_sources`` runs it on an
exported draft once per source of a regenerated file (the evals held out, human-eval,
held-back chats, held-out Magpie prompts, second turns), so an ablation reports how each
kind of traffic would be served, not only the pooled number.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from eaglet.data.dataset import TokenData, length_batches
from eaglet.data.prompts import Conversation
from eaglet.data.template import tokenize_conversations
from eaglet.draft.model import Eagle3Draft
from eaglet.loading.target import Target
from eaglet.train.inputs import Featurizer, StepInputs
from eaglet.train.report import summarize
from eaglet.train.ttt import STATS, TTTLoss


def unroll(model: torch.nn.Module, inp: StepInputs, autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The TTT unroll of ``model`` (a TTTLoss, or DDP around one) on one batch: (loss, stats)."""
    with torch.autocast(inp.ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        return model(inp.aux, inp.emb, inp.ids, inp.mask, inp.target_logp, inp.target_top)


@torch.no_grad()
def score(feats: Featurizer, batches: Iterable[list[int]], forward: Callable[[StepInputs], tuple],
          steps: int, device: torch.device) -> torch.Tensor:
    """Summed stats [steps, STATS] (``TTTLoss``'s columns) over ``batches`` of ``feats``' source."""
    total = torch.zeros(steps, STATS, device=device, dtype=torch.float64)
    for rows in batches:
        total += forward(feats(rows))[1].double()
    return total


def evaluate_sources(target: Target, draft: Eagle3Draft, convs: list[Conversation], eos_ids: set[int],
                     ttt_steps: int = 7, decay: float = 0.8, batch_tokens: int = 16384, max_len: int = 2048,
                     earlier_turns: bool = True) -> dict[str, dict]:
    """{source: summarize() row} for each source of ``convs``, and ``"all"`` for them pooled."""
    dev = target.model.embed.weight.device
    loss = TTTLoss(draft.to(dev), ttt_steps, decay)
    draft_ids = draft.vocab_ids()
    autocast = dev.type == "cuda"
    groups: dict[str, list[Conversation]] = {"all": convs}
    for c in convs:
        groups.setdefault(c.source or "unknown", []).append(c)
    out = {}
    for name, group in groups.items():
        items = [t for t in tokenize_conversations(target.tokenizer, group, eos_ids, max_len,
                                                   earlier_turns=earlier_turns) if t]
        if not items:
            continue
        data = TokenData.from_tokenized(items)
        feats = Featurizer(target, draft.config.capture, draft_ids, data, dev, max_len)
        total = score(feats, length_batches(data.lengths, batch_tokens, 0), lambda inp: unroll(loss, inp, autocast),
                      ttt_steps, dev)
        out[name] = {**summarize(total, decay), "conversations": len(items)}
    return out
