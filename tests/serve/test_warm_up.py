"""Warm-up: every batch size's step is built (and, for the policy, timed) before the server listens,
and a warmed engine decodes exactly as a cold one."""

from __future__ import annotations

import gc

import pytest

from eaglet.options import ServeConfig, TargetOptions
from eaglet.sampling import SamplingParams
from eaglet.serve.server import warm_up
from tests.serve.conftest import new_engine


@pytest.fixture(autouse=True)
def unfrozen():
    """warm_up freezes the heap (``freeze_heap``): the test process's later garbage must stay collectable."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_warm_up_builds_each_size_and_changes_no_output(served_dirs, one_thread, monkeypatch):
    import eaglet.generate
    from eaglet.serve.server import PREFILL_LENGTHS

    seen, real = [], eaglet.generate.prefill

    def counted(target, cache, prompts):
        seen.append(len(prompts[0]))
        return real(target, cache, prompts)

    monkeypatch.setattr(eaglet.generate, "prefill", counted)
    engine = new_engine(served_dirs)
    warm_up(engine, ServeConfig(TargetOptions(str(served_dirs[0])), batch_sizes=(1, 2), warm_up=True))
    assert seen == list(PREFILL_LENGTHS)  # a prefill at each length whose kernel variant compiles on first use
    assert set(engine._caches) == {1, 2}
    assert set(engine.policy.plain_step_s) == {1, 2}
    assert {b for b, _ in engine.policy.iteration_s} == {1, 2}

    prompts = [[5, 9, 14, 3], [7, 7, 2]]
    params = SamplingParams(max_new_tokens=24)
    warm = engine.generate(prompts, params)
    cold = new_engine(served_dirs).generate(prompts, params)
    assert [c.tokens for c in warm] == [c.tokens for c in cold]


def test_no_warm_up_without_graphs_by_default(served_dirs, one_thread):
    engine = new_engine(served_dirs)  # CPU: no CUDA graphs, nothing worth building ahead
    warm_up(engine, ServeConfig(TargetOptions(str(served_dirs[0])), batch_sizes=(1, 2)))
    assert not engine._caches


def test_warm_up_captures_the_prefill_buckets_of_every_batch_size(served_dirs, one_thread, capsys):
    """Bucketed prefills (captured graphs on CUDA; here their eager test mode): one row, then every power of
    two of rows up to the largest batch, at every length, for the target and the draft, under a progress bar
    (a fresh GPU's server spent minutes here)."""
    engine = new_engine(served_dirs, bucketed_prefill=True)
    warm_up(engine, ServeConfig(TargetOptions(str(served_dirs[0])), batch_sizes=(1, 4), warm_up=True))
    lengths = engine.prefills.lengths
    for graphs in (engine.prefills, engine.draft_prefills):
        assert sorted(graphs.steps) == [(r, n) for r in (1, 2, 4) for n in lengths]
    n = 2 * 3 * len(lengths)  # two models, rows 1, 2 and 4
    err = capsys.readouterr().err
    assert "prefill graphs: 100%" in err and f"{n}/{n} " in err
    prompts, params = [[5, 9, 14, 3], [7, 7, 2]], SamplingParams(max_new_tokens=24)
    assert [c.tokens for c in engine.generate(prompts, params)] == \
        [c.tokens for c in new_engine(served_dirs).generate(prompts, params)]


def test_the_heap_is_frozen_after_warm_up_even_without_one(served_dirs, one_thread):
    """A full collection during serving would walk every object of the model and its compiled steps."""
    engine = new_engine(served_dirs)
    assert gc.get_freeze_count() == 0
    warm_up(engine, ServeConfig(TargetOptions(str(served_dirs[0])), batch_sizes=(1,), warm_up=False))
    assert gc.get_freeze_count() > 10_000  # the engine's objects, at least
