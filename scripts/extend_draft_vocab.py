"""Write a draft extended to the target's whole vocabulary (``Eagle3Draft.extend_vocab``) as a directory of its own.

    PYTHONPATH=. python scripts/extend_draft_vocab.py --out /tmp/ext [--draft eaglet/drafts/smollm2-135m] [--rows raw]

Serving extends a draft's head at load time (``--extend-draft-vocab``); this writes the extended draft to disk, to
serve it with ``--draft OUT --no-extend-draft-vocab`` or to look at its rows. ``--rows raw`` replaces the mapped rows
by the target's rows as they are: the experiment that showed why the map matters (docs/performance.md, session 39:
accept 2.11 against 2.94 on the 2-core CPU's other set).
"""

from __future__ import annotations

import argparse

import torch

from eaglet.draft.checkpoint import save_draft
from eaglet.draft.compat import load_draft_for
from eaglet.loading import load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--draft", default="eaglet/drafts/smollm2-135m")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--rows", choices=["fit", "raw"], default="fit")
    a = ap.parse_args()

    target = load_target(a.target)
    draft, cfg = load_draft_for(a.draft, target)
    trained = draft.config.draft_vocab_size
    head = target.model.lm_head.weight
    r2 = draft.extend_vocab(head)
    if a.rows == "raw":
        with torch.no_grad():
            draft.lm_head.weight[trained:] = head[draft.vocab_ids()[trained:]]
    save_draft(draft, a.out, target=cfg["eaglet"]["target"], dtype=torch.float32, split_rows=True)
    rows = "the target's as they are" if a.rows == "raw" else f"mapped (R^2 {r2:.3f})"
    print(f"eaglet: {a.out}: {draft.config.draft_vocab_size} tokens, {trained} trained, the others' rows {rows}")


if __name__ == "__main__":
    main()
