"""Plain decoding in chunks of several steps per host read (``DecodeChunks``) against one step per read.

CPU, float32, eager: the chunk's logic (``left``, stops and limits mid-chunk, rows joining and
leaving, own-draws sampling) must give the tokens of the one-step path, which is main's path.
"""

from __future__ import annotations

import pytest
import torch

from eaglet.generate import DecodeChunks, PlainGenerator
from eaglet.loading.target import Target
from eaglet.sampling import SamplingParams
from eaglet.session import Draws, Session
from tests.conftest import make_hf_model, save_and_load

PROMPTS = [list(range(3, 14)), list(range(40, 45)), [7, 300, 21, 9, 150, 2, 88]]


class Tokens:
    """A stand-in tokenizer: token t reads "<t>", so a stop string names whole tokens."""

    def __init__(self, eos: int | None = None):
        self.eos_token_id = eos

    def decode(self, tokens: list[int], **_) -> str:
        return "".join(f"<{t}>" for t in tokens)


@pytest.fixture(scope="module")
def model(tmp_path_factory, one_thread):
    tmp = tmp_path_factory.mktemp("chunk")
    ours, cfg = save_and_load(make_hf_model("llama", seed=1), tmp)
    return ours, cfg, tmp


def target(model, tok: Tokens | None = None) -> Target:
    ours, cfg, tmp = model
    return Target(ours, tok or Tokens(), cfg, "tiny", tmp)


def outputs(t: Target, prompts, params, chunk: int, max_context: int = 96):
    return [(c.tokens, c.finish_reason) for c in PlainGenerator(t, max_context, chunk=chunk).generate(prompts, params)]


@pytest.mark.parametrize("n", [1, 3])
def test_greedy_chunks_give_the_one_step_tokens(model, n):
    t = target(model)
    params = SamplingParams(max_new_tokens=21)  # not a multiple of either chunk
    want = outputs(t, PROMPTS[:n], params, chunk=1)
    assert all(len(tokens) == 21 for tokens, _ in want)
    assert outputs(t, PROMPTS[:n], params, chunk=8) == want
    assert outputs(t, PROMPTS[:n], params, chunk=3) == want


def test_stops_and_eos_inside_a_chunk_drop_the_rest(model):
    free = outputs(target(model), PROMPTS, SamplingParams(max_new_tokens=30), chunk=1)
    # Row 0 stops at a stop string completed by its 6th token, row 1 at EOS (its 11th token).
    stop, eos = f"<{free[0][0][5]}>", free[1][0][10]
    t = target(model, Tokens(eos=eos))
    params = SamplingParams(max_new_tokens=30, stop=[stop])
    want = outputs(t, PROMPTS, params, chunk=1)
    assert want[0][1] == want[1][1] == "stop" and len(want[0][0]) <= 6 and len(want[1][0]) <= 10
    assert outputs(t, PROMPTS, params, chunk=8) == want


def test_the_context_limit_holds_every_write_inside_the_cache(model):
    t = target(model)
    long, short = list(range(3, 33)), list(range(3, 11))
    params = SamplingParams(max_new_tokens=200)
    want = outputs(t, [long, short], params, chunk=1, max_context=45)
    gen = PlainGenerator(t, 45, chunk=8)
    got = gen.generate([long, short], params)
    assert [(c.tokens, c.finish_reason) for c in got] == want
    assert [len(long) + len(got[0].tokens), len(short) + len(got[1].tokens)] == [45, 45]
    # The last token is never written; a row held at its limit rewrites the slot above its text.
    assert gen._caches[2].lens.tolist() == [44, 44]


def run_schedule(gen: PlainGenerator, params: SamplingParams, own: bool) -> dict[str, list[int]]:
    """Rows join and leave a running batch of 3: two start, one joins later, one is aborted and its
    row refilled. -> each request's tokens."""
    s = gen.session(3, params, own_draws=own)
    draws = (lambda seed, temp: [Draws(seed, temp)]) if own else (lambda seed, temp: None)
    out = {"a": [], "b": [], "c": [], "d": []}
    row_of = {0: "a", 1: "b"}
    for r, name, d in [(0, "a", Draws(11, 0.9)), (1, "b", Draws(12, 0.0))]:
        out[name] += s.admit([r], [PROMPTS[r]], params, [d] if own else None)[0]
    step = 0
    while step < 5 or s.running():
        if step == 2:
            row_of[2] = "c"
            out["c"] += s.admit([2], [PROMPTS[2]], params, draws(13, 1.3))[0]
        if step == 4:  # abort "a" and give its row to "d"
            s.release(0)
            row_of[0] = "d"
            out["d"] += s.admit([0], [PROMPTS[1]], params, draws(14, 0.7))[0]
        for i, toks in s.step().items():
            out[row_of[i]] += toks
        step += 1
    return out


