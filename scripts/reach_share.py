"""How much of the TTT loss lies on chains a tree never holds: the share of each draft step's anchors that
``--ttt-reach K`` keeps, and the draft's accuracy there against every anchor's.

The target answers prompts greedily (float32, as ``draft_gap.py`` and the doctor do); the trainer's featurizer
feeds the draft; ``TTTLoss`` unrolls it as training does, once counting every anchor (``reach`` 0) and once per K
counting only those whose target token sat in the draft's top K at each earlier step. A K-way tree holds no other
chain, so at step j the rest is loss a draft trained the usual way spends on states serving never reaches.

    PYTHONPATH=. python scripts/reach_share.py --prompts eaglet/data/corpus/other_prompts.jsonl --limit 24
"""

from __future__ import annotations

import torch

from eaglet.doctor.samples import Samples, make_samples, training_features
from eaglet.draft.compat import load_draft_for
from eaglet.loading.target import load_target
from eaglet.speculative.load import resolve_draft
from eaglet.train.ttt import TTTLoss
from scripts.draft_gap import sample_args, show


def step_counts(target, draft, s: Samples, steps: int, ks: list[int]) -> dict[int, torch.Tensor]:
    """K -> [steps, 2]: per draft step the hits and the anchors counted, summed over the conversations (K 0:
    every anchor with a label)."""
    total = {k: torch.zeros(steps, 2) for k in [0, *ks]}
    for i in range(len(s.prompts)):  # one at a time: a padded batch of long answers is large on a CPU
        one = Samples(s.prompts[i: i + 1], s.answers[i: i + 1], s.labels[i: i + 1])
        inp = training_features(target, draft.config.capture, draft, one.token_data())
        args = (inp.aux, inp.emb, inp.ids, inp.mask, inp.target_logp, inp.target_top)
        for k in total:
            # The reach applies where autograd records (training); with the weights frozen nothing is recorded.
            with torch.enable_grad():
                _, stats = TTTLoss(draft, steps, reach=k)(*args)
            total[k] += stats[:, 1:3]
    return total


def main() -> None:
    ap = sample_args(__doc__)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 8])
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    target = load_target(a.target)  # float32 on the CPU
    draft, _ = load_draft_for(resolve_draft(a.draft, target), target)
    draft.eval().requires_grad_(False)
    counts = step_counts(target, draft, make_samples(target, a.prompts, a.limit, a.max_new_tokens, 4096), a.steps,
                         a.k)
    every = counts[0]
    table = {f"step {j}": {"anchors": int(every[j, 1]), "acc": round(float(every[j, 0] / every[j, 1]), 3),
                           **{f"kept K={k}": round(float(counts[k][j, 1] / every[j, 1]), 3) for k in a.k},
                           **{f"acc K={k}": round(float(counts[k][j, 0] / counts[k][j, 1].clamp(min=1)), 3)
                              for k in a.k}}
             for j in range(a.steps)}
    show(table, "by_step", a, 10)


if __name__ == "__main__":
    main()
