"""What the serving engine feeds the draft, recorded from a real ``SpecEngine`` run.

The engine gets the draft wrapped in ``FuseTap``, which passes every call through and
records each ``fuse`` input (the target's captured points the engine hands the draft)
and the anchor call that follows it (the token embeddings and rotary positions of those
anchors). Nothing of the engine is re-implemented: prefill, tree growth, verification,
acceptance and the draft-cache extension all run as in serving, so a fault anywhere on
that path shows up in what the tap saw. The engine runs eagerly (a CUDA graph replays
without calling Python, so nothing could be recorded); on CUDA it keeps the static shapes
its graphs use.

Where the recorded rows belong: the first ``fuse`` call is ``draft_prefill`` (anchors
``0..P-1`` of each row); every later one is ``commit_and_extend`` after a verify, whose
first ``accept_length`` rows are the accepted path (root first) at the next positions.
A row's verifies are its ``accept_lengths``, in order, and a finished row takes part in
no later verify.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglet.errors import EagletError
from eaglet.loading.target import Target
from eaglet.sampling import SamplingParams
from eaglet.speculative.engine import SpecEngine


class FuseTap:
    """The draft, with ``fuse`` inputs and the anchor inputs that follow them recorded."""

    def __init__(self, draft):
        self._draft = draft
        self.calls: list[dict[str, torch.Tensor]] = []  # per fuse call: aux, then emb and positions
        self._pending = False

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        self.calls.append({"aux": aux.detach().float().cpu()})
        self._pending = True
        return self._draft.fuse(aux)

    def __call__(self, hidden, emb, meta, cache=None, past=None):
        if self._pending:  # the anchor forward right after fuse: its token inputs and positions
            self.calls[-1].update(emb=emb.detach().float().cpu(), positions=meta.positions.detach().cpu())
            self._pending = False
        return self._draft(hidden, emb, meta, cache, past)

    def __getattr__(self, name):
        return getattr(self._draft, name)


@dataclass
class ServingRun:
    prompts: list[list[int]]
    completions: list[list[int]]
    accept_lengths: list[list[int]]  # per row, per verify: tokens emitted (bonus included)
    fed: list[torch.Tensor]  # per row [L, k*H]: the features fed at each position (NaN: never fed)
    emb: list[torch.Tensor]  # per row [L, H]: token embedding fed with each anchor (NaN: never fed)
    positions: list[torch.Tensor]  # per row [L]: rotary position of each anchor (-1: never fed)
    tree: str  # the engine's tree, as it describes it


def _place(run: ServingRun, row: int, start: int, n: int, call: dict, b: int) -> None:
    """Write rows ``0..n-1`` of call tensors (batch row ``b``) at positions ``start..``, within the sequence."""
    n = max(0, min(n, run.fed[row].shape[0] - start))
    if n == 0:
        return
    run.fed[row][start: start + n] = call["aux"][b, :n]
    if "emb" in call:
        run.emb[row][start: start + n] = call["emb"][b, :n]
        run.positions[row][start: start + n] = call["positions"][b, :n]


def serve_chain(target: Target, draft, prompts: list[list[int]], num_steps: int, max_new_tokens: int,
                max_context: int | None) -> ServingRun:
    """Greedy speculative decoding of ``prompts`` in one batch with a chain of ``num_steps`` draft tokens
    (topk=1), never falling back to plain decoding, with the draft's inputs recorded."""
    tap = FuseTap(draft)
    logs: list[str] = []
    # Eager, so the tap sees every call; on CUDA with the static shapes graphs use (whole-cache attention).
    on_cuda = target.model.embed.weight.device.type == "cuda"
    engine = SpecEngine(target, tap, max_context=max_context, num_steps=num_steps, topk=1,
                        num_draft_tokens=num_steps + 1, use_graphs=False, adaptive=False, log=logs.append,
                        static_shapes=on_cuda)
    done = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, seed=0))
    h, kh = target.config.hidden_size, draft.config.capture.k * target.config.hidden_size
    lens = [len(p) + len(c.tokens) for p, c in zip(prompts, done)]
    nan = float("nan")
    run = ServingRun(prompts, [c.tokens for c in done], [list(c.accept_lengths) for c in done],
                     [torch.full((n, kh), nan) for n in lens], [torch.full((n, h), nan) for n in lens],
                     [torch.full((n,), -1, dtype=torch.long) for n in lens], logs[0] if logs else "")
    if not tap.calls:
        raise EagletError("the engine never fed the draft (no fuse call): nothing to compare")
    for b, p in enumerate(prompts):
        _place(run, b, 0, len(p), tap.calls[0], b)
        pos = len(p)
        for k, a in enumerate(run.accept_lengths[b]):
            if 1 + k < len(tap.calls):
                _place(run, b, pos, a, tap.calls[1 + k], b)
            pos += a
    return run
