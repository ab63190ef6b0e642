"""Recipe options: the per-point norm before fc, feature noise, and the budget split of one command."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from eaglet.capture import CaptureSpec
from eaglet.cli import main
from eaglet.draft.compat import load_draft_for
from eaglet.draft.model import PointNorm
from eaglet.errors import EagletError
from eaglet.train.budget import BudgetSplit
from eaglet.train.trainer import Trainer
from eaglet.train.ttt import sharpen
from eaglet.train_options import TrainConfig
from tests.train.helpers import answers_end_after, interrupt_on_call, prompts, token_data, write_jsonl

FAST = dict(ttt_steps=2, lr=3e-3, warmup_steps=2, batch_tokens=256, epochs=20, progress=False)


def test_point_norm_normalises_each_point_on_its_own():
    torch.manual_seed(0)
    a, b = torch.randn(5, 16), torch.randn(5, 16)
    a[:, 3] = 25_000.0  # a massive activation in one point must not shrink the other
    out = PointNorm(2, 16, 1e-6)(torch.cat([a, b], -1))  # [5, 32]
    rms = out.unflatten(-1, (2, 16)).pow(2).mean(-1).sqrt()  # [5, 2]
    torch.testing.assert_close(rms, torch.ones(5, 2))
    torch.testing.assert_close(out[:, 16:], b / b.pow(2).mean(-1, keepdim=True).sqrt())


def test_aux_norm_is_trained_exported_and_served(tiny_target, tmp_path):
    train, val = token_data(tiny_target, 24, 31), token_data(tiny_target, 6, 32)
    res = Trainer(TrainConfig(max_steps=4, aux_norm=True, **FAST), tiny_target, train, val, tmp_path).run()
    assert res["steps"] == 4
    draft, cfg = load_draft_for(tmp_path / "draft", tiny_target)
    assert cfg["eaglet"]["aux_norm"] is True and draft.aux_norm is not None
    assert not torch.equal(draft.aux_norm.weight, torch.ones_like(draft.aux_norm.weight))  # it learned
    aux = torch.randn(1, 3, CaptureSpec.eagle3_default(3).k * tiny_target.config.hidden_size) * 100
    torch.testing.assert_close(draft.fuse(aux), draft.fuse(aux * 7))  # scale-free: the norm runs in serving
    # A checkpoint of a run without the norm is not resumed with it.
    plain = tmp_path / "plain"
    plain.mkdir()
    Trainer(TrainConfig(max_steps=1, aux_norm=False, **FAST), tiny_target, train, val, plain).run()
    with pytest.raises(EagletError, match="other settings"):
        Trainer(TrainConfig(max_steps=2, aux_norm=True, **FAST), tiny_target, train, val, plain)


def test_feature_noise_changes_training_not_validation(tiny_target, tmp_path):
    train, val = token_data(tiny_target, 24, 33), token_data(tiny_target, 6, 34)
    runs = {}
    for noise in (0.0, 0.5):
        out = tmp_path / f"noise{noise}"
        out.mkdir()
        Trainer(TrainConfig(max_steps=1, val_every=1, aux_noise=noise, **FAST), tiny_target, train, val, out).run()
        rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
        runs[noise] = {r["split"]: r["loss"] for r in rows}
    assert runs[0.0]["train"] != runs[0.5]["train"]  # the same weights at step 1 see other features
    assert runs[0.0]["val"] != runs[0.5]["val"]  # (after one step the weights differ: both are logged)


def test_sharpened_labels_are_the_targets_distribution_at_a_temperature():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 40) * 4
    logp = logits.log_softmax(-1)
    for t in (0.25, 0.5, 2.0):
        torch.testing.assert_close(sharpen(logp, t), (logits / t).log_softmax(-1))
        assert torch.equal(sharpen(logp, t).argmax(-1), logits.argmax(-1))
    assert (sharpen(logp, 0.5).amax(-1) > logp.amax(-1)).all()  # below 1: more weight on the argmax
    torch.testing.assert_close(sharpen(logp, 1.0), logp)


def test_label_temperature_changes_training_not_validation(tiny_target, tmp_path, monkeypatch):
    import eaglet.train.trainer as trainer_module

    calls = []
    monkeypatch.setattr(trainer_module, "sharpen", lambda logp, t: calls.append(t) or sharpen(logp, t))
    train, val = token_data(tiny_target, 24, 35), token_data(tiny_target, 6, 36)
    runs = {}
    for t in (1.0, 0.25):
        out = tmp_path / f"t{t}"
        out.mkdir()
        Trainer(TrainConfig(max_steps=2, val_every=1, label_temperature=t, **FAST), tiny_target, train, val,
                out).run()
        rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
        runs[t] = [r for r in rows if r["split"] in ("train", "val")]
    assert runs[1.0][0]["loss"] != runs[0.25][0]["loss"]  # the same weights at step 1, other labels
    assert {r["split"] for r in runs[0.25]} == {"train", "val"}  # validated after each step ...
    assert calls == [0.25, 0.25]  # ... while only the two training steps sharpened their labels
    with pytest.raises(EagletError, match="label-temperature"):
        TrainConfig(label_temperature=0)


def test_reach_masks_the_trainers_loss(tiny_target, tmp_path):
    """TrainConfig.ttt_reach (--ttt-reach) reaches the trainer's loss: at step 1 (the same weights) the training loss
    differs from the unmasked run's."""
    train = token_data(tiny_target, 24, 35)
    first = {}
    for k in (0, 1):
        out = tmp_path / f"k{k}"
        out.mkdir()
        Trainer(TrainConfig(max_steps=1, ttt_reach=k, **FAST), tiny_target, train, None, out).run()
        rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
        first[k] = next(r for r in rows if r["split"] == "train")
    assert first[0]["loss"] != first[1]["loss"]


