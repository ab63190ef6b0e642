"""Sessions: rows admitted into a running batch at different times, released and refilled,
decode exactly what each prompt decodes alone (greedy, float32), speculative or plain."""

from __future__ import annotations

import pytest
import torch

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
    out, owner, pending = {}, {}, list(range(len(prompts)))
    with torch.inference_mode():
        while pending or session.running():
            if pending and session.free_rows():
                k = pending.pop(0)
                row = session.free_rows()[0]
                owner[row] = k
                out[k] = list(session.admit(row, [prompts[k]], SamplingParams(max_new_tokens=limits[k]))[0])
            else:
                for row, toks in session.step().items():
                    out[owner[row]] += toks
            for row in [r for r, st in session.rows.items() if st.done]:
                assert session.release(row).tokens == out[owner[row]]
    assert [out[k] for k in range(len(prompts))] == alone


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
        session.release(0)
        assert session.free_rows() == [0, 1] and not session.running()
