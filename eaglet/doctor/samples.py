"""The doctor's material: a few chat prompts, the target's own greedy answers, and the
training side's features for them.

Answers come from ``PlainGenerator`` (greedy), as in self-distillation, so "the target's
choice" is well defined at every answer position. Features come from the trainer's
``Featurizer`` (online mode) on prompt + answer: the exact code that feeds the draft in
training, so what the doctor scores the draft on is what it was trained on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from eaglet.bench.prompts import by_category, load_prompts
from eaglet.capture import CaptureSpec
from eaglet.chat import encode_chat
from eaglet.data.dataset import TokenData
from eaglet.data.template import Tokenized
from eaglet.errors import EagletError
from eaglet.generate import PlainGenerator
from eaglet.loading.target import Target
from eaglet.sampling import SamplingParams
from eaglet.train.inputs import Featurizer, StepInputs
from eaglet.train.ttt import TTTLoss, shift_left

MAX_PROMPT_TOKENS = 256


@dataclass
class Samples:
    prompts: list[list[int]]
    answers: list[list[int]]  # the target's greedy continuations (EOS dropped)
    labels: list[str]  # where each prompt came from (category or line number)

    @property
    def prompt_lens(self) -> torch.Tensor:
        return torch.tensor([len(p) for p in self.prompts])  # [B]

    def token_data(self) -> TokenData:
        return answer_data(self.prompts, self.answers)


def answer_data(prompts: list[list[int]], answers: list[list[int]]) -> TokenData:
    """Prompt + answer per row, the loss mask on the answer (as training data marks it)."""
    return TokenData.from_tokenized([Tokenized(p + a, [False] * len(p) + [True] * len(a))
                                     for p, a in zip(prompts, answers)])


def prompt_ids(tokenizer, messages) -> list[int]:
    """The chat-templated ids of ``messages`` up to the last user turn: what the target answers."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=len(messages) - 1)
    return encode_chat(tokenizer, list(messages[: last_user + 1]))


def pick_prompts(target: Target, spec: str, k: int, max_tokens: int) -> tuple[list[list[int]], list[str]]:
    """``k`` chat-templated prompts of at most ``max_tokens`` tokens, round-robin over the set's categories
    so that a few prompts still cover code, math, chat, ..."""
    items = by_category(load_prompts(spec))
    ids, labels = [], []
    for n, it in enumerate(items):
        p = prompt_ids(target.tokenizer, it.messages)
        if len(p) <= max_tokens:
            ids.append(p)
            labels.append(it.category or f"line {n + 1}")
        if len(ids) == k:
            break
    if not ids:
        raise EagletError(f"no prompt of {spec} fits in {max_tokens} tokens; pass shorter prompts or raise "
                          "--max-context")
    return ids, labels


def make_samples(target: Target, spec: str, k: int, max_new_tokens: int, capacity: int) -> Samples:
    # Room for the answer and for a verified chain of draft tokens beyond it; and short prompts:
    # the draft is scored on the answers, and every forward pads the batch to its longest row.
    prompts, labels = pick_prompts(target, spec, k, min(MAX_PROMPT_TOKENS, capacity - max_new_tokens - 16))
    return answered(target, prompts, labels, max_new_tokens, capacity)


def answered(target: Target, prompts: list[list[int]], labels: list[str], max_new_tokens: int, capacity: int,
             batch: int | None = None) -> Samples:
    """The target's greedy answers to ``prompts`` (``batch`` at a time; default all), those of 2+ tokens kept."""
    gen = PlainGenerator(target, capacity, use_graphs=False, compile=False)
    step = batch or len(prompts)
    done = [c for i in range(0, len(prompts), step)
            for c in gen.generate(prompts[i: i + step], SamplingParams(max_new_tokens=max_new_tokens, seed=0))]
    keep = [i for i, c in enumerate(done) if len(c.tokens) >= 2]
    if not keep:
        raise EagletError("the target ended every answer at once; the doctor needs answers of 2+ tokens")
    return Samples([prompts[i] for i in keep], [done[i].tokens for i in keep], [labels[i] for i in keep])


