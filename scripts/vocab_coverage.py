"""How much of a served answer the draft could never propose: the share of answer tokens outside its vocabulary.

    PYTHONPATH=. python scripts/vocab_coverage.py --report docs/runs/cpu_smollm2_session32_whole_sets_528.json \
        [--draft eaglet/drafts/smollm2-135m] [--cuts 12288 16384]

Reads the answers an ``eaglet bench`` report holds (each prompt's text for its first method), encodes them again
with the target's tokenizer (close to the ids decoded, not always the same: a text can encode otherwise than the
tokens it was decoded from) and counts, per prompt set, the tokens outside the draft's vocabulary, whole and cut to
its ``--cuts`` most frequent tokens (``--draft-vocab N``; a frequency-ordered draft lists them first). Greedy
verification accepts a drafted token only where it is the target's, so at such a position every proposal fails.

With ``--breaks`` (a report of ``--methods spec`` with the policy off, whose prompts carry each verify's
``accept_lengths``) it also finds where runs of accepted tokens ended: a verify's last token is the target's own, so a
verify that emitted fewer than the tree's depth + 1 tokens broke there. Counted per set: the breaks at a token
outside the draft's trained vocabulary (cut to ``--draft-vocab`` when given), which only an extended or
whole-vocabulary head can propose, and the accept length if each such break had not happened (that verify and the
next one as one: an upper bound on what proposing those tokens can add).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

from eaglet.chat import encode_text
from eaglet.draft.checkpoint import load_draft
from eaglet.loading.hf import read_config
from eaglet.loading.target import load_tokenizer, resolve_target_dir


def draft_order(draft: Path, num_layers: int) -> list[int]:
    """The target id of each draft id, in the draft's order (``Eagle3Draft.vocab_ids``)."""
    return load_draft(draft, num_layers)[0].vocab_ids().tolist()


def outside(report: dict, order: list[int], encode, cuts: list[int]) -> tuple[list[int], dict[str, list[int]]]:
    """(the vocabulary sizes counted: the whole one, then the cuts below it, ascending; per prompt set [answer
    tokens, then how many lie outside each size]). ``order``: the draft's target ids, most frequent first;
    ``encode``: text -> target ids."""
    rank = {t: i for i, t in enumerate(order)}
    sizes = [len(rank), *sorted(c for c in cuts if c < len(rank))]
    counts: dict[str, list[int]] = defaultdict(lambda: [0] * (1 + len(sizes)))
    for p in report["prompts"]:
        row = counts[p.get("set") or "prompts"]
        for t in encode(next(iter(p["methods"].values()))["text"]):
            row[0] += 1
            for i, n in enumerate(sizes):
                row[1 + i] += rank.get(t, len(rank)) >= n
    return sizes, dict(counts)


def breaks(report: dict, order: list[int], encode, size: int) -> tuple[dict[str, dict], int]:
    """Per prompt set: tokens the verifies emitted, verifies, those that broke, and those that broke at a token
    outside the draft's first ``size`` tokens (``order``: its target ids, most frequent first). Also the prompts left
    out: their text encodes to another number of tokens than were emitted, so verifies cannot be placed on it."""
    rank = {t: i for i, t in enumerate(order)}
    depths = {int(m) for d in report["config"].get("spec_decisions") or [] for m in re.findall(r"num_steps=(\d+)", d)}
    if len(depths) != 1:  # a batch of another size may have run another tree
        raise SystemExit("--breaks needs a report of the spec method with one tree (config.spec_decisions), "
                         f"not {len(depths)}")
    depth = depths.pop()
    stats: dict[str, dict] = defaultdict(lambda: {"emitted": 0, "verifies": 0, "breaks": 0, "outside": 0})
    left_out = 0
    for p in report["prompts"]:
        spec = p["methods"].get("spec") or {}
        lengths = spec.get("accept_lengths")
        if not lengths:
            continue
        ids = encode(spec["text"])
        # An answer that stopped may end with the end-of-turn token, which the text leaves out.
        if spec["tokens"] - len(ids) not in ((0, 1) if spec["finish_reason"] == "stop" else (0,)):
            left_out += 1
            continue
        row = stats[p.get("set") or "prompts"]
        row["emitted"] += sum(lengths)
        pos = 1  # the first token is the prefill's; each verify emits the next ones
        for n in lengths:
            row["verifies"] += 1
            end = pos + n
            if n <= depth and end <= len(ids):  # the tree went no further than n - 1 accepted drafts here
                row["breaks"] += 1
                row["outside"] += rank.get(ids[end - 1], len(rank)) >= size
            pos = end
    return dict(stats), left_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", required=True, help="an `eaglet bench` report.json")
    ap.add_argument("--draft", default="eaglet/drafts/smollm2-135m")
    ap.add_argument("--target", default="smollm2-135m", help="whose tokenizer encodes the answers")
    ap.add_argument("--cuts", type=int, nargs="*", default=[12288])
    ap.add_argument("--breaks", action="store_true", help="also where runs of accepted tokens ended (above)")
    ap.add_argument("--draft-vocab", type=int, help="with --breaks: the draft's trained tokens counted as its first N")
    a = ap.parse_args()

    target_dir = resolve_target_dir(a.target)
    tok = load_tokenizer(target_dir)
    order = draft_order(Path(a.draft), read_config(target_dir).num_layers)
    report = json.loads(Path(a.report).read_text())
    encode = lambda text: encode_text(tok, text)  # noqa: E731
    sizes, counts = outside(report, order, encode, a.cuts)
    print(f"{'set':<16} {'tokens':>7}  " + "  ".join(f"outside {n:>6}" for n in sizes))
    for name, row in counts.items():
        print(f"{name:<16} {row[0]:>7}  " + "  ".join(f"{row[1 + i] / row[0]:>14.2%}" for i in range(len(sizes))))
    if a.breaks:
        size = a.draft_vocab or len(order)
        stats, left_out = breaks(report, order, encode, size)
        print(f"\nwhere runs ended (outside: the draft's first {size} tokens; {left_out} prompts left out)")
        print(f"{'set':<16} {'verifies':>8} {'breaks':>7} {'outside':>8} {'share':>7} {'accept':>7} {'at most':>8}")
        for name, r in stats.items():
            v, e = r["verifies"], r["emitted"]
            print(f"{name:<16} {v:>8} {r['breaks']:>7} {r['outside']:>8} {r['outside'] / max(r['breaks'], 1):>7.2%} "
                  f"{e / v:>7.3f} {e / (v - r['outside']):>8.3f}")


if __name__ == "__main__":
    main()
