"""scripts/http_overhead.py: the real app and scheduler over a fake engine, measured by bench --endpoint's client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_http_overhead_runs_every_request_and_reports(served_dirs):
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "http_overhead.py"), "--tokenizer", str(served_dirs[0]),
         "--requests", "3", "--reps", "2", "--steps", "4", "--prefill-ms", "1", "--step-ms", "1", "--stages"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    runs = [line.split() for line in out.stdout.splitlines() if line[:4].strip().isdigit()]
    assert len(runs) == 2 and all(r[-1] == "3" for r in runs), out.stdout  # every request of each run answered
    # engine time: 3 requests x (1 ms prefill + 4 x 1 ms steps), at least
    assert all(float(r[2]) >= 15.0 for r in runs), out.stdout
    assert "median overhead a request:" in out.stdout
    # --stages: every stage of a request's way through the server was marked (the tokenizer's since
    # chat.encode_text calls encode_batch_fast, which the stage report had stopped seeing)
    stages = out.stdout.split("a request's stages in the server, medians:")[1].splitlines()[1:]
    assert len(stages) == 7 and all(float(line.split()[-2]) >= 0 for line in stages), out.stdout
