import os

from tests.conftest import make_hf_model, save_and_load


def test_finished_rows_do_not_overflow_the_cache(tmp_path):
    """A row that hits the context limit while another keeps going must not overflow."""
    from eaglet.generate import PlainGenerator
    from eaglet.loading.target import Target
    from eaglet.sampling import SamplingParams

    hf = make_hf_model("llama", seed=0)
    model, cfg = save_and_load(hf, tmp_path)
    target = Target(model, None, cfg, "tiny", tmp_path)
    gen = PlainGenerator(target, max_context=48)
    long, short = list(range(3, 33)), list(range(3, 11))
    out = gen.generate([long, short], SamplingParams(max_new_tokens=200))
    assert [len(long) + len(out[0].tokens), len(short) + len(out[1].tokens)] == [48, 48]
    alone = PlainGenerator(target, max_context=48).generate([short], SamplingParams(max_new_tokens=200))
    assert out[1].tokens == alone[0].tokens


def test_bucket_size_is_a_power_of_two_only_under_graphs():
    from eaglet.session import bucket_size

    assert bucket_size(3, graphs=False) == 3
    assert bucket_size(3, graphs=True) == 4
    assert bucket_size(9, graphs=True) == 16
    assert bucket_size(1, graphs=True) == 1


def test_compile_cache_lives_under_eaglets_cache(monkeypatch, tmp_path):
    from eaglet.cuda_graph import persistent_compile_cache

    monkeypatch.setenv("EAGLET_CACHE", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    persistent_compile_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    persistent_compile_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/elsewhere"  # the user's choice wins



def test_a_compiled_step_says_what_it_compiles_and_how_long_its_first_call_took(monkeypatch, tmp_path, capsys):
    import torch

    from eaglet.cuda_graph import COMPILES, compiled

    monkeypatch.setenv("EAGLET_CACHE", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    before = len(COMPILES)
    double = compiled(lambda x: x * 2, "the doubling for batch 3", backend="eager", dynamic=False)
    assert "compiling the doubling for batch 3" in capsys.readouterr().err
    x = torch.arange(3)
    assert double(x).tolist() == [0, 2, 4] and double(x + 1).tolist() == [2, 4, 6]
    err = capsys.readouterr().err
    assert err.count("compiled the doubling for batch 3 in ") == 1  # the first call only: later ones are the step's
    assert [w for w, _ in COMPILES[before:]] == ["the doubling for batch 3"]  # what bench reports as compiles_s

def test_sampling_at_a_uniform_follows_the_distribution_and_keeps_its_cuts():
    import torch

    from eaglet.sampling import SamplingParams, probs, sample_at

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0]]).repeat(20000, 1)
    p = SamplingParams(top_k=3)
    u = torch.rand(20000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    drawn = sample_at(logits, torch.full((20000,), 0.8), u, p)
    freq = torch.bincount(drawn, minlength=5).double() / 20000
    want = probs(logits[:1], p, torch.tensor([0.8]))[0].double()
    assert want[2] == 0 and freq[2] == 0 and freq[3] == 0  # top-k cut: never drawn
    assert torch.allclose(freq, want, atol=0.01), (freq, want)
    # Temperature 0 is greedy whatever the uniform; the extreme uniforms pick the first and the last
    # token (in vocabulary order) the top-k cut keeps, never one it cut.
    edge = sample_at(logits[:3], torch.tensor([0.0, 1.0, 1.0]), torch.tensor([0.99, 0.0, 1 - 1e-16]), p)
    assert edge.tolist() == [4, 0, 4]


def test_one_function_compiles_at_more_shapes_than_dynamos_default_limit(tmp_path, monkeypatch):
    """Each batch size, tree and sampling rule compiles a step of its own: a server's seven batch sizes and
    two sampling rules pass dynamo's default of 8 compiles per function, which failed the ninth (fullgraph)."""
    import torch

    from eaglet.cuda_graph import compiled

    monkeypatch.setenv("EAGLET_CACHE", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)

    def triple(x):
        return x * 3

    # config.patch, not monkeypatch: monkeypatch cannot read the old value of a dynamo config entry and
    # deletes the entry when it undoes, which broke every later compile in the process.
    with torch._dynamo.config.patch(recompile_limit=8):
        for n in range(1, 13):
            step = compiled(triple, f"the tripling for batch {n}", backend="eager", fullgraph=True, dynamic=False)
            assert step(torch.arange(n)).tolist() == [3 * i for i in range(n)]
