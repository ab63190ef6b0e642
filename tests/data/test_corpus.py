"""Checks on the shipped prompt corpus (eaglet/data/corpus/), built by scripts/build_corpus.py."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

CORPUS_DIR = Path(__file__).resolve().parents[2] / "eaglet" / "data" / "corpus"
CORPUS = CORPUS_DIR / "smollm2_prompts.jsonl.xz"
BENCH = CORPUS_DIR / "bench_prompts.jsonl"
ROLES = {"system", "user", "assistant"}


def _check_messages(messages: object) -> None:
    assert isinstance(messages, list) and messages
    for m in messages:
        assert set(m) == {"role", "content"}
        assert m["role"] in ROLES
        assert isinstance(m["content"], str)
    assert messages[-1]["role"] == "user"
    assert messages[-1]["content"].strip()
    # a system message, if any, comes first
    assert all(m["role"] != "system" for m in messages[1:])


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    with lzma.open(CORPUS, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture(scope="module")
def bench() -> list[dict]:
    with open(BENCH, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_corpus_loads_and_is_well_formed(rows: list[dict]) -> None:
    assert len(rows) > 10_000
    for row in rows:
        assert set(row) == {"messages", "source", "split", "category"}
        assert row["split"] in ("train", "val")
        assert isinstance(row["category"], str) and row["category"]
        assert row["source"] in ("chitchat", "chitchat-heldout", "human-eval") or row["source"].startswith("evals/")
        _check_messages(row["messages"])


def test_no_duplicate_prompts(rows: list[dict]) -> None:
    keys = [json.dumps(r["messages"], sort_keys=True) for r in rows]
    assert len(keys) == len(set(keys))


def test_train_and_val_sources_are_disjoint(rows: list[dict]) -> None:
    train = {r["source"] for r in rows if r["split"] == "train"}
    val = {r["source"] for r in rows if r["split"] == "val"}
    assert train and val
    assert not train & val
    assert "human-eval" in val


def test_val_is_not_empty(rows: list[dict]) -> None:
    val = [r for r in rows if r["split"] == "val"]
    assert len(val) >= 500
    assert sum(r["source"] == "human-eval" for r in val) == 164
    assert sum(r["source"] == "chitchat-heldout" for r in val) > 300  # held-back chat beside the unseen evals
    assert len({r["source"] for r in val if r["source"].startswith("evals/")}) >= 10


def test_bench_comes_from_val_only(rows: list[dict], bench: list[dict]) -> None:
    val_sources = {r["source"] for r in rows if r["split"] == "val"}
    val_prompts = {json.dumps(r["messages"], sort_keys=True) for r in rows if r["split"] == "val"}
    assert len(bench) == 80
    for row in bench:
        assert set(row) == {"messages", "category", "source"}
        _check_messages(row["messages"])
        assert row["source"] in val_sources
        assert json.dumps(row["messages"], sort_keys=True) in val_prompts
    coding = [r for r in bench if r["source"] == "human-eval"]
    assert len(coding) == 20
    assert all(r["messages"][-1]["content"].startswith("Complete this Python function:\n\n") for r in coding)
