"""Conversations from JSONL files or the built-in corpus.

A line is one JSON object in the OpenAI ``messages`` form or the ShareGPT
``conversations`` (``from``/``value``) form, multi-turn (see ``eaglet.chat.as_messages``).
Optional fields: ``id`` (else a hash of the messages), ``split`` (``train``/``val``),
``source``, ``finish_reason`` (``length`` marks an answer cut at max_new_tokens),
``answer_ids`` (the target's own token ids of the last assistant message, as
``data regenerate`` writes them: training then reads exactly what the target produced),
``target_turns`` (how many of the last assistant messages the target wrote; default 1 for a
record with ``answer_ids``, else 0: unknown).
Malformed lines are skipped and counted, and the count is printed; a dataset with no
usable line is one clear error. ``.jsonl.gz`` and ``.jsonl.xz`` files are read transparently.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from eaglet.chat import as_messages
from eaglet.errors import EagletError

BUILTIN = "builtin"
CORPUS = Path(__file__).resolve().parent / "corpus" / "smollm2_prompts.jsonl.xz"


@dataclass(frozen=True)
class Conversation:
    id: str
    messages: tuple[dict, ...]  # {"role", "content"}, system first if any
    split: str | None = None  # "train" / "val" when the file says so
    source: str | None = None
    truncated: bool = False  # the last assistant answer was cut at the length limit
    answer_ids: tuple[int, ...] | None = None  # the target's token ids of the last assistant message
    target_turns: int = 0  # the last this-many assistant messages are the target's own (0: unknown)

    @property
    def has_answer(self) -> bool:
        return any(m["role"] == "assistant" for m in self.messages)

    def prompt(self) -> list[dict]:
        """The messages up to and including the last user turn (what the target answers)."""
        last_user = max(i for i, m in enumerate(self.messages) if m["role"] == "user")
        return list(self.messages[: last_user + 1])


def note(msg: str) -> None:
    """A one-line progress or warning message on stderr (stdout stays for results)."""
    print(f"eaglet: {msg}", file=sys.stderr, flush=True)


def conversation_id(messages: Iterable[dict]) -> str:
    blob = json.dumps([[m["role"], m["content"]] for m in messages], ensure_ascii=False)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def parse_record(record: object) -> Conversation:
    """One JSON value -> Conversation; ValueError says why a line is unusable."""
    if not isinstance(record, dict):
        raise ValueError("the line is not a JSON object")
    messages = as_messages(record)
    roles = [m["role"] for m in messages if m["role"] != "system"]
    if not roles or roles[0] != "user":
        raise ValueError("the conversation must start with a user turn (after an optional system message)")
    if any(m["role"] == "system" for m in messages[1:]):
        raise ValueError("a system message may only come first")
    rid = record.get("id")
    split = record.get("split")
    if split is not None and split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    msgs = tuple({"role": m["role"], "content": m["content"]} for m in messages)
    answer_ids = record.get("answer_ids")
    if answer_ids is not None:
        if msgs[-1]["role"] != "assistant":
            raise ValueError("answer_ids given but the conversation does not end with an assistant message")
        if not isinstance(answer_ids, list) or not all(isinstance(t, int) and t >= 0 for t in answer_ids):
            raise ValueError("answer_ids must be a list of non-negative token ids")
        answer_ids = tuple(answer_ids)
    target_turns = record.get("target_turns", 1 if answer_ids is not None else 0)
    if not isinstance(target_turns, int) or not 0 <= target_turns <= sum(m["role"] == "assistant" for m in msgs):
        raise ValueError("target_turns must count some of the conversation's assistant messages")
    return Conversation(id=str(rid) if isinstance(rid, (str, int)) else conversation_id(msgs), messages=msgs,
                        split=split, source=record.get("source"),
                        truncated=record.get("finish_reason") == "length", answer_ids=answer_ids,
                        target_turns=target_turns)


def read_jsonl(path: str | Path) -> tuple[list[Conversation], int]:
    """(conversations, number of malformed lines skipped); prints that count when nonzero."""
    path = Path(path)
    if not path.is_file():
        raise EagletError(f"data file {path} does not exist")
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(path.suffix, open)
    out: list[Conversation] = []
    bad, first_bad, n_lines = 0, None, 0
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                n_lines += 1
                try:
                    out.append(parse_record(json.loads(line)))
                except (ValueError, TypeError, AttributeError) as e:  # JSONDecodeError is a ValueError
                    bad += 1
                    first_bad = first_bad or f"line {lineno}: {e}"
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise EagletError(f"cannot read {path} ({e})") from None
    if bad:
        note(f"skipped {bad} malformed line{'s' * (bad != 1)} of {n_lines} in {path} (first: {first_bad})")
    if not out:
        raise EagletError(f"{path} holds no usable conversation ({n_lines} lines, {bad} malformed)")
    return out, bad


def load_conversations(spec: str | Path, split: str | None = None) -> list[Conversation]:
    """Conversations of a JSONL file (or several, comma-separated) or of ``builtin``, deduplicated by id.

    ``split`` keeps only records of that split (records without one are kept).
    """
    parts = [CORPUS if str(p) == BUILTIN else Path(p) for p in str(spec).split(",") if p]
    seen: dict[str, Conversation] = {}
    for p in parts:
        for c in read_jsonl(p)[0]:
            seen.setdefault(c.id, c)
    convs = [c for c in seen.values() if split is None or c.split in (None, split)]
    if not convs:
        raise EagletError(f"{spec} holds no conversation of the '{split}' split")
    return convs


def split_train_val(convs: list[Conversation], val_fraction: float) -> tuple[list[Conversation], list[Conversation]]:
    """Use the records' own split when they carry one, else hold out a hash-chosen fraction."""
    if any(c.split is not None for c in convs):
        return [c for c in convs if c.split != "val"], [c for c in convs if c.split == "val"]
    cut = int(val_fraction * 2**32)
    val = [c for c in convs if int(hashlib.sha1(c.id.encode()).hexdigest()[:8], 16) < cut]
    ids = {c.id for c in val}
    return [c for c in convs if c.id not in ids], val
