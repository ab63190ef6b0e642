"""Where a draft misses, per prompt category, against how sure the target itself is.

The target answers each prompt greedily (as in the doctor and in self-distillation); the trainer's own
featurizer feeds the draft, and draft step 0 is scored at every answer anchor against the target's argmax
(teacher-forced, as training validates). Each anchor is binned by the target's confidence there: the
probability of its argmax over the draft vocabulary. A set that the draft serves worse either has more
positions where the target is unsure (harder to guess for any draft) or has the draft guessing worse at the same
confidence (it has not learnt that kind of text).
`scripts/score_draft.py` scores a regenerated file's validation records by source instead, without confidence.

    PYTHONPATH=. python scripts/draft_gap.py --prompts eaglet/data/corpus/other_prompts.jsonl --limit 24

The row "outside" holds the anchors whose token lies outside the draft's trained vocabulary: a draft served as
trained misses every one; ``--extend-draft-vocab`` serves it over the whole vocabulary as a CPU does
(``Eagle3Draft.extend_vocab``), whose mapped rows can propose them.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch

from eaglet.doctor.samples import Samples, make_samples, step0_by_conversation
from eaglet.draft.compat import load_draft_for
from eaglet.loading.target import load_target
from eaglet.speculative.load import resolve_draft

SURE, UNSURE = 0.9, 0.5  # the target's argmax probability above / below which an anchor counts as sure / unsure


def score(target, draft, s: Samples, trained: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
    """Per category: [n] tensors over its answer anchors: top-1 and top-2 hits of draft step 0, the target's
    argmax probability at the position predicted, and whether its argmax lies outside ``trained`` ([V] bool over
    target ids: the tokens the draft was trained on)."""
    out: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for i, inp, rows, cols, hidden in step0_by_conversation(target, draft, s):
        top2 = draft.to_target_ids(draft.logits(hidden).topk(2, dim=-1).indices)  # [n, 2]
        want = inp.target_top[rows, cols + 1]  # [n] target ids
        got = out[s.labels[i]]
        got["top1"].append(top2[:, 0] == want)
        got["top2"].append((top2 == want[:, None]).any(-1))
        got["p"].append(inp.target_logp[rows, cols + 1].max(-1).values.exp())
        got["outside"].append(~trained[want])
    return {k: {m: torch.cat(v) for m, v in d.items()} for k, d in out.items()}


def row(x: dict[str, torch.Tensor]) -> dict[str, float]:
    sure, unsure = x["p"] > SURE, x["p"] < UNSURE
    mean = lambda t: round(float(t.float().mean()), 3) if t.numel() else None  # noqa: E731
    return {"anchors": int(x["p"].numel()), "acc_0": mean(x["top1"]), "top2_0": mean(x["top2"]),
            "target_p": mean(x["p"]), "sure_share": mean(sure), "acc_0_sure": mean(x["top1"][sure]),
            "acc_0_unsure": mean(x["top1"][unsure]), "top2_0_unsure": mean(x["top2"][unsure])}


def sample_args(doc: str) -> argparse.ArgumentParser:
    """The options of a script that scores a draft on the target's greedy answers to a prompt set."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="default")
    ap.add_argument("--prompts", default="builtin")
    ap.add_argument("--limit", type=int, default=24, help="prompts, round-robin over the set's categories")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--json", help="write the table here too")
    return ap


def show(table: dict[str, dict], key: str, a: argparse.Namespace, width: int) -> None:
    """Print ``table`` (rows of equal columns; None as "-") and write it with the options to ``a.json`` as ``key``."""
    cols = list(next(iter(table.values())))
    first = max(map(len, table)) + 2
    print(f"{'':{first}}" + "".join(f"{c:>{width}}" for c in cols))
    for name, r in table.items():
        print(f"{name:{first}}" + "".join(f"{'-' if r[c] is None else r[c]:>{width}}" for c in cols))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), key: table}, f, indent=1)


def main() -> None:
    ap = sample_args(__doc__)
    ap.add_argument("--extend-draft-vocab", action="store_true", help="serve the draft over the whole vocabulary")
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    target = load_target(a.target)  # float32 on the CPU, as the doctor runs
    draft, _ = load_draft_for(resolve_draft(a.draft, target), target)
    trained = draft.t2d.clone()  # [V] the tokens it was trained on, before an extension maps the rest
    if a.extend_draft_vocab:
        draft.extend_vocab(target.model.lm_head.weight)
    draft.eval()
    by_cat = score(target, draft, make_samples(target, a.prompts, a.limit, a.max_new_tokens, 4096), trained)
    table = {cat: row(x) for cat, x in sorted(by_cat.items())}
    every = {m: torch.cat([x[m] for x in by_cat.values()]) for m in ("top1", "top2", "p", "outside")}
    table["all"] = row(every)
    if every["outside"].any():
        table["outside"] = row({m: every[m][every["outside"]] for m in ("top1", "top2", "p")})
    show(table, "by_category", a, 14)


if __name__ == "__main__":
    main()
