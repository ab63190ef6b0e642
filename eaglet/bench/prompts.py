"""Benchmark prompts: JSONL lines of OpenAI ``messages`` or ``{"prompt": ...}``; other keys ride along."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from eaglet.chat import as_messages
from eaglet.errors import EagletError

BUILTIN = Path(__file__).resolve().parent.parent / "data" / "corpus" / "bench_prompts.jsonl"
_PROMPT_KEYS = ("messages", "conversations", "prompt")


@dataclass
class BenchPrompt:
    messages: list[dict]
    meta: dict = field(default_factory=dict)  # every other key of the line (category, source, id, ...)
    ids: list[int] = field(default_factory=list)
    set: str | None = None  # the prompt set it came from (``load_prompt_sets``)

    @property
    def category(self) -> str | None:
        c = self.meta.get("category")
        return None if c is None else str(c)


def load_prompts(spec: str, limit: int | None = None) -> list[BenchPrompt]:
    """Prompts from a JSONL file, or the built-in bench set for ``builtin``; at most ``limit``, taken
    round-robin over the categories (``by_category``) and kept in file order."""
    path = BUILTIN if spec == "builtin" else Path(spec).expanduser()
    if not path.is_file():
        raise EagletError(f"--prompts {spec}: no such file")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):  # not splitlines: see whole_records
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("a line must be a JSON object")
            msgs = as_messages(record)
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            raise EagletError(f"{path}:{n}: {e}") from None
        out.append(BenchPrompt(msgs, {k: v for k, v in record.items() if k not in _PROMPT_KEYS}))
    if not out:
        raise EagletError(f"{path} holds no prompts")
    if limit is not None and limit < len(out):  # ``limit`` of them spread over the categories, in file order
        keep = {id(p) for p in by_category(out)[:limit]}
        out = [p for p in out if id(p) in keep]
    return out


def by_category(items: list[BenchPrompt]) -> list[BenchPrompt]:
    """``items`` round-robin over their categories (the first of each, then the second of each, ...), so
    that a few of them cover every kind: a set's first lines are often one kind (the built-in set opens
    with its 23 code prompts, so its first 20 measured code alone until 2026-12-02)."""
    cats: dict[str, list[BenchPrompt]] = {}
    for it in items:
        cats.setdefault(it.category or "", []).append(it)
    queues = list(cats.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def load_prompt_sets(spec: str, limit: int | None = None) -> list[BenchPrompt]:
    """One prompt set or several, comma-separated (``builtin,other.jsonl``), each limited to ``limit`` and
    named (``builtin`` or the file's stem; the path as given where stems repeat)."""
    parts = [x for x in spec.split(",") if x]
    if len(set(parts)) < len(parts):
        raise EagletError(f"--prompts {spec}: a prompt set is named twice")
    stems = [x if x == "builtin" else Path(x).stem for x in parts]
    names = stems if len(set(stems)) == len(stems) else parts
    out = []
    for part, name in zip(parts, names):
        for p in load_prompts(part, limit):
            p.set = name
            out.append(p)
    return out
