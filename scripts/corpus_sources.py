"""The corpus's sources: evals inputs normalised to chat messages, chitchat windows, HumanEval.

Read by build_corpus.py (run it as a script: these are sibling files, not a package).
"""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter
from pathlib import Path

from corpus_settings import (
    CAP_PER_EVAL,
    CHITCHAT_WINDOW_TURNS,
    EXTRA_CHITCHAT_WINDOWS,
    HUMAN_EVAL_TEMPLATE,
    MAX_CHARS,
    TRAIN_CAP_PER_EVAL,
)

# ---------------------------------------------------------------- prompt normalisation


def _merge_same_role(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for m in messages:
        if out and out[-1]["role"] == m["role"]:
            out[-1] = {"role": m["role"], "content": out[-1]["content"] + "\n\n" + m["content"]}
        else:
            out.append(dict(m))
    return out


def normalize_eval_input(inp: object) -> list[dict[str, str]] | None:
    """Turn an evals ``input`` into ``[system?] (user|assistant)* user``, or None.

    - a string is one user message;
    - ``name: example_user|example_assistant`` (few-shot examples sent as
      system messages) become user/assistant turns;
    - the leading system messages are kept, merged into one;
    - a later system message is an instruction to the model and becomes a
      user turn; with no user turn at all, everything is one user message;
    - consecutive turns of one role are merged; trailing assistant turns dropped.
    """
    if isinstance(inp, str):
        raw = [{"role": "user", "content": inp}]
    elif isinstance(inp, list):
        raw = inp
    else:
        return None
    msgs: list[dict[str, str]] = []
    for m in raw:
        if not isinstance(m, dict):
            return None
        role, content, name = m.get("role"), m.get("content"), m.get("name")
        if not isinstance(content, str) or role not in ("system", "user", "assistant"):
            return None
        if name == "example_user":
            role = "user"
        elif name == "example_assistant":
            role = "assistant"
        content = content.strip()
        if content:
            msgs.append({"role": role, "content": content})
    if not msgs:
        return None
    if not any(m["role"] == "user" for m in msgs):
        return [{"role": "user", "content": "\n\n".join(m["content"] for m in msgs)}]
    n_lead = 0
    while n_lead < len(msgs) and msgs[n_lead]["role"] == "system":
        n_lead += 1
    head = _merge_same_role(msgs[:n_lead])
    rest = [{"role": "user" if m["role"] == "system" else m["role"], "content": m["content"]} for m in msgs[n_lead:]]
    out = head + _merge_same_role(rest)
    while out and out[-1]["role"] != "user":
        out.pop()
    if not out or out[-1]["role"] != "user":
        return None
    return out


def usable(messages: list[dict[str, str]] | None) -> bool:
    if not messages or messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
        return False
    return sum(len(m["content"]) for m in messages) <= MAX_CHARS


def key_of(messages: list[dict[str, str]]) -> str:
    return json.dumps(messages, ensure_ascii=False, sort_keys=True)


# ---------------------------------------------------------------- sources


def read_evals(data_dir: Path, excluded: set[str], rng: random.Random) -> tuple[dict[str, list], dict[str, list]]:
    """({eval folder name: up to CAP_PER_EVAL distinct usable prompts}, {name: up to TRAIN_CAP_PER_EVAL -
    CAP_PER_EVAL more of them, for a training eval}).

    The extras are drawn with a generator of their own per eval, so ``rng`` (which picks the
    first CAP_PER_EVAL, and through them validation and the bench) draws as it always did.
    """
    per_eval: dict[str, list] = {}
    extras: dict[str, list] = {}
    stats: Counter = Counter()
    for eval_dir in sorted(p for p in data_dir.iterdir() if p.is_dir()):
        name = eval_dir.name
        if name in excluded:
            stats["evals excluded (license)"] += 1
            continue
        seen: set[str] = set()
        prompts: list[list[dict[str, str]]] = []
        for path in sorted(eval_dir.rglob("*.jsonl")):
            with open(path, "rb") as fh:
                if fh.read(64).startswith(b"version https://git-lfs"):
                    stats["git-lfs pointer files skipped"] += 1
                    continue
            with open(path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if not isinstance(obj, dict):
                        continue
                    msgs = normalize_eval_input(obj.get("input"))
                    if not usable(msgs):
                        continue
                    k = key_of(msgs)
                    if k not in seen:
                        seen.add(k)
                        prompts.append(msgs)
        if not prompts:
            stats["evals without usable prompts"] += 1
            continue
        first = rng.sample(prompts, CAP_PER_EVAL) if len(prompts) > CAP_PER_EVAL else prompts
        picked = {key_of(m) for m in first}
        rest = [m for m in prompts if key_of(m) not in picked]
        n_more = min(len(rest), TRAIN_CAP_PER_EVAL - CAP_PER_EVAL)
        per_eval[name] = first
        extras[name] = random.Random(f"extra:{name}").sample(rest, n_more)
    for k, v in sorted(stats.items()):
        print(f"  evals: {k}: {v}")
    return per_eval, extras


def read_chitchat(path: Path, rng: random.Random) -> list[tuple[str, list[dict[str, str]], bool]]:
    """(conversation id, prompt, extra): openings (first turn) plus multi-turn windows, one drawn with
    ``rng`` and EXTRA_CHITCHAT_WINDOWS more (``extra``) with a generator of the conversation's own,
    so ``rng`` draws as it did before the extras existed."""
    data = json.loads(path.read_text(encoding="utf-8"))
    out: list[tuple[str, list[dict[str, str]], bool]] = []
    for conv_id in sorted(data):
        turns: list[tuple[str, str]] = []  # (sender, text), consecutive senders merged
        for group in data[conv_id].get("messages", []):
            texts = [u.get("text", "").strip() for u in group if isinstance(u, dict)]
            text = "\n".join(t for t in texts if t)
            if not text or not group:
                continue
            sender = group[0].get("sender")
            if turns and turns[-1][0] == sender:
                turns[-1] = (sender, turns[-1][1] + "\n" + text)
            else:
                turns.append((sender, text))
        if not turns:
            continue
        out.append((conv_id, [{"role": "user", "content": turns[0][1]}], False))
        if len(turns) >= 3:
            out.append((conv_id, _window(turns, rng), False))
            own = random.Random(f"window:{conv_id}")
            out += [(conv_id, _window(turns, own), True) for _ in range(EXTRA_CHITCHAT_WINDOWS)]
    return out


def _window(turns: list[tuple[str, str]], rng: random.Random) -> list[dict[str, str]]:
    """Consecutive turns ending with a user turn, of a length in CHITCHAT_WINDOW_TURNS (or shorter)."""
    end = rng.randrange(2, len(turns))  # the final (user) turn
    n = rng.choice(CHITCHAT_WINDOW_TURNS)
    start = max(end - n + 1, end % 2)  # odd length so it opens with a user turn
    return [{"role": "user" if (end - start - i) % 2 == 0 else "assistant", "content": t}
            for i, (_, t) in enumerate(turns[start: end + 1])]


def read_human_eval(path: Path) -> list[list[dict[str, str]]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        problems = [json.loads(line) for line in fh if line.strip()]
    return [[{"role": "user", "content": HUMAN_EVAL_TEMPLATE.format(prompt=p["prompt"].strip("\n"))}] for p in problems]