@torch.inference_mode()
def step0_by_conversation(target: Target, draft, s: Samples) -> Iterator[tuple[int, StepInputs, torch.Tensor,
                                                                                 torch.Tensor, torch.Tensor]]:
    """Per conversation of ``s``, one at a time (a padded batch of long answers is large on a CPU): (its index,
    what training feeds the draft, the answer anchors' rows and columns [n] as ``anchors`` gives them, and draft
    step 0's pre-norm output there [n, H])."""
    for i in range(len(s.prompts)):
        one = Samples(s.prompts[i: i + 1], s.answers[i: i + 1], s.labels[i: i + 1])
        inp = training_features(target, draft.config.capture, draft, one.token_data())
        rows, cols = anchors(inp, one.prompt_lens, 0).nonzero(as_tuple=True)
        yield i, inp, rows, cols, TTTLoss(draft, 1).unroll(inp.aux, inp.emb)[0][rows, cols]


@torch.inference_mode()
def training_features(target: Target, spec: CaptureSpec, draft, data: TokenData) -> StepInputs:
    """What the trainer would feed the draft for ``data`` (Featurizer, online mode)."""
    device = target.model.embed.weight.device
    return Featurizer(target, spec, draft.vocab_ids().to(device), data, device)(list(range(len(data))))


def select_points(aux: torch.Tensor, all_points: tuple[int, ...], points: tuple[int, ...], hidden: int) -> torch.Tensor:
    """Slices of an all-points capture [B, T, len(all)*H] -> the given points [B, T, k*H], in order."""
    at = {p: i for i, p in enumerate(all_points)}
    return torch.cat([aux[..., at[p] * hidden: (at[p] + 1) * hidden] for p in points], dim=-1)


def anchors(inp: StepInputs, prompt_lens: torch.Tensor, step: int) -> torch.Tensor:
    """[B, T] bool: anchors ``t`` where draft step ``step`` has an answer token to predict, as in serving.

    The engine's first tree grows from anchor P-1 (its root is the first answer token), so
    ``t >= P-1``; step ``j`` predicts ``x_{t+j+2}``, which must be an answer token.
    """
    t = torch.arange(inp.ids.shape[1], device=inp.ids.device)
    return shift_left(inp.mask, step + 2) & (t.view(1, -1) >= (prompt_lens.to(t.device) - 1).view(-1, 1))


@torch.inference_mode()
def hit_grids(draft, aux: torch.Tensor, inp: StepInputs, prompt_lens: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Teacher-forced hits of each draft step at every answer anchor: per step ``j``, [B, T] bool.

    The draft unrolls exactly as in training (``TTTLoss.unroll``); step ``j`` at anchor ``t``
    hits when its argmax, mapped to a target id, equals the target's argmax at ``t+j+1``.
    False before the first anchor ``P-1`` of the shortest prompt and where ``t+j+1`` lies
    beyond the row (the LM head runs on answer anchors only: prompts are most of the tokens).
    """
    t = inp.ids.shape[1]
    lo = max(int(prompt_lens.min()) - 1, 0)
    grids = []
    for j, out in enumerate(TTTLoss(draft, steps).unroll(aux, inp.emb)):
        hi = max(t - j - 1, lo)
        pred = draft.to_target_ids(draft.logits(out[:, lo:hi]).argmax(-1))  # [B, hi-lo]
        hit = torch.zeros_like(inp.mask)
        hit[:, lo:hi] = pred == inp.target_top[:, lo + j + 1: hi + j + 1]
        grids.append(hit.cpu())
    return grids


@torch.inference_mode()
def step0_scores(draft, aux: torch.Tensor, inp: StepInputs,
                 prompt_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft step 0 at every answer anchor (row-major order): (hit [n] bool, cross-entropy [n] float).

    A hit is the draft's argmax, mapped to a target id, equal to the target's argmax; anchors
    whose answer token lies outside the draft vocabulary count as misses (the engine can
    never accept such a token either). The cross-entropy is training's loss at that anchor:
    the target's distribution over the draft vocabulary against the draft's.
    """
    out = TTTLoss(draft, 1).unroll(aux, inp.emb)[0]
    rows, cols = anchors(inp, prompt_lens, 0).nonzero(as_tuple=True)
    logp = draft.logits(out[rows, cols]).float().log_softmax(-1)  # [n, Vd]
    hit = draft.to_target_ids(logp.argmax(-1)) == inp.target_top[rows, cols + 1]
    ce = -(inp.target_logp[rows, cols + 1].exp() * logp).sum(-1)
    return hit.cpu(), ce.cpu()
