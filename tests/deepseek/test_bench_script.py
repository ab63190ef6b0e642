"""scripts/bench_deepseek.py (the H200 measurement) runs end to end on tiny shapes on CPU."""

from __future__ import annotations

from scripts.bench_deepseek import main


def test_bench_script_smoke():
    rows = main(["--shape", "tiny", "--device", "cpu", "--batch", "1", "3", "--context", "16", "--reps", "2"])
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        # 3 MoE layers; a step chooses k=4 experts a token, at most all 16; B x 48 tree tokens choose more.
        assert len(r["experts_per_layer"]) == 3
        assert all(4 <= e <= min(16, 4 * r["batch"]) for e in r["experts_per_layer"])
        assert all(v >= e for v, e in zip(r["verify_experts_per_layer"], r["experts_per_layer"]))
        assert 0 < r["plain_GB"] < r["verify_GB"] and r["verify_in_plain_steps"] > 0
