"""Warm-up: every batch size's step is built (and, for the policy, timed) before the server listens,
and a warmed engine decodes exactly as a cold one."""

from __future__ import annotations

from eaglet.options import ServeConfig, TargetOptions
from eaglet.sampling import SamplingParams
from eaglet.serve.server import warm_up
from tests.serve.conftest import new_engine


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
