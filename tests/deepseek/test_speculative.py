"""Speculative decoding over the DeepSeek-V3 target: greedy output equals plain decoding (float32, CPU).

Tree verification writes every node's latent at its own slot and position, ``commit`` keeps
the accepted path and the rest is rolled back; after many partially accepted trees the
latent cache must hold exactly what a fresh prefill of the emitted tokens holds.
"""

from __future__ import annotations

import pytest
import torch

from eaglet.generate import PlainGenerator
from eaglet.loading.target import Target
from eaglet.sampling import SamplingParams
from eaglet.speculative import SpecEngine
from eaglet.speculative.verify import prefill
from tests.conftest import load_ours
from tests.deepseek.conftest import YARN, make_hf_deepseek, save_deepseek
from tests.speculative.conftest import CharTokenizer, echo_draft, random_draft, repeat_prone
from tests.speculative.test_engine import prompts_of
from tests.speculative.test_session import SCATTERED, refill_in_groups, scattered

TREES = {"chain": (4, 1, 5), "tree": (4, 3, 12), "6,8,48": (6, 8, 48)}
CONTEXT = 160
PARAMS = SamplingParams(max_new_tokens=40)


@pytest.fixture(scope="module")
def ds_target(tmp_path_factory) -> Target:
    """A repeat-prone tiny DeepSeek-V3 (MoE, group-limited routing, YaRN), vocabulary 64."""
    hf = make_hf_deepseek(seed=2, vocab_size=64, rope_parameters=YARN, max_position_embeddings=256)
    path = save_deepseek(hf, tmp_path_factory.mktemp("ds-target"))
    model, cfg = load_ours(path)
    return repeat_prone(Target(model, CharTokenizer(), cfg, "tiny-deepseek", path))


@pytest.fixture(scope="module")
def plain(ds_target):
    prompts = prompts_of([7, 12, 3])
    return prompts, [o.tokens for o in PlainGenerator(ds_target, CONTEXT).generate(prompts, PARAMS)]


def _spec(target, draft, tree, **kw):
    return SpecEngine(target, draft, CONTEXT, *TREES[tree], adaptive=False, log=lambda _: None, **kw)


@pytest.mark.parametrize("tree", list(TREES))
def test_greedy_identical_to_plain(ds_target, plain, tree):
    prompts, ref = plain
    draft = echo_draft(ds_target)  # agrees where the target repeats itself: acceptance is partial
    eng = _spec(ds_target, draft, tree)
    for batch in ([prompts[0]], prompts):  # batch 1, and 3 rows of different lengths
        out = eng.generate(batch, PARAMS)
        assert [o.tokens for o in out] == ref[: len(batch)]
    lengths = [a for o in out for a in o.accept_lengths]
    assert max(lengths) >= 3 and min(lengths) == 1, "acceptance should be partial"


def test_greedy_identical_with_a_random_draft_and_static_shapes(ds_target, plain):
    """A draft that almost never agrees, over the CUDA-graph layout (attention over the whole cache)."""
    prompts, ref = plain
    draft = random_draft(ds_target, seed=5, draft_vocab=40)
    out = _spec(ds_target, draft, "tree", static_shapes=True).generate(prompts, PARAMS)
    assert [o.tokens for o in out] == ref


@torch.no_grad()
def test_latent_cache_after_rollbacks_matches_a_fresh_prefill(ds_target):
    draft = echo_draft(ds_target)
    prompts = prompts_of([6, 13], seed=4)
    eng = _spec(ds_target, draft, "tree")
    out = eng.generate(prompts, PARAMS)
    longer = _spec(ds_target, draft, "tree").generate(prompts, SamplingParams(max_new_tokens=60))
    tcache = eng._caches[2][0]
    for row, (p, o, lo) in enumerate(zip(prompts, out, longer)):
        n = int(tcache.lens[row])
        assert lo.tokens[: len(o.tokens)] == o.tokens and n > len(p) + 8
        ref = ds_target.model.new_cache(1, CONTEXT)
        prefill(ds_target.model, ref, [p + lo.tokens[: n - len(p)]], draft.config.capture.points)
        for got, want in zip(tcache.k, ref.k):
            torch.testing.assert_close(got[row, :, :n], want[0, :, :n], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("engine", ["plain", "tree"])
def test_prompts_admitted_together_into_scattered_rows(ds_target, engine):
    """The latent cache's rows (no V) copied from the admission's scratch cache into rows 2 and 0 of 4."""
    prompts, limits = prompts_of(SCATTERED["lengths"], seed=4), SCATTERED["limits"]
    alone = [PlainGenerator(ds_target, CONTEXT).generate([p], SamplingParams(max_new_tokens=n))[0].tokens
             for p, n in zip(prompts, limits)]
    gen = PlainGenerator(ds_target, CONTEXT) if engine == "plain" else _spec(ds_target, echo_draft(ds_target), engine)
    out, admissions = refill_in_groups(gen.session(4, PARAMS), prompts, limits)
    assert out == alone and [2, 0] in admissions and scattered(admissions)
