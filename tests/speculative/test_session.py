"""Sessions: rows admitted into a running batch at different times, released and refilled,
decode exactly what each prompt decodes alone (greedy, float32), speculative or plain; several
prompts admitted at once into scattered free rows (one prefill) decode what they decode alone."""

from __future__ import annotations

import pytest
import torch

from eaglet.errors import EagletError
from eaglet.generate import PlainGenerator
from eaglet.sampling import SamplingParams
from eaglet.speculative import SpecEngine
from tests.speculative.test_engine import CONTEXT, TREES, prompts_of

PARAMS = SamplingParams(max_new_tokens=30)


@pytest.mark.parametrize("engine", ["plain", "chain", "tree", "tree-static"])
def test_rows_join_and_leave_a_running_batch(agreeing, engine):
    """``tree-static``: the CUDA-graph layout (whole-cache attention), run eagerly."""
    target, draft = agreeing
    prompts = prompts_of([7, 12, 3, 9, 5, 11], seed=3)
    limits = [30, 8, 30, 17, 30, 4]  # rows end at different times, and freed rows are refilled
    alone = [PlainGenerator(target, CONTEXT).generate([p], SamplingParams(max_new_tokens=n))[0].tokens
             for p, n in zip(prompts, limits)]
    gen = PlainGenerator(target, CONTEXT) if engine == "plain" else \
        SpecEngine(target, draft, CONTEXT, *TREES[engine.removesuffix("-static")], adaptive=False, log=lambda _: None,
                   static_shapes=engine.endswith("-static"))
    session = gen.session(3, PARAMS)
    out, owner, pending, launches = {}, {}, list(range(len(prompts))), []
    with torch.inference_mode():
        while pending or session.running():
            if pending and session.free_rows():
                k = pending.pop(0)
                row = session.free_rows()[0]
                owner[row] = k
                out[k] = list(session.admit(row, [prompts[k]], SamplingParams(max_new_tokens=limits[k]))[0])
            else:
                before = len(launches)
                for row, toks in session.step(lambda: launches.append(1)).items():
                    out[owner[row]] += toks
                assert len(launches) == before + 1  # the server's hand-off hook: once a step, whatever ran
            for row in [r for r, st in session.rows.items() if st.done]:
                assert session.release(row).tokens == out[owner[row]]
    assert [out[k] for k in range(len(prompts))] == alone


