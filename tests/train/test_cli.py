"""The training commands as a user runs them: data regenerate, data capture, train, draft import."""

from __future__ import annotations

import json

from eaglet.cli import main
from tests.train.helpers import prompts, write_jsonl


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_commands_end_to_end(tiny_target_dir, tmp_path, capsys):
    target = ["--target", str(tiny_target_dir), "--device", "cpu"]
    src = write_jsonl(tmp_path / "p.jsonl", [{"messages": list(p.messages), "split": "val" if i < 3 else "train"}
                                             for i, p in enumerate(prompts(12, seed=9))] + ["{broken"])
    assert main(["data", "regenerate", *target, "--data", str(src), "--out", str(tmp_path / "r.jsonl"),
                 "--max-new-tokens", "8", "--batch-size", "8"]) == 0
    out = _last_json(capsys)
    assert out["written"] == 12 and out["done_before"] == 0
    assert main(["data", "capture", *target, "--data", str(tmp_path / "r.jsonl"), "--split", "train",
                 "--out", str(tmp_path / "f"), "--shard-samples", "4"]) == 0
    assert _last_json(capsys)["shards_written"] == 3
    assert main(["train", *target, "--data", str(tmp_path / "r.jsonl"), "--features", str(tmp_path / "f"),
                 "--out", str(tmp_path / "run"), "--max-steps", "2", "--ttt-steps", "2",
                 "--batch-tokens", "512", "--draft-intermediate-size", "96"]) == 0
    res = _last_json(capsys)
    assert res["steps"] == 2 and res["val"]["positions"] > 0
    assert json.loads((tmp_path / "run" / "draft" / "config.json").read_text())["intermediate_size"] == 96
    assert main(["draft", "import", str(tmp_path / "run" / "draft"), str(tmp_path / "imported"), *target,
                 "--capture-ids", "1,0,2", "--convention", "sglang"]) == 0
    assert _last_json(capsys)["capture_points"] == [2, 1, 3]


def test_user_errors_are_one_line(tiny_target_dir, tmp_path, capsys):
    target = ["--target", str(tiny_target_dir), "--device", "cpu"]
    empty = write_jsonl(tmp_path / "empty.jsonl", ["", "not json"])
    assert main(["train", *target, "--data", str(empty), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("eaglet: error: ") and "no usable conversation" in err[-1]
    assert main(["train", *target, "--data", str(empty), "--out", str(tmp_path / "run"), "--lr", "-1"]) == 2
    assert "argument --lr: expected a number > 0, got '-1'" in capsys.readouterr().err
    assert main(["train", *target, "--data", str(empty), "--out", str(tmp_path / "run"),
                 "--draft-intermediate-size", "0"]) == 2
    assert "argument --draft-intermediate-size: expected an integer >= 1, got '0'" in capsys.readouterr().err
    assert main(["draft", "import", str(tmp_path), str(tmp_path / "x"), *target]) == 2
    assert "not a draft directory" in capsys.readouterr().err
    asks = write_jsonl(tmp_path / "asks.jsonl", [{"messages": list(p.messages)} for p in prompts(2, seed=1)])
    assert main(["train", *target, "--data", str(asks), "--regenerate", "--out", str(tmp_path / "run"),
                 "--init-draft", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("eaglet: error: --init-draft: ") and "nothing is not a draft directory" in err[-1]


def test_torchrun_data_parallel_on_cpu(tiny_target_dir, tmp_path):
    """Two gloo ranks through torchrun, no code change: one log, one export, both ranks trained."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    src = write_jsonl(tmp_path / "d.jsonl", [
        {"messages": [*p.messages, {"role": "assistant", "content": "the cat sat on the mat " * 3}]}
        for p in prompts(40, seed=4)])
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "eaglet.cli", "train", "--target", str(tiny_target_dir), "--device", "cpu", "--data", str(src),
         "--out", str(tmp_path / "run"), "--max-steps", "3", "--ttt-steps", "2", "--batch-tokens", "512",
         "--val-fraction", "0.2"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["world_size"] == 2 and res["steps"] == 3
    assert (tmp_path / "run" / "draft" / "config.json").is_file()
