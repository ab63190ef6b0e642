"""What a larger draft vocabulary costs a speculative iteration, in plain steps.

    python scripts/draft_vocab_cost.py --sizes 12288 24576 --rounds 4 [--target smollm2-135m] [--device cpu]

Saves a random draft of the target's shape for each vocabulary size (aux-norm, row blocks as
``eaglet train`` exports it), then runs ``eaglet bench --methods plain,spec --policy off`` on each
in turn, ``--rounds`` times. A random draft's proposals are all rejected, so every iteration
commits one token and its time is the tree's cost alone: iteration / plain step =
(spec seconds / verifies) / (plain seconds / plain tokens). Prints one line per run and the means.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from eaglet.capture import CaptureSpec
from eaglet.draft.checkpoint import save_draft
from eaglet.draft.compat import target_identity
from eaglet.draft.model import DraftConfig, Eagle3Draft
from eaglet.loading.target import load_target


def random_draft(target, size: int, out: Path) -> None:
    n = target.config.num_layers
    torch.manual_seed(0)
    d = Eagle3Draft(DraftConfig.for_target(target.config, CaptureSpec((2, n // 2, n - 3), n), size, True))
    d.set_vocab(torch.sort(torch.randperm(target.config.vocab_size)[:size]).values)
    save_draft(d, out, target=target_identity(target), split_rows=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", type=int, nargs="+", default=[12288, 24576])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tree", default="5,2,8", help="num_steps,topk,num_draft_tokens")
    ap.add_argument("--limit", type=int, default=4, help="prompts a run")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    a = ap.parse_args()
    steps, topk, nodes = a.tree.split(",")
    target = load_target(a.target)
    ratios: dict[int, list[float]] = {v: [] for v in a.sizes}
    with tempfile.TemporaryDirectory() as tmp:
        for v in a.sizes:
            random_draft(target, v, Path(tmp) / f"d{v}")
        for r in range(a.rounds):
            for v in a.sizes:
                out = Path(tmp) / f"run{v}-{r}"
                subprocess.run([sys.executable, "-m", "eaglet.cli", "bench", "--target", a.target, "--device", a.device,
                                "--draft", str(Path(tmp) / f"d{v}"), "--limit", str(a.limit), "--max-new-tokens",
                                str(a.max_new_tokens), "--methods", "plain,spec", "--num-steps", steps, "--tree-topk",
                                topk, "--num-draft-tokens", nodes, "--policy", "off", "--out", str(out)],
                               check=True, capture_output=True)
                m = json.loads((out / "report.json").read_text())["methods"]
                step = m["plain"]["seconds"] / m["plain"]["tokens"]
                ratio = m["spec"]["seconds"] / m["spec"]["verifies"] / step
                ratios[v].append(ratio)
                print(f"round {r} vocab {v}: plain step {1e3 * step:.2f} ms, iteration {ratio:.3f} plain steps",
                      flush=True)
    for v, rs in ratios.items():
        print(f"vocab {v}: iteration {statistics.mean(rs):.3f} plain steps (range {min(rs):.3f}-{max(rs):.3f}, "
              f"{len(rs)} runs)")


if __name__ == "__main__":
    main()
