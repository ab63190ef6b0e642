"""Ctrl-C (SIGINT to the `eaglet` process) in `train --tp 2`: rank 0 finishes its step, saves the
checkpoint and stops the other ranks; the command exits 130 with the sentence of a tp=1 run, and the
same command resumes from the saved step."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from tests.parallel.test_tp_spec import ROOT, _cli, chat_dirs  # noqa: F401  (chat_dirs: a fixture)
from tests.train.helpers import prompts, write_jsonl


def _train_rows(run) -> list[dict]:
    log = run / "train_log.jsonl"
    if not log.is_file():
        return []
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]
    return [r for r in rows if r.get("split") == "train"]


def test_ctrl_c_under_tp_saves_and_resumes(chat_dirs, tmp_path):  # noqa: F811
    import os

    data = write_jsonl(tmp_path / "d.jsonl", [
        {"messages": [*p.messages, {"role": "assistant", "content": "the cat sat on the mat and ran " * 2}]}
        for p in prompts(24, seed=3)])
    run = tmp_path / "run"
    args = ["train", "--target", str(chat_dirs[0]), "--device", "cpu", "--data", str(data), "--out", str(run),
            "--max-steps", "60", "--epochs", "50", "--ttt-steps", "2", "--batch-tokens", "256", "--val-fraction", "0",
            "--tp", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "eaglet.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while len(_train_rows(run)) < 2:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    last = [line for line in err.splitlines() if line.startswith("eaglet: ")][-1]  # eaglet's last word
    assert "Traceback" not in err, err[-3000:]
    assert last.startswith("eaglet: interrupted: training stopped at step"), last
    assert "run the same command again" in last, last
    saved = json.loads((run / "checkpoint" / "state.json").read_text())["step"]
    assert 2 <= saved < 60
    partial = json.loads((run / "draft" / "config.json").read_text())["eaglet"]["training"]
    assert partial["in_progress"] and partial["steps"] == saved  # written by rank 0 alone, with the checkpoint
    assert f"step {saved} of 60" in last

    resumed = _cli(*args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from step {saved}" in resumed.stderr
    steps = [r["step"] for r in _train_rows(run)]
    assert steps == list(range(1, 61)), "every step once: none lost, none repeated"
    assert "in_progress" not in json.loads((run / "draft" / "config.json").read_text())["eaglet"]["training"]
