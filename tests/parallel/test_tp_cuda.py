"""The NCCL side of test_tp.py, for machines with 2+ CUDA devices (CI, CPU-only, skips it)."""

from __future__ import annotations

import time

import pytest
import torch

from eaglet.doctor.tp import LOGITS, compare_tp, judge, point_name, tolerance
from eaglet.errors import EagletError
from eaglet.parallel.launch import run_tp
from eaglet.parallel.state import SINGLE
from tests.conftest import make_hf_model
from tests.parallel.test_tp import N_NEW, POINTS, PROMPTS, _broadcast_rank, _failing_rank, _run_model

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_hf_model("llama").save_pretrained(str(path), safe_serialization=True)
    return path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compare_tp_nccl(tiny_dir, dtype):
    report = compare_tp(str(tiny_dir), 2, PROMPTS, POINTS, dtype=dtype, device="cuda")
    print(report.format())
    assert report.ok


def test_tp2_with_cuda_graphs_equals_tp1(tiny_dir):
    # CUDA graphs capture the NCCL collectives of the decode step; compile is left to its own tests.
    options = {"use_graphs": True, "compile": False}
    got = run_tp(2, _run_model, tiny_dir, POINTS, PROMPTS, N_NEW, "cuda", options, device="cuda")
    ref = _run_model(SINGLE, tiny_dir, POINTS, PROMPTS, N_NEW, "cuda", options)
    assert all(v == 0.0 for v in got["across"].values()), got["across"]
    assert torch.equal(got["outs"]["tokens"], ref["outs"]["tokens"])
    for key in (*map(point_name, POINTS), LOGITS):
        diff = judge(key, got["outs"][key], ref["outs"][key], rel_tol=tolerance(torch.float32))
        assert diff.ok, diff


def test_broadcast_from_rank0_nccl():
    xs, across = run_tp(2, _broadcast_rank, "cuda", device="cuda")
    assert across == [0.0, 0.0, 0.0] and xs[1].tolist() == [False, True] and xs[2].tolist() == [7]


def test_more_ranks_than_gpus():
    n = torch.cuda.device_count() + 1
    with pytest.raises(EagletError, match=f"needs {n} CUDA devices on this host but {n - 1} are visible$"):
        run_tp(n, _broadcast_rank, "cuda", device="cuda")


@pytest.mark.parametrize("how", ["raise", "kill", "stall"])
def test_failing_rank_nccl(how):
    start = time.monotonic()
    with pytest.raises(EagletError, match=r"^rank [01] failed: ") as err:
        run_tp(2, _failing_rank, how, "cuda", device="cuda", timeout_s=5)
    print(how, "->", err.value, f"({time.monotonic() - start:.1f}s)")
    assert time.monotonic() - start < 90
