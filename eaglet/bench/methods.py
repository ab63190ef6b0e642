"""The decoding methods a bench compares, each run over the same prompts in batches.

plain: our PlainGenerator; spec: our SpecEngine; hf: transformers' ``generate`` on the
same checkpoint directory, dtype and device; hf-lookup: ``generate`` with prompt lookup
decoding (``prompt_lookup_num_tokens=10``; transformers runs it at batch size 1 only).
Every method stops at the same EOS ids and drops the EOS token, so token counts compare.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from eaglet.generate import StopChecker
from eaglet.sampling import SamplingParams


@dataclass
class Run:
    tokens: list[int]
    seconds: float  # wall time of the batch this prompt ran in
    finish_reason: str
    accept_lengths: list[int] = field(default_factory=list)
    batch: int = 0  # index of that batch within the method's run
    share: float = 0.0  # the batch's seconds apportioned by this prompt's share of its tokens

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_ours(generator, prompts: list[list[int]], params: SamplingParams, batch_size: int,
             start: int = 0) -> list[Run]:
    """PlainGenerator or SpecEngine over ``prompts`` in batches; ``start``: the index of ``prompts[0]`` in the
    whole run (a batch is known by its first prompt's index)."""
    runs = []
    for i in range(0, len(prompts), batch_size):
        batch = prompts[i: i + batch_size]
        _sync(generator.device)
        t0 = time.perf_counter()
        out = generator.generate(batch, params)
        _sync(generator.device)
        dt = time.perf_counter() - t0
        runs += _apportion([Run(c.tokens, dt, c.finish_reason, list(c.accept_lengths)) for c in out], start + i)
    return runs


def _apportion(batch: list[Run], index: int) -> list[Run]:
    total = sum(len(r.tokens) for r in batch)
    for r in batch:
        r.batch = index
        r.share = r.seconds * (len(r.tokens) / total if total else 1 / len(batch))
    return batch


class HFRunner:
    """transformers' generate on the target's own directory (the outside reference)."""

    def __init__(self, target, dtype: torch.dtype, device: str):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(target.path), dtype=dtype).to(device).eval()
        self.device = device
        self.tok = target.tokenizer
        self.eos = sorted(StopChecker(target, SamplingParams()).eos)
        pad = self.tok.pad_token_id
        self.pad = pad if pad is not None else (self.eos[0] if self.eos else 0)

    def _kwargs(self, params: SamplingParams, lookup: bool) -> dict:
        kw = dict(max_new_tokens=params.max_new_tokens, eos_token_id=self.eos or None, pad_token_id=self.pad,
                  do_sample=not params.greedy)
        if not params.greedy:
            kw.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or None)
        else:
            kw.update(temperature=None, top_p=None, top_k=None)
        if lookup:
            kw["prompt_lookup_num_tokens"] = 10
        return kw

    @torch.inference_mode()
    def run(self, prompts: list[list[int]], params: SamplingParams, batch_size: int, lookup: bool,
            start: int = 0) -> list[Run]:
        if lookup:
            batch_size = 1
        kw = self._kwargs(params, lookup)
        runs = []
        for i in range(0, len(prompts), batch_size):
            batch = prompts[i: i + batch_size]
            t = max(len(p) for p in batch)
            ids = torch.full((len(batch), t), self.pad, dtype=torch.long)
            mask = torch.zeros(len(batch), t, dtype=torch.long)
            for j, p in enumerate(batch):  # left padding, as decoder-only generate expects
                ids[j, t - len(p):] = torch.tensor(p)
                mask[j, t - len(p):] = 1
            if params.seed is not None:
                torch.manual_seed(params.seed + start + i)
            _sync(self.device)
            t0 = time.perf_counter()
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), **kw)
            _sync(self.device)
            dt = time.perf_counter() - t0
            done = []
            for row in out[:, t:].tolist():
                cut = next((k for k, x in enumerate(row) if x in self.eos), None)
                done.append(Run(row if cut is None else row[:cut], dt, "length" if cut is None else "stop"))
            runs += _apportion(done, start + i)
        return runs
