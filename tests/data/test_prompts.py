"""Prompt JSONL readers: both record forms, multi-turn, malformed lines counted, empty data refused."""

from __future__ import annotations

import pytest

from eaglet.data.prompts import BUILTIN, load_conversations, parse_record, read_jsonl, split_train_val
from eaglet.errors import EagletError
from tests.train.helpers import write_jsonl

OPENAI = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                       {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]}
SHAREGPT = {"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"},
                              {"from": "human", "value": "and 3+3?"}, {"from": "gpt", "value": "6"}]}


def test_both_forms_multi_turn():
    a = parse_record(OPENAI)
    assert [m["role"] for m in a.messages] == ["system", "user", "assistant", "user"]
    assert a.has_answer and a.messages[2]["content"] == "hello"
    assert a.prompt() == list(a.messages)
    b = parse_record(SHAREGPT)
    assert [m["role"] for m in b.messages] == ["user", "assistant", "user", "assistant"]
    assert b.has_answer and b.prompt()[-1] == {"role": "user", "content": "and 3+3?"}
    assert parse_record({**SHAREGPT, "id": 7}).id == "7"
    assert parse_record(SHAREGPT).id == parse_record(SHAREGPT).id  # content hash, stable
    assert parse_record({**OPENAI, "finish_reason": "length"}).truncated


@pytest.mark.parametrize("bad", [
    [1, 2], {"messages": []}, {"messages": [{"role": "assistant", "content": "x"}]},
    {"conversations": [{"from": "alien", "value": "x"}]}, {"messages": [{"role": "user", "content": 3}]},
    {"messages": [{"role": "user", "content": "x"}], "split": "test"},
    {"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "late"}]},
])
def test_malformed_records(bad):
    with pytest.raises(ValueError):
        parse_record(bad)


def test_malformed_lines_are_skipped_and_counted(tmp_path, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", [OPENAI, "{not json", SHAREGPT, '"a string"', "", {"foo": 1}])
    convs, bad = read_jsonl(path)
    assert len(convs) == 2 and bad == 3
    err = capsys.readouterr().err
    assert "skipped 3 malformed lines of 5" in err and "line 2" in err


def test_empty_dataset_is_one_clear_error(tmp_path):
    for name, lines in (("empty.jsonl", []), ("junk.jsonl", ["nope", "{}"])):
        with pytest.raises(EagletError) as e:
            read_jsonl(write_jsonl(tmp_path / name, lines))
        assert "no usable conversation" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(EagletError, match="does not exist"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_builtin_corpus_and_splits(tmp_path):
    val = load_conversations(BUILTIN, "val")
    assert len(val) > 500 and all(c.split == "val" for c in val)
    train, held = split_train_val(load_conversations(BUILTIN), 0.5)
    assert {c.split for c in train} == {"train"} and len(held) == len(val)
    # Records without a split: a hash-chosen fraction is held out, the same one every time.
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"question {i}"} for i in range(400)])
    convs = load_conversations(path)
    t1, v1 = split_train_val(convs, 0.1)
    t2, v2 = split_train_val(convs, 0.1)
    assert [c.id for c in v1] == [c.id for c in v2] and 20 < len(v1) < 60 and len(t1) + len(v1) == 400
