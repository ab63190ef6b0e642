"""The doctor's material: a few chat prompts, the target's own greedy answers, and the
training side's features for them.

Answers come from ``PlainGenerator`` (greedy), as in self-distillation, so "the target's
choice" is well defined at every answer position. Features come from the trainer's
``Featurizer`` (online mode) on prompt + answer: the exact code that feeds the draft in
training, so what the doctor scores the draft on is what it was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglet.bench.prompts import load_prompts
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


@dataclass
class Samples:
    prompts: list[list[int]]
    answers: list[list[int]]  # the target's greedy continuations (EOS dropped)
    labels: list[str]  # where each prompt came from (category or line number)

    @property
    def seqs(self) -> list[list[int]]:
        return [p + a for p, a in zip(self.prompts, self.answers)]

    @property
    def prompt_lens(self) -> torch.Tensor:
        return torch.tensor([len(p) for p in self.prompts])  # [B]

    def token_data(self) -> TokenData:
        return answer_data(self.prompts, self.answers)

    @property
    def answer_tokens(self) -> int:
        return sum(len(a) for a in self.answers)


def answer_data(prompts: list[list[int]], answers: list[list[int]]) -> TokenData:
    """Prompt + answer per row, the loss mask on the answer (as training data marks it)."""
    return TokenData.from_tokenized([Tokenized(p + a, [False] * len(p) + [True] * len(a))
                                     for p, a in zip(prompts, answers)])


def pick_prompts(target: Target, spec: str, k: int, max_tokens: int) -> tuple[list[list[int]], list[str]]:
    """``k`` chat-templated prompts of at most ``max_tokens`` tokens; from the built-in bench set,
    round-robin over its categories so a few prompts still cover code, math, chat, ..."""
    items = load_prompts(spec)
    if spec == "builtin":
        cats: dict[str, list] = {}
        for it in items:
            cats.setdefault(it.category or "", []).append(it)
        queues = list(cats.values())
        items = [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]
    ids, labels = [], []
    for n, it in enumerate(items):
        last_user = max((i for i, m in enumerate(it.messages) if m["role"] == "user"), default=len(it.messages) - 1)
        p = encode_chat(target.tokenizer, it.messages[: last_user + 1])  # what the target answers
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
    # Room for the answer and for a verified chain of draft tokens beyond it.
    prompts, labels = pick_prompts(target, spec, k, capacity - max_new_tokens - 16)
    gen = PlainGenerator(target, capacity, use_graphs=False, compile=False)
    done = gen.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, seed=0))
    keep = [i for i, c in enumerate(done) if len(c.tokens) >= 2]
    if not keep:
        raise EagletError("the target ended every answer at once; the doctor needs answers of 2+ tokens")
    return Samples([prompts[i] for i in keep], [done[i].tokens for i in keep], [labels[i] for i in keep])


def draft_token_ids(draft) -> torch.Tensor:
    return torch.nonzero(draft.t2d).squeeze(1)  # [Vd] target ids of the draft vocabulary


@torch.inference_mode()
def training_features(target: Target, spec: CaptureSpec, draft, data: TokenData) -> StepInputs:
    """What the trainer would feed the draft for ``data`` (Featurizer, online mode)."""
    device = target.model.embed.weight.device
    return Featurizer(target, spec, draft_token_ids(draft).to(device), data, device)(list(range(len(data))))


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
def hit_grids(draft, aux: torch.Tensor, inp: StepInputs, steps: int) -> list[torch.Tensor]:
    """Teacher-forced hits of each draft step at every anchor: per step ``j``, [B, T] bool.

    The draft unrolls exactly as in training (``TTTLoss.unroll``); step ``j`` at anchor ``t``
    hits when its argmax, mapped to a target id, equals the target's argmax at ``t+j+1``
    (False where that position lies beyond the row).
    """
    t = inp.ids.shape[1]
    grids = []
    for j, out in enumerate(TTTLoss(draft, steps).unroll(aux, inp.emb)):
        pred = draft.to_target_ids(draft.logits(out[:, : max(t - j - 1, 0)]).argmax(-1))  # [B, T-j-1]
        hit = torch.zeros_like(inp.mask)
        hit[:, : pred.shape[1]] = pred == inp.target_top[:, j + 1:]
        grids.append(hit.cpu())
    return grids


def step_hits(draft, aux: torch.Tensor, inp: StepInputs, prompt_lens: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Per draft step, [n_j] bool hits over the anchors ``anchors`` selects (row-major order).

    Unlike training accuracy, anchors whose answer token lies outside the draft vocabulary
    count (as misses): the engine can never accept such a token either.
    """
    return [g[anchors(inp, prompt_lens, j).cpu()] for j, g in enumerate(hit_grids(draft, aux, inp, steps))]