def test_budget_split_rule():
    split = BudgetSplit(budget_s=1200, epochs=4, train_tokens_per_s=100_000)
    # 20 s, 2.5 s a million tokens (tokenizing), 2% of the budget
    assert split.reserve_s(10_000_000) == pytest.approx(20 + 25 + 24)
    # 10M tokens x 4 epochs x 1.08 padding at 100k/s = 432 s of training.
    assert split.train_seconds(10_000_000) == pytest.approx(432)
    assert not split.regen_should_stop(698, 10_000_000)  # 698 + 69 + 432 < 1200
    assert split.regen_should_stop(700, 10_000_000)  # 700 + 69 + 432 >= 1200
    assert split.regen_should_stop(0, 30_000_000)  # the data so far already fills the budget
    # Features kept after the first pass: 10M x 1.08 x (1/100k + 3/200k) = 270 s.
    kept = BudgetSplit(budget_s=1200, epochs=4, train_tokens_per_s=100_000, cached_tokens_per_s=200_000)
    assert kept.train_seconds(10_000_000) == pytest.approx(270)
    explicit = BudgetSplit(budget_s=1200, epochs=4, regen_budget_s=300)
    assert not explicit.regen_should_stop(299, 10**9) and explicit.regen_should_stop(300, 0)


def test_one_command_cut_into_pieces_ends_as_the_uncut_run(tiny_target_dir, tmp_path, monkeypatch, capsys):
    """`train --regenerate --time-budget-min` with sampled answers, Magpie prompts and second turns, stopped
    twice while regenerating and once while training: the resumed pieces end with the uncut run's draft."""
    import eaglet.data.sources as sources
    from eaglet.session import Session

    answers_end_after(monkeypatch, 16)  # second turns continue answers that ended (and 16 bytes make a turn)
    src = write_jsonl(tmp_path / "p.jsonl", [{"messages": list(p.messages), "split": "val" if i < 4 else "train",
                                              "source": "held" if i < 4 else "data"}
                                             for i, p in enumerate(prompts(12, seed=35))])
    args = ["train", "--target", str(tiny_target_dir), "--device", "cpu", "--data", str(src), "--regenerate",
            "--regen-batch-size", "4", "--max-new-tokens", "20", "--answers", "greedy,1.0", "--self-prompts", "6",
            "--follow-ups", "0.5", "--time-budget-min", "600", "--train-tokens-per-s", "1e9", "--ttt-steps", "2",
            "--batch-tokens", "512", "--epochs", "2", "--warmup-steps", "2", "--save-every", "2"]
    assert main([*args, "--out", str(tmp_path / "uncut")]) == 0
    run = tmp_path / "cut"
    for owner, name, call, said in ((sources, "write_turns", 1, "interrupted"),
                                    (Session, "step", 40, "answers were added"),  # rows of a regeneration in flight
                                    (Trainer, "_forward", 3, "training stopped")):
        capsys.readouterr()
        with monkeypatch.context() as m:
            interrupt_on_call(m, owner, name, call)
            assert main([*args, "--out", str(run)]) == 130
        assert said in capsys.readouterr().err
    assert main([*args, "--out", str(run)]) == 0
    # The last piece reports the wall time of all four, per stage (each piece loaded the target again).
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    clock = json.loads((run / "clock.json").read_text())
    assert set(summary["stages_s"]) == {"load", "regenerate", "tokenize", "train"}
    assert clock["seconds"] + 0.1 >= summary["wall_s"] >= sum(summary["stages_s"].values()) - 0.2 > 0  # (rounded)
    assert clock["stages"]["regenerate"] + 0.1 >= summary["stages_s"]["regenerate"] > 0

    def records(out):
        return sorted(line for line in (out / "regenerated.jsonl").read_text().splitlines())

    assert records(run) == records(tmp_path / "uncut")
    ids = [json.loads(line)["id"] for line in records(run)]
    assert any(i.endswith("~t1") for i in ids) and any("+2" in i for i in ids) and any("self-" in i for i in ids)
    a = load_draft_for(tmp_path / "uncut" / "draft", _target(tiny_target_dir))[0].state_dict()
    b = load_draft_for(run / "draft", _target(tiny_target_dir))[0].state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=k)


