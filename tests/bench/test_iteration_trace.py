"""scripts/iteration_trace.py: an eaglet command under its timers prints the iteration's split at exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_trace_of_an_offline_bench_splits_every_iteration(chat_model_dir, draft_dir, prompts_file, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "scripts/iteration_trace.py", "bench", "--target", str(chat_model_dir),
                          "--draft", str(draft_dir), "--prompts", str(prompts_file), "--max-new-tokens", "8",
                          "--methods", "spec", "--batch-size", "1", "--policy", "off", "--device", "cpu",
                          "--out", str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    table = run.stderr[run.stderr.index("span "):].splitlines()[1:]
    rows = {line[:20].strip(): line[20:].split() for line in table if line.strip()}
    # The policy off: every step is an iteration, each with its launch and wait (from the timed loop on).
    count = int(rows["iteration"][0])
    assert count > 0 and int(rows["launch"][0]) == int(rows["wait"][0]) == count
    assert int(rows["session step"][0]) <= count
    assert float(rows["iteration"][1]) >= float(rows["launch"][1]) > 0
    assert "turn step" not in rows  # no server, no scheduler
    # every prompt admitted once in the timed loop (the warm-up's admissions left out), its prefill inside
    prompts = sum(1 for line in prompts_file.read_text().splitlines() if line.strip())
    assert int(rows["session admit"][0]) == int(rows["prefill"][0]) == prompts
    assert float(rows["session admit"][1]) >= float(rows["prefill"][1]) > 0