@pytest.mark.parametrize("own", [False, True])
def test_rows_joining_and_leaving_mid_run_get_the_one_step_tokens(model, own):
    t = target(model)
    params = SamplingParams(max_new_tokens=40, top_k=50) if own else SamplingParams(max_new_tokens=40)
    want = run_schedule(PlainGenerator(t, 96, chunk=1), params, own)
    got = run_schedule(PlainGenerator(t, 96, chunk=8), params, own)
    # The chunked session reads 8 steps at a time, so the aborted request got further; the rest ran out.
    assert got["a"][: len(want["a"])] == want["a"] and len(got["a"]) > len(want["a"]) >= 5
    assert {k: got[k] for k in "bcd"} == {k: want[k] for k in "bcd"}
    assert all(len(got[k]) == 40 for k in "bcd")
    if own:  # the sampled rows did draw (a greedy row would repeat the greedy answer)
        greedy = outputs(t, [PROMPTS[2]], SamplingParams(max_new_tokens=40), chunk=1)[0][0]
        assert got["c"] != greedy


def test_a_session_sharing_one_generator_keeps_one_step_per_read(model):
    t = target(model)
    params = SamplingParams(temperature=0.8, seed=5, max_new_tokens=19)
    want = outputs(t, PROMPTS, params, chunk=1)
    gen = PlainGenerator(t, 96, chunk=8)
    assert outputs(t, PROMPTS, params, chunk=8) == want
    s = gen.session(3, params)
    s.admit(0, PROMPTS, params)
    assert all(len(toks) == 1 for toks in s.step().values())


def test_the_static_chunk_idle_commits_nothing_and_decodes_like_the_step(model):
    """The graph's geometry (attention over the whole cache) eagerly, and the warm-up's idle state."""
    t = target(model)
    params = SamplingParams(max_new_tokens=17)
    cache = t.model.new_cache(3, 64)
    chunks = DecodeChunks(t.model, cache, 4, static=True, compile=False, graph=False)
    s = Session(t, cache, None, params, 64, chunks=chunks)
    first = s.admit(0, PROMPTS, params)
    chunks.left.fill_(5)
    before = [x.clone() for x in (chunks.roots, chunks.active, chunks.left, cache.lens)]
    with chunks.idle():
        chunks.chunk()()
    assert all(torch.equal(a, b) for a, b in zip(before, (chunks.roots, chunks.active, chunks.left, cache.lens)))
    news = first
    while s.running():
        for i, toks in s.step().items():
            news[i] += toks
    want = outputs(t, PROMPTS, params, chunk=1, max_context=64)
    assert news == [tokens for tokens, _ in want]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("own", [False, True])
def test_graphed_chunks_on_cuda_give_the_one_step_tokens(model, own):
    """The captured 8-step graph (what runs on a GPU by default) against one graphed step per read."""
    import copy

    ours, cfg, tmp = model
    t = Target(copy.deepcopy(ours).to("cuda"), Tokens(), cfg, "tiny", tmp)
    params = SamplingParams(max_new_tokens=40, top_k=50) if own else SamplingParams(max_new_tokens=40)
    graphed = PlainGenerator(t, 96, compile=False)
    assert graphed.use_graphs and graphed.chunk == 8
    want = run_schedule(PlainGenerator(t, 96, compile=False, chunk=1), params, own)
    got = run_schedule(graphed, params, own)
    assert {k: got[k] for k in "bcd"} == {k: want[k] for k in "bcd"}
    assert got["a"][: len(want["a"])] == want["a"]
    plain = SamplingParams(max_new_tokens=21)
    one = PlainGenerator(t, 96, compile=False, chunk=1)
    assert [c.tokens for c in graphed.generate(PROMPTS, plain)] == [c.tokens for c in one.generate(PROMPTS, plain)]


def test_an_unseeded_session_draws_its_own_seed_and_leaves_the_global_generator_alone(model):
    gen = PlainGenerator(target(model), 96)
    sampled = SamplingParams(temperature=1.0, max_new_tokens=4)
    state = torch.random.get_rng_state()
    seeds = {gen.session(1, sampled).gen.initial_seed() for _ in range(3)}
    assert torch.equal(torch.random.get_rng_state(), state)  # the server's sessions do not reseed torch's own
    assert len(seeds) == 3
    assert gen.session(1, SamplingParams(temperature=1.0, seed=7)).gen.initial_seed() == 7