def _target(path):
    from tests.train.helpers import load_tiny

    return load_tiny(path)


def test_the_training_rate_probe_times_steps_of_the_runs_shape(tiny_target):
    from eaglet.draft.vocab import default_draft_vocab_size
    from eaglet.train import probe

    cfg = TrainConfig(batch_tokens=128, ttt_steps=2)
    rig = probe.StepRig(tiny_target, cfg, torch.device("cpu"), row_tokens=32)
    assert rig.tokens == 128 and len(rig.step(lambda: 0)) == 5
    assert rig.draft.config.draft_vocab_size == default_draft_vocab_size(tiny_target.config.vocab_size)
    state = torch.get_rng_state()
    rates = probe.train_tokens_per_s(tiny_target, cfg, torch.device("cpu"), steps=1)
    assert rates.first > 0 and rates.cached == rates.first  # a CPU run keeps no features by default
    kept = probe.train_tokens_per_s(tiny_target, replace(cfg, feature_cache=True), torch.device("cpu"), steps=1)
    assert kept.first > 0 and kept.cached > 0 and kept.cached != kept.first  # the later passes timed apart
    assert torch.equal(torch.get_rng_state(), state)


def test_a_budgeted_regeneration_splits_with_a_training_rate_timed_here(tiny_target, tmp_path, monkeypatch):
    """Without --train-tokens-per-s, the budget's split divides by the rate the probe timed on this machine
    (not the H200 figure); given a rate, nothing is timed."""
    import eaglet.train.pipeline as pipeline
    from eaglet.train_options import RegenConfig

    class Stop(Exception):
        pass

    seen = {}
    monkeypatch.setattr(pipeline.probe, "train_tokens_per_s",
                        lambda *a: seen.setdefault("probed", pipeline.probe.TrainRates(1234.0, 1234.0)))

    def regenerate_run(target, data, out, rc, dist, stop_when, *rest):
        seen["stops"] = (stop_when(0), stop_when(10**6))  # 1M tokens a pass at 1,234 a second: > 600 s
        raise Stop

    monkeypatch.setattr(pipeline, "regenerate_run", regenerate_run)
    for rate in (None, 1e9):
        seen.clear()
        with pytest.raises(Stop):
            pipeline.run_train(tiny_target, "builtin", tmp_path / str(rate), TrainConfig(), regen=RegenConfig(),
                               time_budget_s=600, train_tokens_per_s=rate)
        assert seen.get("probed") == ((1234.0, 1234.0) if rate is None else None)
        assert seen["stops"] == ((False, True) if rate is None else (False, False))


def test_a_budget_with_no_room_for_training_answers_says_so(tiny_target_dir, tmp_path, capsys):
    src = write_jsonl(tmp_path / "p.jsonl", [{"messages": list(p.messages)} for p in prompts(8, seed=3)])
    out = tmp_path / "run"
    assert main(["train", "--target", str(tiny_target_dir), "--device", "cpu", "--data", str(src), "--out", str(out),
                 "--regenerate", "--max-new-tokens", "4", "--time-budget-min", "0.3", "--train-tokens-per-s", "1"]) == 2
    assert "the time budget ended regeneration before any training answer" in capsys.readouterr().err
    assert (out / "regenerated.done.json").is_file()
    out = tmp_path / "run2"  # an explicit cap on regeneration is what the sentence names then
    assert main(["train", "--target", str(tiny_target_dir), "--device", "cpu", "--data", str(src), "--out", str(out),
                 "--regenerate", "--max-new-tokens", "4", "--regen-budget-min", "0.0001"]) == 2
    assert "--regen-budget-min ended regeneration before any training answer; raise it" in capsys.readouterr().err


