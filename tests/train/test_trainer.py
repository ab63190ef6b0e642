"""The trainer end to end on a tiny target: it learns, it resumes exactly, it refuses what does not fit."""

from __future__ import annotations

import json
import time

import pytest
import torch
from safetensors import safe_open

from eaglet.capture import CaptureSpec
from eaglet.data.features import capture_features
from eaglet.draft.compat import load_draft_for
from eaglet.errors import EagletError
from eaglet.generate import PlainGenerator
from eaglet.options import SamplingParams
from eaglet.speculative import SpecEngine
from eaglet.train.dist import DistInfo
from eaglet.train.pipeline import run_train
from eaglet.train.trainer import Trainer
from eaglet.train_options import RegenConfig, TrainConfig
from tests.train.helpers import prompts, write_jsonl

FAST = dict(ttt_steps=3, lr=3e-3, warmup_steps=10, batch_tokens=512, epochs=50, progress=False)


@pytest.fixture(scope="module")
def regenerated(tiny_target, tmp_path_factory):
    """A run directory whose data the tiny target wrote itself (greedy), with train/val splits."""
    out = tmp_path_factory.mktemp("run")
    src = write_jsonl(out.parent / "prompts.jsonl", [{"messages": list(p.messages)} for p in prompts(120, seed=5)])
    res = run_train(tiny_target, str(src), out, TrainConfig(max_steps=1, **FAST),
                    regen=RegenConfig(batch_size=64, max_new_tokens=24), val_fraction=0.15)
    assert res["steps"] == 1
    return out


def _fresh(regenerated, tmp_path):
    """A run directory with the regenerated data and no checkpoint."""
    (tmp_path / "regenerated.jsonl").write_text((regenerated / "regenerated.jsonl").read_text())
    return str(tmp_path / "regenerated.jsonl")


def test_a_draft_learns_the_targets_choices(tiny_target, regenerated, tmp_path):
    data = _fresh(regenerated, tmp_path)
    res = run_train(tiny_target, data, tmp_path, TrainConfig(max_steps=150, val_every=150, **FAST))
    chance = 1 / tiny_target.config.vocab_size
    assert res["val"]["positions"] > 50  # held-out prompts, never trained on
    assert res["val"]["acc_0"] > 15 * chance, res["val"]
    assert res["val"]["tau_pred"] > 1.05
    rows = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 151))
    assert {"loss_0", "acc_2", "tau_pred", "lr"} <= set(train[0])
    assert sum(r["acc_0"] for r in train[-20:]) > sum(r["acc_0"] for r in train[:20])
    assert (tmp_path / "acc.png").stat().st_size > 1000
    # The export: bf16 shards, the target's identity, and it loads against that target.
    draft, cfg = load_draft_for(tmp_path / "draft", tiny_target)
    assert cfg["eaglet"]["target"]["tokenizer_hash"] == tiny_target.tokenizer_hash
    assert cfg["eaglet"]["training"]["val"]["acc_0"] == res["val"]["acc_0"]
    assert draft.config.capture == CaptureSpec.eagle3_default(3)
    with safe_open(str(next((tmp_path / "draft").glob("model-*.safetensors"))), "pt") as f:
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16


