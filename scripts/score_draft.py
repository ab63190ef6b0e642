"""Score a draft on the validation records of a regenerated file: per kind of source, pooled and over
the serving window (each answer's first SERVE_WINDOW tokens), and step-0 accuracy by answer position.

    python scripts/score_draft.py --data runs/recipe/data/regenerated.jsonl [--draft default] \
        [--per-group 24] [--device cpu] [--positions 12]

The records keep their answers (``answer_ids``), so nothing is regenerated: the target only
runs the teacher-forced forward that training runs. ``--positions N`` also buckets the draft's
step-0 hits by answer position over N records per group (how much of the pooled figure comes
from long answers' later, often repetitive tokens).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from ablate import group  # noqa: E402

from eaglet.capture import CaptureSpec  # noqa: E402
from eaglet.chat import encode_chat  # noqa: E402
from eaglet.data.prompts import read_jsonl  # noqa: E402
from eaglet.doctor.samples import Samples, anchors, hit_grids, training_features  # noqa: E402
from eaglet.draft.compat import load_draft_for  # noqa: E402
from eaglet.loading.target import load_target  # noqa: E402
from eaglet.speculative.load import resolve_draft  # noqa: E402
from eaglet.train.evaluate import evaluate_sources  # noqa: E402
from eaglet.train.pipeline import eos_ids  # noqa: E402

BUCKETS = ((0, 32), (32, 64), (64, 128), (128, 256), (256, 512), (512, 10**9))
COLUMNS = ("acc_0", "acc_all_0", "acc_serve_0", "tau_pred", "tau_all", "tau_serve")


def positions(target, draft, convs) -> dict[tuple[int, int], tuple[int, int]]:
    """{answer-position bucket: (step-0 hits, labels)} over the last assistant turn of each record."""
    prompts, answers = [], []
    for c in convs:
        last = max(i for i, m in enumerate(c.messages) if m["role"] == "user")
        prompts.append(encode_chat(target.tokenizer, list(c.messages[: last + 1])))
        answers.append(list(c.answer_ids))
    s = Samples(prompts, answers, [""] * len(convs))
    inp = training_features(target, CaptureSpec(draft.config.capture.points, target.config.num_layers), draft,
                            s.token_data())
    hits = hit_grids(draft, inp.aux, inp, s.prompt_lens, 1)[0]
    where = anchors(inp, s.prompt_lens, 0).cpu()
    out = defaultdict(lambda: [0, 0])
    for r in range(hits.shape[0]):
        for t in torch.nonzero(where[r]).squeeze(1).tolist():
            pos = t + 2 - int(s.prompt_lens[r])  # answer index of the token step 0 predicts at anchor t
            b = next(b for b in BUCKETS if b[0] <= pos < b[1])
            out[b][0] += int(hits[r, t])
            out[b][1] += 1
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a regenerated JSONL file (eaglet data regenerate)")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--draft", default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--per-group", type=int, default=24, help="validation records per kind of source")
    p.add_argument("--positions", type=int, default=0, help="records per group for the by-position table")
    args = p.parse_args()
    torch.manual_seed(0)
    target = load_target(args.target, device=args.device)
    draft, _ = load_draft_for(resolve_draft(args.draft, target), target, device=args.device)
    groups = defaultdict(list)
    for c in read_jsonl(args.data)[0]:
        if c.split == "val" and c.answer_ids:
            groups[group(c)].append(c)
    sample = {g: cs[:: max(1, len(cs) // args.per_group)][: args.per_group] for g, cs in groups.items()}
    # One pass: each record's group stands in for its source, so evaluate_sources scores the groups.
    rows = evaluate_sources(target, draft, [replace(c, source=g) for g, cs in sample.items() for c in cs],
                            eos_ids(target))
    print(f"{'group':18}{'records':>8}" + "".join(f"{c:>12}" for c in COLUMNS))
    for g, row in rows.items():
        print(f"{g:18}{row['conversations']:8d}" + "".join(f"{row[c]:12.3f}" for c in COLUMNS))
    if args.positions:
        print("\nstep-0 accuracy (all answer tokens) by answer position, last assistant turn")
        print(f"{'group':18}" + "".join(f"{f'{lo}-{hi - 1}' if hi < 10**9 else f'{lo}-':>10}" for lo, hi in BUCKETS))
        for g, cs in sample.items():
            got = positions(target, draft, cs[: args.positions])
            print(f"{g:18}" + "".join(f"{got[b][0] / got[b][1]:10.3f}" if got[b][1] else f"{'-':>10}"
                                      for b in BUCKETS))


if __name__ == "__main__":
    main()
