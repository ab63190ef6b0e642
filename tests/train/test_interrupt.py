"""Ctrl-C or SIGTERM (a real signal to this process) in train, data regenerate and data capture: the work
done is saved, the exit status is 130, and the same command resumes without losing or repeating anything."""

from __future__ import annotations

import json
import signal

import torch

from eaglet.cli import main
from eaglet.data.features import FeatureSet
from tests.train.helpers import interrupt_on_call, prompts, write_jsonl


def _answered(tmp_path, n: int):
    return write_jsonl(tmp_path / "answers.jsonl", [
        {"messages": [*p.messages, {"role": "assistant", "content": "the cat sat on the mat " * (1 + i % 3)}]}
        for i, p in enumerate(prompts(n, seed=11))])


def _losses(run) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if r["split"] == "train"]
    assert steps == sorted(set(steps)), "a step is logged twice"
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


def test_train_interrupted_resumes_from_the_interrupted_step(tiny_target_dir, tmp_path, monkeypatch, capsys):
    from eaglet.train.trainer import Trainer

    data = _answered(tmp_path, 24)
    args = ["train", "--target", str(tiny_target_dir), "--device", "cpu", "--data", str(data), "--ttt-steps", "2",
            "--batch-tokens", "256", "--epochs", "20", "--max-steps", "12", "--val-fraction", "0",
            "--warmup-steps", "2"]
    assert main([*args, "--out", str(tmp_path / "reference")]) == 0
    reference = _losses(tmp_path / "reference")
    capsys.readouterr()

    run = tmp_path / "run"
    with monkeypatch.context() as m:
        interrupt_on_call(m, Trainer, "_forward", call=5)  # during step 5
        assert main([*args, "--out", str(run)]) == 130
    err = capsys.readouterr().err
    assert "training stopped at step 5 of 12" in err and "run the same command again" in err
    assert json.loads((run / "checkpoint" / "state.json").read_text())["step"] == 5
    assert sorted(_losses(run)) == [1, 2, 3, 4, 5]
    partial = json.loads((run / "draft" / "config.json").read_text())["eaglet"]["training"]
    assert partial["in_progress"] and partial["steps"] == 5  # the checkpoint's draft, marked as such

    assert main([*args, "--out", str(run)]) == 0
    assert "resuming from step 5" in capsys.readouterr().err
    resumed = _losses(run)
    assert sorted(resumed) == list(range(1, 13))
    for step, loss in reference.items():  # the curve continues exactly where it stopped
        assert abs(resumed[step] - loss) < 1e-4 * max(1.0, abs(loss)), step
    assert "in_progress" not in json.loads((run / "draft" / "config.json").read_text())["eaglet"]["training"]


def _regen_args(tiny_target_dir, tmp_path, n: int, out: str = "r.jsonl"):
    src = write_jsonl(tmp_path / "p.jsonl", [{"messages": list(p.messages)} for p in prompts(n, seed=12)])
    return ["data", "regenerate", "--target", str(tiny_target_dir), "--device", "cpu", "--data", str(src),
            "--out", str(tmp_path / out), "--max-new-tokens", "4", "--batch-size", "4",
            "--answers", "greedy,1.0"], tmp_path / out


def _ids(out) -> list[str]:
    return [json.loads(line)["id"] for line in out.read_text().splitlines()]


def test_regenerate_interrupted_keeps_finished_answers_and_resumes(tiny_target_dir, tmp_path, monkeypatch, capsys):
    from eaglet.session import Session

    args, out = _regen_args(tiny_target_dir, tmp_path, 14)
    with monkeypatch.context() as m:  # Ctrl-C at step 5: four rows have finished, four are in flight
        interrupt_on_call(m, Session, "step", call=5)
        assert main(args) == 130
    written = len(_ids(out))
    assert f"{written} answers were added" in capsys.readouterr().err and 0 < written < 28
    with monkeypatch.context() as m:  # a second Ctrl-C stops at once, rows in flight
        interrupt_on_call(m, Session, "step", call=1, times=2)
        assert main(args) == 130
    assert len(_ids(out)) == written and out.read_text().endswith("\n")
    assert main(args) == 0
    ids = _ids(out)
    assert len(ids) == 28 and len(set(ids)) == 28  # no line lost, none repeated
    # ... and the resumed file holds what one uncut run writes, sampled answers included.
    uncut_args, uncut = _regen_args(tiny_target_dir, tmp_path, 14, "uncut.jsonl")
    assert main(uncut_args) == 0
    assert sorted(out.read_text().splitlines()) == sorted(uncut.read_text().splitlines())


def test_capture_interrupted_keeps_finished_shards_and_resumes(tiny_target_dir, tmp_path, monkeypatch, capsys):
    import eaglet.data.features as features

    data = _answered(tmp_path, 12)
    args = ["data", "capture", "--target", str(tiny_target_dir), "--device", "cpu", "--data", str(data),
            "--shard-samples", "4", "--feature-dtype", "float32"]
    assert main([*args, "--out", str(tmp_path / "reference")]) == 0
    out = tmp_path / "features"
    with monkeypatch.context() as m:
        interrupt_on_call(m, features, "_capture_shard", call=1, sig=signal.SIGTERM)  # as a scheduler stops a job
        assert main([*args, "--out", str(out)]) == 130
    assert "1 of 3 feature shards" in capsys.readouterr().err
    assert sorted(p.name for p in out.glob("shard-*")) == ["shard-00000.safetensors"]
    assert main([*args, "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["shards_written"] == 2
    got, ref = FeatureSet(out), FeatureSet(tmp_path / "reference")
    assert len(got) == len(ref) == 12 and torch.equal(got.ids, ref.ids)
    for i in range(12):
        assert torch.equal(got.get(i)["aux"], ref.get(i)["aux"]), i
