"""A running batch decoded speculatively: the engine's iteration over rows that come and go.

Admission prefills the target (capturing the draft's points) and the draft into the new
rows only, in one forward each whatever the rows (``Landing``: through row views of the batch
caches, or a scratch cache copied into scattered rows), and sets their seed, pending token and
``active`` flag in the engine's per-batch ``_State``; the compiled iteration (a CUDA graph
on CUDA) reads those same tensors, so a row joins between two replays with nothing
recaptured. When the policy falls back to plain decoding the draft cache is no longer extended;
when it wants a tree again (``policy.retry`` after a long fallback, or a batch that adopted a plain
one's rows), each running row's caches are prefilled again over its committed context, the pending
token kept as the root, and the iterations resume (a server's batch under steady load never drains,
so it would otherwise never speculate again).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from eaglet.kv_cache import Landing, row_index
from eaglet.sampling import SamplingParams
from eaglet.session import Session
from eaglet.speculative.drafting import anchor_tokens, draft_prefill
from eaglet.speculative.verify import prefill

if TYPE_CHECKING:
    from eaglet.speculative.engine import SpecEngine


class SpecSession(Session):
    def __init__(self, eng: SpecEngine, batch: int, params: SamplingParams):
        tcache, dcache, state = eng._cache(batch)
        # A greedy session that falls back decodes in PlainGenerator's chunks, built (compiled) here so
        # that a fallback never compiles inside a request.
        chunks = eng.fallback_chunks(batch) if params.greedy else None
        if chunks is not None:
            chunks.chunk()
        super().__init__(eng.target, tcache, lambda ids: eng._plain_step(tcache)(ids), params, eng.capacity,
                         state.roots, state.active, chunks=chunks, prefills=eng.prefills)
        self.eng, self.dcache, self.state = eng, dcache, state
        self.draft_landing = Landing(dcache, eng.draft.new_cache)
        eng.policy.start_call(batch)
        self.speculating = eng.policy.tree(batch) is not None
        self.admissions = 0

    def adopt(self, old: SpecSession) -> None:
        """``Session.adopt``, and the rows' draft cache and seeds. A batch that fell back to plain decoding
        no longer extended its draft cache, so the larger one decodes plainly too until it resumes (``step``)."""
        super().adopt(old)
        n = old.batch
        self.dcache.copy_rows_from(old.dcache, range(n))
        self.state.seed[:n] = old.state.seed
        self.speculating = self.speculating and old.speculating
        self.admissions = old.admissions

    def _prefill(self, rows: list[int], prompts: list[list[int]]) -> torch.Tensor:
        # Each admission is one of the policy's "calls" (the first is the session's own), so
        # a long-running server batch, whose evidence spans many prompts, is judged after
        # WINDOW iterations as a series of generate calls is.
        if self.admissions:
            self.eng.policy.start_call(self.batch)
        self.admissions += 1
        if not self.speculating:
            return super()._prefill(rows, prompts)
        return self._prefill_both(rows, prompts)

    def _prefill_both(self, rows: list[int], prompts: list[list[int]], given: torch.Tensor | None = None
                      ) -> torch.Tensor:
        """The target's and the draft's caches of ``rows`` over ``prompts`` -> the roots [n]: sampled from the
        target's logits, or ``given`` [n] (a resumed row keeps its pending token)."""
        model, longest = self.target.model, max(map(len, prompts))
        parts = self.graph_parts(rows, prompts)
        if parts is None:
            with self.landing.into(rows, longest) as tview, self.draft_landing.into(rows, longest) as dview:
                logits, aux = prefill(model, tview, prompts, self.eng.capture)
                roots = self.sample(logits, rows) if given is None else given  # [n]
                seed = draft_prefill(self.eng.draft, model.embed, dview, prompts, aux, roots)
            self.state.seed[row_index(rows, seed.device)] = seed
            return roots
        all_roots, done = [], 0
        for part_rows, part in parts:  # each: the target's graph, its roots, then the draft's graph
            (logits, aux), tview = self.prefills.run(part)
            k = len(part)
            roots = self.sample(logits[:k], part_rows) if given is None else given[done: done + k]  # [k]
            # The draft's anchors with a placeholder for each root, which goes in on the device (``tail``).
            (seed,), dview = self.eng.draft_prefills.run(anchor_tokens(part, [0] * k), aux, tail=roots)
            self.landing.land(tview, part_rows, max(map(len, part)))
            self.draft_landing.land(dview, part_rows, max(map(len, part)))
            self.state.seed[row_index(part_rows, seed.device)] = seed[:k]
            all_roots.append(roots)
            done += k
        return torch.cat(all_roots)

    def _resume(self, live: list[int]) -> None:
        """Speculate again: each running row's caches prefilled over its committed context (the prompt and every
        token but the last, which is the pending root), one row a forward, so that memory stays one context's."""
        for i in live:
            row = self.rows[i]
            self._prefill_both([i], [row.prompt + row.out.tokens[:-1]], self.roots[i: i + 1])
        self.speculating = True

    def step(self, launched: Callable[[], None] | None = None) -> dict[int, list[int]]:
        """One speculative iteration of every running row (or a plain step after a fallback); ``launched``
        as ``Session.step``'s."""
        live = self.running()
        if not live:
            return {}
        b, policy = self.batch, self.eng.policy
        if not self.speculating:
            policy.retry(b)
        cfg = policy.tree(b)
        if cfg is None:
            self.speculating = False
            policy.observe_plain(b)
            return super().step(launched)
        if not self.speculating:  # the policy wants a tree again (a retry, or rows adopted from a plain batch)
            self._resume(live)
        if policy.adaptive:
            self.eng._costs(b, cfg, self.params)
        t0 = time.perf_counter()
        result = self.eng._iteration(b, cfg, self.params)(self.gen, launched)  # per row [emitted (W)..., count]
        news, tokens = {}, 0
        for i in live:
            n = result[i][-1]
            self.rows[i].out.accept_lengths.append(n)
            news[i] = self._add(i, result[i][:n])
            tokens += n
        policy.observe(b, tokens, len(live), time.perf_counter() - t0)  # the iteration and its bookkeeping
        self.verifies, self.accepted = self.verifies + len(live), self.accepted + tokens
        self.last_step = cfg.describe()
        return news