def test_a_budgeted_run_cut_into_pieces_gets_what_its_budget_has_left(tiny_target_dir, tmp_path, monkeypatch):
    """`--time-budget-min` counts every piece of a run: a rerun after an interruption starts its clock where the
    earlier pieces left it (OUT/clock.json), so the pieces together keep to the budget."""
    import time

    import eaglet.train.pipeline as pipeline
    from eaglet.errors import Interrupted

    elapsed = []

    def fake_run_train(*args):
        budget, start = args[9], args[-1].start  # the job's Clock comes last
        elapsed.append((budget, time.time() - start))
        if len(elapsed) == 1:
            time.sleep(0.5)
            raise Interrupted("training stopped")
        return {"config": {}, "steps": 0}

    monkeypatch.setattr(pipeline, "run_train", fake_run_train)
    src = write_jsonl(tmp_path / "p.jsonl", [{"messages": list(p.messages)} for p in prompts(4, seed=3)])
    args = ["train", "--target", str(tiny_target_dir), "--device", "cpu", "--data", str(src), "--out",
            str(tmp_path / "run")]
    (tmp_path / "run").mkdir()
    assert main([*args, "--time-budget-min", "10"]) == 130
    assert main([*args, "--time-budget-min", "10"]) == 0
    (b1, first), (b2, second) = elapsed
    assert b1 == b2 == 600 and first < 0.5 <= second  # the second piece counts the first one's half second
    clock = json.loads((tmp_path / "run" / "clock.json").read_text())
    assert clock["seconds"] >= second and clock["stages"]["load"] > 0
    assert main(args) == 0 and elapsed[2][1] < 0.5  # without a budget no clock is read


def test_a_named_recipe_sets_what_the_command_line_leaves_out(tmp_path, monkeypatch, capsys):
    from eaglet.commands import COMMANDS

    seen = []
    monkeypatch.setitem(COMMANDS, "train", lambda opts: seen.append(opts) or 0)
    base = ["train", "--data", "builtin", "--out", str(tmp_path / "run"), "--regenerate", "--recipe", "chat"]
    assert main(base) == 0
    regen, cfg = seen[-1].regen, seen[-1].train
    assert (regen.answers, regen.max_samples, regen.self_prompts, regen.self_prompt_openers, regen.follow_ups,
            regen.max_new_tokens, cfg.epochs) == ((0.0, 0.7, 1.0), 16000, 20000, 0.5, 0.0, 256, 6)
    # A flag given wins, also abbreviated or at the default's own value.
    assert main([*base, "--epoch", "1", "--max-new-tokens=128", "--answers", "greedy"]) == 0
    regen, cfg = seen[-1].regen, seen[-1].train
    assert (cfg.epochs, regen.max_new_tokens, regen.answers, regen.self_prompts) == (1, 128, (0.0,), 20000)
    # No self-prompts: the recipe's openers for them go too (they were refused as openers of nothing).
    assert main([*base, "--self-prompts", "0"]) == 0
    assert (seen[-1].regen.self_prompts, seen[-1].regen.self_prompt_openers) == (0, 0.0)
    # Without --regenerate it has nothing to set the data of: one sentence, exit 2, nothing run.
    assert main([*base[:5], "--recipe", "chat"]) == 2 and len(seen) == 3
    assert "--recipe chat sets the data --regenerate writes" in capsys.readouterr().err


def test_every_flag_a_recipe_sets_yields_to_the_command_line():
    """A recipe fills a flag only where the command line left it out, which it can tell only for flags that record
    being given (``Given``): a recipe key on any other flag would override what the user typed."""
    import argparse

    from eaglet.cli import build_parser
    from eaglet.cli_train import Given
    from eaglet.train_options import RECIPES

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    train = {a.dest: a for a in sub.choices["train"]._actions}
    for name, recipe in RECIPES.items():
        for dest in recipe:
            assert isinstance(train[dest], Given), f"--recipe {name} sets {dest}, whose flag is not a Given action"
    # The learning rate, the recipe's next candidate (session 49's ablation), records it already.
    assert isinstance(train["lr"], Given)


def test_the_fast_ttt_flags_reach_the_trainers_config_and_default_to_cuda():
    """--compile-loss and --fused-ttt-attention, either form, reach TrainConfig; unset, a run fuses both on CUDA
    and neither on the CPU (where a compile outweighs what it saves)."""
    import torch

    from eaglet import cli_options
    from eaglet.cli import build_parser

    base = ["train", "--data", "x.jsonl", "--out", "run"]
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    for flags, want_cuda, want_cpu in (([], (True, True), (False, False)),
                                       (["--compile-loss"], (True, True), (True, False)),
                                       (["--no-compile-loss", "--fused-ttt-attention"], (False, True), (False, True)),
                                       (["--no-fused-ttt-attention"], (True, False), (False, False))):
        cfg = cli_options.train(build_parser().parse_args([*base, *flags])).train
        assert (cfg.fast_ttt(cuda), cfg.fast_ttt(cpu)) == (want_cuda, want_cpu), flags