def refill_in_groups(session, prompts: list[list[int]], limits: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    """Decode ``prompts`` through ``session``, admitting every waiting prompt into every free row in one call
    once two rows are free (or none runs), in descending row order -> (the tokens of each prompt, the rows
    of each admission). Released rows are checked against the streamed tokens."""
    out, owner, pending, admissions = {}, {}, list(range(len(prompts))), []
    storage = [t.data_ptr() for t in (*session.cache.k, *session.cache.v)]
    with torch.inference_mode():
        while pending or session.running():
            free = session.free_rows()
            if pending and free and (len(free) >= 2 or not session.running()):
                rows, take = free[::-1][: len(pending)], pending[: len(free)]
                del pending[: len(rows)]
                firsts = session.admit(rows, [prompts[k] for k in take],
                                       [SamplingParams(max_new_tokens=limits[k]) for k in take])
                for row, k, first in zip(rows, take, firsts):
                    owner[row], out[k] = k, list(first)
                admissions.append(rows)
            else:
                for row, toks in session.step().items():
                    out[owner[row]] += toks
            for row in [r for r, st in session.rows.items() if st.done]:
                assert session.release(row).tokens == out[owner[row]]
    assert [t.data_ptr() for t in (*session.cache.k, *session.cache.v)] == storage  # graphs read these tensors
    return [out[k] for k in range(len(prompts))], admissions


SCATTERED = dict(lengths=[7, 12, 3, 9, 5, 11, 4, 8, 6], limits=[30, 6, 30, 5, 12, 9, 20, 4, 15])


def scattered(admissions: list[list[int]]) -> bool:
    return any(sorted(rows) != list(range(min(rows), max(rows) + 1)) for rows in admissions)


@pytest.mark.parametrize("engine", ["plain", "chain", "tree", "tree-static"])
def test_prompts_admitted_together_into_scattered_rows(agreeing, engine):
    """Rows 0 and 2 of 4 free at once (rows 1 and 3 still running) take two prompts in one prefill."""
    target, draft = agreeing
    prompts, limits = prompts_of(SCATTERED["lengths"], seed=4), SCATTERED["limits"]
    alone = [PlainGenerator(target, CONTEXT).generate([p], SamplingParams(max_new_tokens=n))[0].tokens
             for p, n in zip(prompts, limits)]
    gen = PlainGenerator(target, CONTEXT) if engine == "plain" else \
        SpecEngine(target, draft, CONTEXT, *TREES[engine.removesuffix("-static")], adaptive=False, log=lambda _: None,
                   static_shapes=engine.endswith("-static"))
    out, admissions = refill_in_groups(gen.session(4, PARAMS), prompts, limits)
    assert out == alone
    assert admissions[0] == [3, 2, 1, 0] and [2, 0] in admissions and scattered(admissions)


def test_session_refuses_a_busy_row_and_other_sampling(agreeing):
    target, draft = agreeing
    session = SpecEngine(target, draft, CONTEXT, *TREES["chain"], adaptive=False, log=lambda _: None).session(
        2, PARAMS)
    with torch.inference_mode():
        session.admit(0, prompts_of([5]), PARAMS)
        with pytest.raises(ValueError, match="not free"):
            session.admit(0, prompts_of([4]), PARAMS)
        with pytest.raises(ValueError, match="same temperature"):
            session.admit(1, prompts_of([4]), SamplingParams(temperature=0.7))
        with pytest.raises(ValueError, match="not free"):
            session.admit([1, 1], prompts_of([4, 3]), PARAMS)
        with pytest.raises(EagletError, match="the prompt has 200 tokens"):
            session.admit([1], prompts_of([200]), PARAMS)  # nothing admitted: row 1 stays free
        session.release(0)
        assert session.free_rows() == [0, 1] and not session.running()


@pytest.mark.parametrize("engine", ["plain", "chain", "tree", "tree-static", "fell-back"])
def test_a_full_batch_grows_in_place(agreeing, engine):
    """A full batch's rows move into a larger session mid-answer (``grow``: caches copied, same row indices)
    and every prompt, those moved and those admitted after, decodes what it decodes alone; a batch that
    had fallen back to plain decoding comes over plain, and the larger one, whose policy wants a tree, first
    prefills the rows' caches again over their contexts, then speculates."""
    target, draft = agreeing
    prompts = prompts_of([7, 12, 3, 9], seed=5)
    alone = [PlainGenerator(target, CONTEXT).generate([p], PARAMS)[0].tokens for p in prompts]
    gen = PlainGenerator(target, CONTEXT) if engine == "plain" else \
        SpecEngine(target, draft, CONTEXT, *TREES[{"fell-back": "tree"}.get(engine, engine).removesuffix("-static")],
                   adaptive=False, log=lambda _: None, static_shapes=engine.endswith("-static"))
    small = gen.session(2, PARAMS)
    with torch.inference_mode():
        out = {i: list(t) for i, t in enumerate(small.admit(0, prompts[:2], PARAMS))}
        if engine == "fell-back":  # the policy's fallback at batch 2: the draft cache is no longer extended
            gen.policy._t(2).rung = len(gen.policy.ladder(2))
        for _ in range(3):
            for row, toks in small.step().items():
                out[row] += toks
        big = gen.grow(small, 4)
        assert big.batch == 4 and sorted(big.rows) == [0, 1] and big.free_rows() == [2, 3]
        assert getattr(big, "speculating", False) == (engine not in ("plain", "fell-back"))
        lens = small.cache.lens[:2]
        assert torch.equal(big.cache.lens[:2], lens) and torch.equal(big.roots[:2], small.roots)
        caches = [(big.cache, small.cache)] + ([(big.dcache, small.dcache)] if engine != "plain" else [])
        for mine, theirs in caches:  # every committed slot of both rows, every layer
            for a, b in zip((*mine.k, *mine.v), (*theirs.k, *theirs.v)):
                assert all(torch.equal(a[r, :, :n], b[r, :, :n]) for r, n in enumerate(lens.tolist()))
        if engine != "plain":
            assert torch.equal(big.state.seed[:2], small.state.seed)
        for row, toks in zip((2, 3), big.admit([2, 3], prompts[2:], PARAMS)):
            out[row] = list(toks)
        while big.running():
            for row, toks in big.step().items():
                out[row] += toks
    assert [out[k] for k in range(4)] == alone
    if engine == "fell-back":
        assert small.verifies == 0 and big.verifies > 0, "plain at batch 2, speculating again at batch 4"
    with pytest.raises(ValueError, match="adopts at most"):
        gen.session(2, PARAMS).adopt(big)
    with pytest.raises(ValueError, match="sampled as its own"):
        gen.session(8, SamplingParams(temperature=0.7)).adopt(big)
