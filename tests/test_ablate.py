"""scripts/ablate.py: which records each variant trains on (validation is never filtered)."""

from __future__ import annotations

import importlib.util
import json
from argparse import Namespace
from pathlib import Path

from eaglet.data.prompts import parse_record, read_jsonl
from tests.train.helpers import load_tiny, make_tiny_target_dir

_spec = importlib.util.spec_from_file_location("ablate", Path(__file__).resolve().parents[1] / "scripts" / "ablate.py")
ablate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ablate)

U, A = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}


def _rec(rid, split="train", source="evals/x", turns=1, **kw):
    msgs = [U, A] * turns
    return parse_record({"id": rid, "messages": msgs, "split": split, "source": source, "answer_ids": [5],
                         "target_turns": turns, **kw})


def test_variants_filter_training_records_and_keep_every_validation_record(tmp_path):
    convs = [_rec("p1"), _rec("p1~t0.7"), _rec("self-3", source="self"), _rec("p1+2", turns=2),
             _rec("self-4", source="self-steered"), _rec("v1", split="val", source="human-eval"),
             _rec("v1+2", split="val", source="human-eval", turns=2),
             _rec("self-9", split="val", source="self-heldout"), _rec("c1", split="val", source="chitchat-heldout"),
             _rec("e1", split="val", source="evals/unseen", finish_reason="length")]
    assert [ablate.kind(c) for c in convs[:5]] == ["greedy", "sampled", "self", "turns", "steered"]
    assert [ablate.group(c) for c in convs[5:]] == ["human-eval", "second turns", "held-out Magpie",
                                                    "held-back chats", "unseen evals"]
    for name, (kinds, _) in ablate.VARIANTS.items():
        path = tmp_path / f"{name}.jsonl"
        assert ablate.write_variant(convs, kinds, path) == len(kinds)
        back = {c.id: c for c in read_jsonl(path)[0]}
        assert {i for i, c in back.items() if c.split == "val"} == {"v1", "v1+2", "self-9", "c1", "e1"}
        assert back["e1"].truncated and back["v1+2"].target_turns == 2 and back["v1"].answer_ids == (5,)


def test_final_takes_the_variant_best_over_the_sources_each_counted_once():
    def row(pooled, *per_source):
        return {"val": {"tau_pred": pooled}, "sources": {g: {"tau_pred": t} for g, t in zip(ablate.GROUPS, per_source)}}

    chats_only = row(2.5, 1.0, 1.0, 6.0, 1.0, 1.0)  # long easy chats win the pooled number, nothing else
    assert ablate.macro_tau(chats_only) == 2.0
    rows = {"base": chats_only, "all": row(2.1, 2.2, 2.2, 2.2, 2.2, 2.2), "final": row(9.0, 9, 9, 9, 9, 9)}
    assert ablate.best_variant(rows) == "all"  # a final row (not a variant) is never its own template
    assert ablate.best_variant({"sampled": row(1.7, 1.5), "base": row(1.7, 1.5)}) == "sampled"
    assert ablate.macro_tau({"val": {"tau_pred": 1.2}, "sources": {}}) == 1.2
    # the serving window's figure, where recorded, over the pooled answers' (later tokens are easier)
    windowed = {"val": {"tau_pred": 3.0}, "sources": {g: {"tau_pred": 3.0, "tau_all": 2.8, "tau_serve": 2.0}
                                                      for g in ablate.GROUPS}}
    assert ablate.macro_tau(windowed) == 2.0


def test_every_variant_makes_a_valid_train_config_and_all_means_the_target_vocabulary():
    for name in ablate.VARIANTS:
        kinds, options = ablate.variant(name, 49152)
        cfg = ablate.TrainConfig(**options)  # an option name TrainConfig lacks fails here, not on a GPU
        assert set(kinds) <= {"greedy", "sampled", "self", "steered", "turns"}
        assert cfg.draft_vocab_size in (None, 12288, 49152)
    assert ablate.variant("chat-vocab-all", 260)[1] == {"draft_vocab_size": 260}
    assert ablate.variant("chat", 260) == (ablate.CHAT, {})


def test_recipe_sets_the_regeneration_flags_not_given():
    chat = ablate.RECIPES["chat"]
    args = ablate.parse_args(["--out", "x", "--recipe", "chat", "--max-samples", "24"])
    assert args.max_samples == 24  # given: kept
    assert (args.self_prompts, args.self_prompt_openers, args.follow_ups, args.max_new_tokens) == (
        chat["self_prompts"], chat["self_prompt_openers"], chat["follow_ups"], chat["max_new_tokens"])
    assert tuple(float(a) for a in args.answers.split(",")) == chat["answers"]
    assert args.epochs == 20  # an upper bound for the variants' minutes, not the recipe's epochs
    plain = ablate.parse_args(["--out", "x"])
    assert (plain.max_samples, plain.self_prompts, plain.follow_ups) == (8000, 3000, 0.25)


def test_the_recipes_training_options_are_every_variants_base(monkeypatch):
    """A recipe's training option (the learning rate, say) becomes the base under every variant's own options, so
    `chat` trains as the recipe does; without --recipe the base is empty."""
    monkeypatch.setitem(ablate.RECIPES, "chat", {**ablate.RECIPES["chat"], "lr": 1e-3})
    args = ablate.parse_args(["--out", "x", "--recipe", "chat"])
    assert args.train_base == {"lr": 1e-3} and args.epochs == 20
    assert ablate.parse_args(["--out", "x"]).train_base == {}


def _warm_up_inputs(tmp_path):
    """A tiny target, 20 records (every fifth for validation) and the arguments warm_up reads."""
    tiny_target = load_tiny(make_tiny_target_dir(tmp_path / "target"))
    answer = {"role": "assistant", "content": "the cat sat on the mat and the dog sat on the log"}
    convs = [parse_record({"id": f"p{i}", "messages": [{"role": "user", "content": f"question {i}"}, answer],
                           "split": "val" if i % 5 == 0 else "train", "source": "evals/x"}) for i in range(20)]
    args = Namespace(epochs=20, train_base={"batch_tokens": 256, "ttt_steps": 2, "progress": False}, device="cpu")
    return tiny_target, convs, args


def test_the_warm_up_trains_untimed_steps_and_hands_its_tokens_to_the_first_variant(tmp_path):
    tiny_target, convs, args = _warm_up_inputs(tmp_path)
    ablate.warm_up(args, tiny_target, convs, "chat-label0.5", tmp_path, steps=2)
    log = [json.loads(line) for line in (tmp_path / "warm-up" / "train_log.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in log) == 2  # the steps asked for, no clock
    for f in ("tokens-train.safetensors", "tokens-val.safetensors"):
        assert (tmp_path / "chat-label0.5" / f).read_bytes() == (tmp_path / "warm-up" / f).read_bytes()
    assert not (tmp_path / "chat-label0.5" / "train.json").exists()  # the variant itself is still to train


def test_a_second_warm_up_trains_its_own_steps(tmp_path):
    tiny_target, convs, args = _warm_up_inputs(tmp_path)
    for name in ("chat", "chat-label0.5"):  # a later plan on the same machine warms its own first variant
        ablate.warm_up(args, tiny_target, convs, name, tmp_path, steps=2)
    log = [json.loads(line) for line in (tmp_path / "warm-up" / "train_log.jsonl").read_text().splitlines()]
    # One run's log: two steps trained afresh, then validated (resumed at step 2, it trained none and validated again)
    assert [(r["split"], r["step"]) for r in log] == [("train", 1), ("train", 2), ("val", 2)]
