"""How much of a served answer the draft could never propose: the share of answer tokens outside its vocabulary.

    PYTHONPATH=. python scripts/vocab_coverage.py --report docs/runs/cpu_smollm2_session32_whole_sets_528.json \
        [--draft eaglet/drafts/smollm2-135m] [--cuts 12288 16384]

Reads the answers an ``eaglet bench`` report holds (each prompt's text for its first method), encodes them again
with the target's tokenizer (close to the ids decoded, not always the same: a text can encode otherwise than the
tokens it was decoded from) and counts, per prompt set, the tokens outside the draft's vocabulary, whole and cut to
its ``--cuts`` most frequent tokens (``--draft-vocab N``; a frequency-ordered draft lists them first). Greedy
verification accepts a drafted token only where it is the target's, so at such a position every proposal fails.
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", required=True, help="an `eaglet bench` report.json")
    ap.add_argument("--draft", default="eaglet/drafts/smollm2-135m")
    ap.add_argument("--target", default="smollm2-135m", help="whose tokenizer encodes the answers")
    ap.add_argument("--cuts", type=int, nargs="*", default=[12288])
    a = ap.parse_args()

    target_dir = resolve_target_dir(a.target)
    tok = load_tokenizer(target_dir)
    order = draft_order(Path(a.draft), read_config(target_dir).num_layers)
    sizes, counts = outside(json.loads(Path(a.report).read_text()), order,
                            lambda text: encode_text(tok, text), a.cuts)
    print(f"{'set':<16} {'tokens':>7}  " + "  ".join(f"outside {n:>6}" for n in sizes))
    for name, row in counts.items():
        print(f"{name:<16} {row[0]:>7}  " + "  ".join(f"{row[1 + i] / row[0]:>14.2%}" for i in range(len(sizes))))


if __name__ == "__main__":
    main()
