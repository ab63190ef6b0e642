"""How fast this machine trains a draft for this target, measured in seconds before a budgeted run regenerates.

``BudgetSplit`` stops regeneration when the time left can just train ``epochs`` passes over the data; that
needs the training rate. A figure measured once (98k padded tokens/s: SmolLM2 on an H200 in session 13)
is wrong for another GPU, another target, and for this code once a training step gets faster: the split
then stops regenerating too early and training ends before the budget does, with less data than the
minutes allowed. So a budgeted run times a few steps of its own: a fresh draft of the run's shape on rows
of random tokens, through the trainer's own pieces (``Featurizer``, ``TTTLoss``, AdamW).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

import torch

from eaglet.data.dataset import TokenData
from eaglet.data.template import Tokenized
from eaglet.draft.model import DraftConfig, Eagle3Draft
from eaglet.draft.vocab import default_draft_vocab_size
from eaglet.loading.target import Target
from eaglet.options import on_cuda_unless_given
from eaglet.train.evaluate import unroll
from eaglet.train.feature_cache import FeatureCache
from eaglet.train.inputs import Featurizer
from eaglet.train.ttt import TTTLoss
from eaglet.train_options import TrainConfig

# A run's padded tokens a second over a bare step's: validation every 250 steps, checkpoints and loading
# batches (session 13's run made 98k a second; its step alone, scripts/train_step_profile.py, 108.8k).
RUN_OVER_STEP = 0.90
ROW_TOKENS = 512  # a probe row: the length of a typical answer with its prompt
CPU_TOKENS = 256  # a probe step's tokens on a CPU, where a step of a whole batch of a 135M target takes a minute


class StepRig:
    """One training step as ``Trainer`` runs it, on random rows of ``ROW_TOKENS`` filling ``batch_tokens``:
    ``step(mark)`` calls ``mark()`` before the features, the TTT forward, the backward and the optimizer, and
    after it (``scripts/train_step_profile.py`` times the phases between)."""

    def __init__(self, target: Target, cfg: TrainConfig, device: torch.device, row_tokens: int = ROW_TOKENS):
        tc = target.config
        capture = cfg.capture(tc.num_layers)
        size = cfg.draft_vocab_size or default_draft_vocab_size(tc.vocab_size)
        with torch.device(device):
            self.draft = Eagle3Draft(DraftConfig.for_target(tc, capture, size, cfg.aux_norm,
                                                            cfg.draft_intermediate_size))
        self.draft.set_vocab(torch.arange(size, device=device))
        t = min(row_tokens, cfg.batch_tokens)
        self.rows = list(range(max(1, cfg.batch_tokens // t)))
        g = torch.Generator().manual_seed(0)
        items = [Tokenized(torch.randint(0, tc.vocab_size, (t,), generator=g).tolist(), [True] * t)
                 for _ in self.rows]
        self.tokens = len(self.rows) * t
        self.feats = Featurizer(target, capture, self.draft.vocab_ids(), TokenData.from_tokenized(items), device)
        self.loss = TTTLoss(self.draft, cfg.ttt_steps, cfg.decay, *cfg.fast_ttt(device), cfg.ttt_reach)
        self.opt = torch.optim.AdamW(self.draft.parameters(), lr=cfg.lr, betas=(0.9, 0.95))
        self.autocast = cfg.autocast if cfg.autocast is not None else device.type == "cuda"
        self.grad_clip = cfg.grad_clip

    def keep_features(self) -> None:
        """From the next step on, the rows' features are kept after their forward and read back (later epochs)."""
        h = self.feats.target.config.hidden_size
        self.feats.cache = FeatureCache(len(self.feats.capture.points) * h, h, self.tokens)

    def step(self, mark: Callable[[], object] = lambda: None) -> list:
        marks = [mark()]
        inp = self.feats(self.rows)
        marks.append(mark())
        loss, _ = unroll(self.loss, inp, self.autocast)
        marks.append(mark())
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        marks.append(mark())
        torch.nn.utils.clip_grad_norm_(self.draft.parameters(), self.grad_clip)
        self.opt.step()
        marks.append(mark())
        return marks


class TrainRates(NamedTuple):
    first: float  # padded tokens a second of a pass whose features the target computes
    cached: float  # of a later pass reading them from memory (``feature_cache``); the first's where none is kept


def train_tokens_per_s(target: Target, cfg: TrainConfig, device: torch.device, steps: int = 4) -> TrainRates:
    """Padded training tokens a second a run of ``cfg`` makes on ``device``: ``steps`` timed steps after two
    warm-up steps (``--compile-loss`` compiles in the first; the run reuses that compile), of CPU_TOKENS on a
    CPU, times RUN_OVER_STEP; then, where the run keeps features, ``steps`` more reading them from memory. Its
    memory is handed back before regeneration sizes its batch from what is free, and the random state is left
    as it was (a run resumed past this point, which times nothing, draws the same)."""
    cuda = device.type == "cuda"

    def timed(rig: StepRig) -> float:
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            rig.step()
        if cuda:
            torch.cuda.synchronize(device)
        return rig.tokens * steps / (time.perf_counter() - t0) * RUN_OVER_STEP

    with torch.random.fork_rng(devices=[device.index or 0] if cuda else []):
        rig = StepRig(target, cfg if cuda else replace(cfg, batch_tokens=min(cfg.batch_tokens, CPU_TOKENS)), device)
        for _ in range(2):
            rig.step()
        first = timed(rig)
        cached = first
        if on_cuda_unless_given(cfg.feature_cache, device):
            rig.keep_features()
            rig.step()  # its features go into the cache
            cached = timed(rig)
        del rig
    if cuda:
        torch.cuda.empty_cache()
    return TrainRates(first, cached)
