"""A CPU probe of the training loss: retrain only the draft's LM head on step-0 anchors, with and without a
hard term on the target's argmax beside the soft cross-entropy, and score draft step 0 on prompts it never saw.

The draft's body stays frozen, so every arm sees the same normed step-0 states; the head (hidden x draft vocabulary)
is fitted from the shipped weights for the same steps with the loss ``(1 - w) * soft + w * hard``: ``soft`` the
cross-entropy against the target's distribution over the draft vocabulary (its top ``--label-top`` tokens,
renormalised, to keep the labels in memory), ``hard`` the cross-entropy of the target's argmax where the draft
vocabulary holds it. Training anchors: the target's greedy answers (float32, 128 tokens) to prompts of the
built-in corpus's training split; scored on answers to prompts of its validation split (held-out sources) and of
the other prompt set. Greedy serving accepts the draft's argmax where it equals the target's, so acc_0 (and acc_0
where the target is unsure, below 0.5) is what the hard term should move; this is one layer of the draft, not a
training run.

    PYTHONPATH=. python scripts/head_probe.py --train-prompts 384 --weights 0,0.5,1
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from eaglet.data.prompts import load_conversations
from eaglet.doctor.samples import Samples, answered, make_samples, prompt_ids, step0_by_conversation
from eaglet.draft.compat import load_draft_for
from eaglet.loading.target import load_target
from eaglet.speculative.load import resolve_draft

UNSURE = 0.5


def corpus_samples(target, split: str, n: int, seed: int, max_new: int, batch: int = 64) -> Samples:
    """The target's greedy answers to ``n`` seeded prompts of the built-in corpus's ``split``."""
    convs = [c for c in load_conversations("builtin", split) if any(m["role"] == "user" for m in c.messages)]
    random.Random(seed).shuffle(convs)
    prompts = []
    for c in convs:
        if len(p := prompt_ids(target.tokenizer, c.messages)) <= 256:
            prompts.append(p)
        if len(prompts) == n:
            break
    return answered(target, prompts, [split] * len(prompts), max_new, 512, batch)


def step0_anchors(target, draft, s: Samples, label_top: int) -> dict[str, torch.Tensor]:
    """Normed step-0 states [n, H], the target's top ``label_top`` draft ids and log-probs (renormalised) [n, k],
    its argmax as a draft id (-1 outside the draft vocabulary) [n], and its argmax probability [n]."""
    inv = torch.full((target.config.vocab_size,), -1, dtype=torch.long)
    inv[draft.vocab_ids()] = torch.arange(draft.config.draft_vocab_size)
    parts: dict[str, list[torch.Tensor]] = {"h": [], "ids": [], "logp": [], "top": [], "p": []}
    for _, inp, rows, cols, out in step0_by_conversation(target, draft, s):
        logp = inp.target_logp[rows, cols + 1]  # [n, Vd]
        top = logp.topk(label_top, dim=-1)
        parts["h"].append(draft.norm(out))
        parts["ids"].append(top.indices)
        parts["logp"].append(top.values.log_softmax(-1))
        parts["top"].append(inv[inp.target_top[rows, cols + 1]])
        parts["p"].append(logp.max(-1).values.exp())
    return {k: torch.cat(v) for k, v in parts.items()}


def fit(w0: torch.Tensor, a: dict[str, torch.Tensor], weight: float, steps: int, lr: float, batch: int,
        seed: int) -> torch.Tensor:
    head = w0.clone().requires_grad_(True)
    opt = torch.optim.AdamW([head], lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    n = a["h"].shape[0]
    for _ in range(steps):
        idx = torch.randint(n, (batch,), generator=g)
        lp = (a["h"][idx] @ head.T).log_softmax(-1)  # [b, Vd]
        soft = -(a["logp"][idx].exp() * lp.gather(1, a["ids"][idx])).sum(-1).mean()
        known = a["top"][idx] >= 0
        hard = -lp[known].gather(1, a["top"][idx][known, None]).mean()
        loss = (1 - weight) * soft + weight * hard
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.detach()


def scores(head: torch.Tensor, a: dict[str, torch.Tensor]) -> dict[str, float]:
    top2 = (a["h"] @ head.T).topk(2, dim=-1).indices  # [n, 2]
    hit1, hit2 = top2[:, 0] == a["top"], (top2 == a["top"][:, None]).any(-1)
    unsure = a["p"] < UNSURE
    r = lambda t: round(float(t.float().mean()), 4)  # noqa: E731
    return {"acc_0": r(hit1), "top2_0": r(hit2), "acc_0_unsure": r(hit1[unsure]), "top2_0_unsure": r(hit2[unsure])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train-prompts", type=int, default=384)
    ap.add_argument("--val-prompts", type=int, default=96)
    ap.add_argument("--other", default="eaglet/data/corpus/other_prompts.jsonl")
    ap.add_argument("--other-prompts", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--label-top", type=int, default=32)
    ap.add_argument("--weights", default="0,0.5,1", help="the hard term's weight of each arm")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    target = load_target("smollm2-135m")
    draft, _ = load_draft_for(resolve_draft("default", target), target)
    draft.eval()
    t0 = time.perf_counter()
    with torch.no_grad():
        sets = {"train": corpus_samples(target, "train", a.train_prompts, a.seed, a.max_new_tokens),
                "val": corpus_samples(target, "val", a.val_prompts, a.seed, a.max_new_tokens),
                "other": make_samples(target, a.other, a.other_prompts, a.max_new_tokens, 4096)}
        data = {k: step0_anchors(target, draft, s, a.label_top) for k, s in sets.items()}
    counts = {k: v["h"].shape[0] for k, v in data.items()}
    print(f"anchors: {counts} ({time.perf_counter() - t0:.0f} s)", flush=True)
    w0 = draft.lm_head.weight.detach().float()
    rows = {"shipped head": {k: scores(w0, data[k]) for k in ("val", "other")}}
    for wt in (float(x) for x in a.weights.split(",")):
        head = fit(w0, data["train"], wt, a.steps, a.lr, a.batch, a.seed)
        rows[f"w={wt:g}"] = {k: scores(head, data[k]) for k in ("val", "other")}
        print(f"w={wt:g}: {rows[f'w={wt:g}']}", flush=True)
    metrics = list(rows["shipped head"]["val"])
    print(f"\n{'arm':14}" + "".join(f"{s + ' ' + m:>22}" for s in ("val", "other") for m in metrics))
    for arm, r in rows.items():
        print(f"{arm:14}" + "".join(f"{r[s][m]:>22}" for s in ("val", "other") for m in r[s]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "anchors": counts, "arms": rows}, f, indent=1)


if __name__ == "__main__":
    main()
