"""End to end on a tiny DeepSeek-V3 directory, as a user runs it: regenerate, capture, train, generate and
bench with the draft, doctor (tp=2 included), and the import of a SpecForge draft config written for Kimi-K2."""

from __future__ import annotations

import json

import pytest

from eaglet.cli import main
from tests.train.helpers import prompts, write_jsonl

POINTS = "1,2,4"  # EAGLE-3's default [2, N//2, N-3] repeats a point at N=4
TREE = ["--num-steps", "2", "--topk", "2", "--num-draft-tokens", "4"]


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def run(ds_target_dir, tmp_path_factory):
    """Prompts, regenerated answers, features and a draft trained for 2 steps."""
    tmp = tmp_path_factory.mktemp("ds-run")
    target = ["--target", str(ds_target_dir), "--device", "cpu"]
    src = write_jsonl(tmp / "p.jsonl", [{"messages": list(p.messages), "split": "val" if i < 3 else "train"}
                                        for i, p in enumerate(prompts(12, seed=9))])
    assert main(["data", "regenerate", *target, "--data", str(src), "--out", str(tmp / "r.jsonl"),
                 "--max-new-tokens", "8", "--batch-size", "8"]) == 0
    assert main(["data", "capture", *target, "--data", str(tmp / "r.jsonl"), "--split", "train",
                 "--out", str(tmp / "f"), "--shard-samples", "4", "--capture", POINTS]) == 0
    assert main(["train", *target, "--data", str(tmp / "r.jsonl"), "--features", str(tmp / "f"),
                 "--out", str(tmp / "run"), "--max-steps", "2", "--ttt-steps", "2", "--batch-tokens", "512",
                 "--capture", POINTS]) == 0
    return target, src, tmp


def test_regenerate_capture_train(run, capsys):
    _, _, tmp = run
    lines = [json.loads(x) for x in (tmp / "r.jsonl").read_text().splitlines()]
    assert len(lines) == 12
    manifest = json.loads((tmp / "f" / "manifest.json").read_text())
    assert manifest["capture"]["points"] == [1, 2, 4] and manifest["capture"]["num_layers"] == 4
    cfg = json.loads((tmp / "run" / "draft" / "config.json").read_text())
    assert cfg["eaglet"]["target"]["model_type"] == "deepseek_v3" and cfg["eaglet"]["capture"]["points"] == [1, 2, 4]
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]) == (64, 1, 64)  # draft_shape at H=64


def test_generate_and_bench_with_the_draft_equal_plain(run, capsys):
    target, src, tmp = run
    draft = ["--draft", str(tmp / "run" / "draft")]
    common = [*target, "--prompt", "the cat sat", "--max-new-tokens", "12", "--json"]
    assert main(["generate", *common, *draft, *TREE]) == 0
    spec = _last_json(capsys)
    assert main(["generate", *common, "--draft", "none"]) == 0
    plain = _last_json(capsys)
    assert spec["text"] == plain["text"] and spec["completion_tokens"] == plain["completion_tokens"] == 12
    assert spec["draft"] is not None and spec["accept_length"] is not None
    assert main(["bench", *target, *draft, "--prompts", str(src), "--limit", "3", "--max-new-tokens", "12",
                 "--methods", "plain,spec", *TREE, "--out", str(tmp / "bench")]) == 0
    report = json.loads(next((tmp / "bench").glob("*.json")).read_text())
    same = report["identical_to_plain"]["spec"]
    assert same["identical"] == same["of"] == 3, same


def test_doctor_with_tp2(run, capsys):
    target, src, tmp = run
    code = main(["doctor", *target, "--draft", str(tmp / "run" / "draft"), "--prompts", str(src),
                 "--num-prompts", "4", "--max-new-tokens", "16", *TREE, "--tp", "2"])
    text = capsys.readouterr().out
    # A 2-step draft cannot be good (checks 3 and 4 warn); the contract, capture parity and tp must pass.
    assert code == 0, text
    for line in ("1 contract          PASS", "2 capture parity    PASS", "6 tensor parallel   PASS"):
        assert line in text, text
