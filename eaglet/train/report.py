"""Training logs: one JSON line per step (and per validation), optional TensorBoard, a PNG of acc_j.

A line holds ``step``, ``split`` (``train``/``val``), ``loss``, ``loss_j``/``acc_j`` for every
draft step ``j`` and ``tau_pred``, the predicted accept length of a chain of all steps
(``1 + sum_i prod_{j<=i} acc_j``, see ``eaglet.train.ttt.predicted_accept_length``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eaglet.errors import EagletError
from eaglet.outputs import atomic_file, write_atomic
from eaglet.train.ttt import predicted_accept_length


def acc_keys(row: dict) -> list[str]:
    """acc_0, acc_1, ... of a summarized row, in step order (not acc_all_j)."""
    return sorted((k for k in row if k[:4] == "acc_" and k[4:].isdigit()), key=lambda k: int(k[4:]))


def summarize(stats: torch.Tensor, decay: float) -> dict:
    """stats [steps, STATS] (``TTTLoss``'s columns) -> loss, loss_j, acc_j, tau_pred (over draft-vocabulary
    labels), acc_all_j and tau_all (every assistant label), acc_serve_j and tau_serve (every assistant label
    in the first ``SERVE_WINDOW`` tokens of its turn), positions."""
    ce, hit, n, n_all, hit_win, n_win = stats.double().cpu().unbind(-1)
    n, n_all, n_win = n.clamp(min=1), n_all.clamp(min=1), n_win.clamp(min=1)
    loss_j, acc_j, acc_all = (ce / n).tolist(), (hit / n).tolist(), (hit / n_all).tolist()
    out = {"loss": sum(decay**j * v for j, v in enumerate(loss_j))}
    out.update({f"loss_{j}": round(v, 5) for j, v in enumerate(loss_j)})
    out.update({f"acc_{j}": round(v, 5) for j, v in enumerate(acc_j)})
    out["tau_pred"] = round(predicted_accept_length(acc_j), 4)
    out.update({f"acc_all_{j}": round(v, 5) for j, v in enumerate(acc_all)})
    out["tau_all"] = round(predicted_accept_length(acc_all), 4)
    acc_serve = (hit_win / n_win).tolist()
    out.update({f"acc_serve_{j}": round(v, 5) for j, v in enumerate(acc_serve)})
    out["tau_serve"] = round(predicted_accept_length(acc_serve), 4)
    out["positions"] = int(stats[0, 2])
    return out


class RunLog:
    """Appends to ``train_log.jsonl`` (truncated past ``start_step`` on resume) and TensorBoard."""

    def __init__(self, out: Path, start_step: int, tensorboard: bool):
        self.path = out / "train_log.jsonl"
        kept = []
        if self.path.is_file():  # drop lines a resumed run will write again
            kept = [ln for ln in self.path.read_text().splitlines() if (_step(ln) or 0) <= start_step]
        write_atomic(self.path, "".join(ln + "\n" for ln in kept))  # a crash here keeps the old log
        self.fh = open(self.path, "a", encoding="utf-8")
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise EagletError("--tensorboard needs the tensorboard package (pip install tensorboard)") from None
            self.tb = SummaryWriter(str(out / "tensorboard"), purge_step=start_step + 1)

    def write(self, row: dict) -> None:
        self.fh.write(json.dumps(row) + "\n")
        self.fh.flush()
        if self.tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(f"{row['split']}/{k}", v, row["step"])

    def close(self) -> None:
        self.fh.close()
        if self.tb is not None:
            self.tb.close()


def _step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def plot_accuracy(log_path: Path, png: Path, smooth: int = 50) -> None:
    """acc_j over training (train: moving average over ``smooth`` steps; val: markers). Without matplotlib
    (a bare GPU machine has torch and transformers only) there is no plot; the log holds the same numbers."""
    try:
        import matplotlib
    except ImportError:
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(ln) for ln in log_path.read_text().splitlines() if ln.strip()]
    train = [r for r in rows if r.get("split") == "train"]
    val = [r for r in rows if r.get("split") == "val"]
    if not train and not val:
        return
    keys = acc_keys((train or val)[0])
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.get_cmap("viridis")
    for i, k in enumerate(keys):
        c = colors(i / max(len(keys) - 1, 1))
        if train:
            xs, ys = [r["step"] for r in train], [r[k] for r in train]
            w = max(1, min(smooth, len(ys) // 5 or 1))
            avg = [sum(ys[max(0, n - w + 1): n + 1]) / len(ys[max(0, n - w + 1): n + 1]) for n in range(len(ys))]
            ax.plot(xs, avg, color=c, label=f"{k} train")
        if val:
            ax.plot([r["step"] for r in val], [r[k] for r in val], "o--", color=c, ms=4,
                    label=f"{k} val" if i in (0, len(keys) - 1) else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("accuracy (teacher-forced)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    last = val[-1] if val else train[-1]
    # tau_all counts tokens outside the draft vocabulary as misses: the figure to compare vocabularies by.
    every = f", {last['tau_all']:.2f} over all tokens" if "tau_all" in last else ""
    ax.set_title(f"EAGLE-3 draft: acc_j per draft step\nlast predicted accept length {last['tau_pred']:.2f} over "
                 f"draft-vocabulary tokens{every}", fontsize=10)
    fig.tight_layout()
    with atomic_file(png) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