def test_resume_continues_exactly(tiny_target, regenerated, tmp_path, monkeypatch):
    cfg = TrainConfig(max_steps=8, save_every=3, val_every=100, **FAST)
    straight = tmp_path / "straight"
    straight.mkdir()
    run_train(tiny_target, _fresh(regenerated, straight), straight, cfg)

    cut = tmp_path / "cut"
    cut.mkdir()
    data = _fresh(regenerated, cut)
    save = Trainer._save

    def crash_after_step_6(self, log):
        save(self, log)
        if self.step == 6:
            raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "_save", crash_after_step_6)
    with pytest.raises(KeyboardInterrupt):
        run_train(tiny_target, data, cut, cfg)
    # The run cut short still leaves its latest checkpoint's draft, servable and marked as such.
    partial = load_draft_for(cut / "draft", tiny_target)[1]["eaglet"]["training"]
    assert partial["in_progress"] and (partial["steps"], partial["of_steps"]) == (6, 8)
    monkeypatch.setattr(Trainer, "_save", save)
    res = run_train(tiny_target, data, cut, cfg)
    assert res["steps"] == 8
    a = load_draft_for(straight / "draft", tiny_target)[0].state_dict()
    b = load_draft_for(cut / "draft", tiny_target)[0].state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=k)
    steps = [json.loads(line)["step"] for line in (cut / "train_log.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "train"]
    assert steps == list(range(1, 9))  # nothing lost, nothing logged twice
    assert "in_progress" not in json.loads((cut / "draft" / "config.json").read_text())["eaglet"]["training"]
    with pytest.raises(EagletError, match="other settings"):
        run_train(tiny_target, data, cut, TrainConfig(max_steps=9, draft_vocab_size=128, **FAST))


def test_a_run_can_start_from_a_trained_draft(tiny_target, regenerated, tmp_path):
    """--init-draft: the run starts from that draft's weights and vocabulary (a learning rate too small to move
    them exports the same draft and validates as it started), its checkpoint resumes only with the same start,
    and a draft that does not fit the run is refused naming each difference."""
    first = tmp_path / "first"
    first.mkdir()
    run_train(tiny_target, _fresh(regenerated, first), first, TrainConfig(max_steps=20, val_every=100,
                                                                         draft_vocab_size=128, **FAST))
    second = tmp_path / "second"
    second.mkdir()
    data = _fresh(regenerated, second)
    still = {**FAST, "lr": 1e-12}
    res = run_train(tiny_target, data, second, TrainConfig(max_steps=1, init_draft=str(first / "draft"), **still))
    # It is validated before its first step too, on this run's validation set: the start to judge the end by.
    assert res["val_at_start"]["step"] == 0 and res["val_at_start"]["acc_0"] == res["val"]["acc_0"]
    a = load_draft_for(first / "draft", tiny_target)[0].state_dict()
    b = load_draft_for(second / "draft", tiny_target)[0].state_dict()
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=k)
    with pytest.raises(EagletError, match="other settings"):
        run_train(tiny_target, data, second, TrainConfig(max_steps=2, draft_vocab_size=128, **still))
    with pytest.raises(EagletError, match=r"does not fit this run: it was trained with --aux-norm; its vocabulary "
                                          r"has 128 tokens, not --draft-vocab-size 64"):
        run_train(tiny_target, data, tmp_path, TrainConfig(max_steps=1, init_draft=str(first / "draft"),
                                                           aux_norm=False, draft_vocab_size=64, **FAST))


def test_a_wider_draft_trains_exports_and_serves_as_plain_decoding(tiny_target, regenerated, tmp_path):
    """--draft-intermediate-size: the draft's MLP at that width from its first step, recorded in the export,
    loaded at that shape by the engine, whose greedy output stays plain decoding's; a --init-draft of
    another width is refused."""
    wide = 3 * tiny_target.config.intermediate_size
    run_train(tiny_target, _fresh(regenerated, tmp_path), tmp_path,
              TrainConfig(max_steps=10, val_every=100, draft_intermediate_size=wide, **FAST))
    assert json.loads((tmp_path / "draft" / "config.json").read_text())["intermediate_size"] == wide
    draft = load_draft_for(tmp_path / "draft", tiny_target)[0].float()
    assert draft.config.intermediate_size == wide
    assert tuple(draft.midlayer.mlp.down_proj.weight.shape) == (tiny_target.config.hidden_size, wide)
    params = SamplingParams(max_new_tokens=24)
    ask = [p.messages[0]["content"] for p in prompts(4, seed=11)]
    ids = [tiny_target.tokenizer(text, add_special_tokens=False)["input_ids"][:20] for text in ask]
    plain = [o.tokens for o in PlainGenerator(tiny_target, 256).generate(ids, params)]
    spec = SpecEngine(tiny_target, draft, 256, num_steps=3, topk=2, num_draft_tokens=6, adaptive=False,
                      log=lambda _: None)
    assert [o.tokens for o in spec.generate(ids, params)] == plain
    with pytest.raises(EagletError, match="other settings"):  # its checkpoint resumes only at its width
        run_train(tiny_target, str(tmp_path / "regenerated.jsonl"), tmp_path, TrainConfig(max_steps=12, **FAST))
    (again := tmp_path / "again").mkdir()
    with pytest.raises(EagletError, match=f"its MLP is {wide} wide, not --draft-intermediate-size {2 * wide}"):
        run_train(tiny_target, _fresh(regenerated, again), again,
                  TrainConfig(max_steps=1, init_draft=str(tmp_path / "draft"), draft_intermediate_size=2 * wide,
                              **FAST))


def test_time_budget_still_exports(tiny_target, regenerated, tmp_path):
    data = _fresh(regenerated, tmp_path)
    res = run_train(tiny_target, data, tmp_path, TrainConfig(max_steps=50, **FAST), time_budget_s=1e-3)
    assert res["stopped_by_clock"] and res["steps"] == 0
    assert (tmp_path / "draft" / "config.json").is_file() and res["val"] is not None


def test_a_generous_budget_trains(tiny_target, regenerated, tmp_path, monkeypatch):
    # Regression: with no step measured yet, the validation-time estimate divided by zero
    # tokens, reserved hours and stopped a 9-minute H200 run at step 0. A clock that
    # advances 5 s per reading makes the first reading's "elapsed" large, as on the H200.
    data = _fresh(regenerated, tmp_path)
    ticks = iter(range(0, 10**6, 5))
    monkeypatch.setattr(time, "time", lambda: float(next(ticks)))
    res = run_train(tiny_target, data, tmp_path, TrainConfig(max_steps=5, **FAST), time_budget_s=3000)
    assert res["steps"] == 5 and not res["stopped_by_clock"]


def test_a_slow_first_step_does_not_end_a_short_budget(tiny_target, regenerated, tmp_path, monkeypatch):
    # Regression (session 51): the first step compiles; a 45-second budget extrapolated validation's time from it
    # and stopped at step 1. Here the first step takes 150 of the 200 fake seconds, the later ones 0.1 s.
    data = _fresh(regenerated, tmp_path)
    clock = [0.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    backward = Trainer._backward

    def timed(self, batch):
        clock[0] += 150.0 if self.step == 0 else 0.1
        return backward(self, batch)

    monkeypatch.setattr(Trainer, "_backward", timed)
    res = run_train(tiny_target, data, tmp_path, TrainConfig(max_steps=5, **FAST), time_budget_s=200)
    assert res["steps"] == 5 and not res["stopped_by_clock"]


def test_offline_features_train(tiny_target, regenerated, tmp_path):
    from eaglet.data.dataset import TokenData

    data = _fresh(regenerated, tmp_path)
    tokens, _ = TokenData.load(regenerated / "tokens-train.safetensors")
    capture_features(tiny_target, tokens, tmp_path / "features", CaptureSpec.eagle3_default(3), progress=False)
    res = run_train(tiny_target, data, tmp_path / "run", TrainConfig(max_steps=3, **FAST),
                    features=str(tmp_path / "features"))
    assert res["steps"] == 3 and res["train_conversations"] == len(tokens)
    with pytest.raises(EagletError, match="hold points"):
        run_train(tiny_target, data, tmp_path / "run2", TrainConfig(max_steps=3, capture_points=(0, 1), **FAST),
                  features=str(tmp_path / "features"))


def test_prompts_without_answers_are_refused(tiny_target, tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hello"}])
    with pytest.raises(EagletError, match="no assistant answers"):
        run_train(tiny_target, str(src), tmp_path / "run", TrainConfig(**FAST))
    with pytest.raises(EagletError, match="add --regenerate"):
        run_train(tiny_target, "builtin", tmp_path / "run", TrainConfig(**FAST))


def test_scores_per_source_add_up_to_the_validation(tiny_target, regenerated, tmp_path):
    from dataclasses import replace

    from eaglet.data.prompts import load_conversations, split_train_val
    from eaglet.train.dist import SINGLE_PROCESS
    from eaglet.train.evaluate import evaluate_sources
    from eaglet.train.pipeline import eos_ids, tokenized

    train, val = split_train_val(load_conversations(regenerated / "regenerated.jsonl"), 0.15)
    cfg = TrainConfig(max_steps=5, **FAST)
    max_len = cfg.seq_len(tiny_target.config.max_position_embeddings)
    data = {name: tokenized(tiny_target, convs, tmp_path / f"{name}.safetensors", max_len, SINGLE_PROCESS)
            for name, convs in (("train", train), ("val", val))}
    trainer = Trainer(cfg, tiny_target, data["train"], data["val"], tmp_path)
    res = trainer.run()
    val = [replace(c, source="a" if i % 2 else "b") for i, c in enumerate(val)]
    rows = evaluate_sources(tiny_target, trainer.draft, val, eos_ids(tiny_target), cfg.ttt_steps, cfg.decay,
                            max_len=max_len)
    assert rows["all"]["positions"] == res["val"]["positions"] == rows["a"]["positions"] + rows["b"]["positions"]
    for j in range(cfg.ttt_steps):
        assert rows["all"][f"acc_{j}"] == pytest.approx(res["val"][f"acc_{j}"], abs=1e-5)


def test_training_device_must_be_the_targets(tiny_target, regenerated, tmp_path):
    """A caller that leaves DistInfo at its default (the CPU) with a target elsewhere is refused before any
    regeneration or training (scripts/ablate.py did, and would have trained an H200 run's draft on the CPU)."""
    with pytest.raises(EagletError, match="training would run on meta"):
        run_train(tiny_target, _fresh(regenerated, tmp_path), tmp_path / "out", TrainConfig(max_steps=1, **FAST),
                  DistInfo(device=torch.device("meta")))
    assert not (tmp_path / "out" / "checkpoint").exists()


def test_no_plot_without_matplotlib(tmp_path, monkeypatch):
    """A bare GPU machine has no matplotlib: checkpoints call plot_accuracy, which then draws nothing."""
    import sys

    from eaglet.train.report import plot_accuracy

    log = tmp_path / "train_log.jsonl"
    log.write_text(json.dumps({"split": "train", "step": 1, "acc_0": 0.5}) + "\n")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    plot_accuracy(log, tmp_path / "acc.png")
    assert not (tmp_path / "acc.png").exists()


@pytest.mark.parametrize("aux_norm", [True, False])
def test_the_export_splits_rows_only_of_a_draft_for_eaglet_alone(tiny_target, regenerated, tmp_path, monkeypatch,
                                                                 aux_norm):
    """A draft with aux_norm runs in eaglet only: a tensor over the shard limit goes in row blocks, so every shard
    still fits (SmolLM2's 24,576-token head is 27 MiB). A draft without it is for other engines: whole tensors."""
    monkeypatch.setattr("eaglet.train.trainer.MAX_SHARD_BYTES", 4096)
    run_train(tiny_target, _fresh(regenerated, tmp_path), tmp_path, TrainConfig(max_steps=1, aux_norm=aux_norm,
                                                                                 **FAST))
    names = json.loads((tmp_path / "draft" / "model.safetensors.index.json").read_text())["weight_map"]
    assert ("lm_head.weight" in names) is not aux_norm and ("lm_head.weight@rows0" in names) is aux_norm
    sizes = [f.stat().st_size for f in (tmp_path / "draft").glob("*.safetensors")]
    assert (max(sizes) <= 4096 + 4096) is aux_norm  # + the safetensors header
    draft, _ = load_draft_for(tmp_path / "draft", tiny_target)
    assert draft.lm_head.weight.shape[0] == draft.config.draft_vocab_size
