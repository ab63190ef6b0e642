"""Bench results -> report.json (per method, per category, per prompt), report.png, a printed table."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

from eaglet.bench.methods import Run
from eaglet.bench.prompts import BenchPrompt
from eaglet.outputs import atomic_file, write_atomic


def acceptance_by_position(accept_lengths: list[int]) -> list[float]:
    """Fraction of verifies whose draft token at position i (1-based) was accepted: P(accept length > i)."""
    if not accept_lengths:
        return []
    n = len(accept_lengths)
    return [sum(a > i for a in accept_lengths) / n for i in range(1, max(accept_lengths))]


def summarize(runs: list[Run]) -> dict:
    tokens = sum(len(r.tokens) for r in runs)
    # A batch's prompts share one wall time: count each batch once.
    seconds = _batch_seconds(runs)
    accepts = [a for r in runs for a in r.accept_lengths]
    return {
        "prompts": len(runs),
        "tokens": tokens,
        "seconds": round(seconds, 4),
        "tokens_per_s": round(tokens / seconds, 3) if seconds > 0 else None,
        "median_prompt_tokens_per_s": round(statistics.median(r.tokens_per_s for r in runs), 3) if runs else None,
        "accept_length": round(sum(accepts) / len(accepts), 4) if accepts else None,
        "verifies": len(accepts),
        "acceptance_by_position": [round(x, 4) for x in acceptance_by_position(accepts)] or None,
        "accept_length_histogram": dict(sorted(Counter(accepts).items())) or None,
        "seconds_fit": seconds_fit(runs),
    }


def seconds_fit(runs: list[Run]) -> dict | None:
    """At batch 1, a prompt's seconds as a fixed cost plus a cost per token (least squares over prompts):
    the fixed part (prefill, the first token, the last chunk's spare steps) is what a per-step rate hides.
    None when prompts shared batches or their token counts do not vary."""
    if len({r.batch for r in runs}) < len(runs) or len({len(r.tokens) for r in runs}) < 2:
        return None
    slope, intercept = statistics.linear_regression([len(r.tokens) for r in runs], [r.seconds for r in runs])
    return {"fixed_ms": round(1e3 * intercept, 2), "per_token_ms": round(1e3 * slope, 4)}


def _batch_seconds(runs: list[Run]) -> float:
    """Total wall time: runs of one batch carry the same ``batch`` index and seconds."""
    seen: dict[int, float] = {}
    for r in runs:
        seen[r.batch] = r.seconds
    return sum(seen.values())


def speedups(methods: dict[str, dict]) -> dict[str, float]:
    tps = {m: s["tokens_per_s"] for m, s in methods.items() if s.get("tokens_per_s")}
    out = {}
    for a, b in (("spec", "plain"), ("spec", "hf"), ("spec", "hf-lookup"), ("plain", "hf"), ("hf-lookup", "hf")):
        if a in tps and b in tps:
            out[f"{a}_over_{b}"] = round(tps[a] / tps[b], 3)
    return out


def build_report(config: dict, prompts: list[BenchPrompt], runs: dict[str, list[Run]], greedy: bool,
                 texts: dict[str, list[str]]) -> dict:
    methods = {m: summarize(r) for m, r in runs.items()}
    report = {"config": config, "methods": methods, "speedup": speedups(methods)}
    # Greedy: per method, per prompt, whether its tokens are plain decoding's (read by every summary below).
    same = {m: [a.tokens == b.tokens for a, b in zip(r, runs["plain"])] for m, r in runs.items() if m != "plain"
            } if greedy and "plain" in runs else None
    if same is not None:
        report["identical_to_plain"] = {m: {"identical": sum(e), "of": len(e), "all": all(e)} for m, e in same.items()}
    sets = list(dict.fromkeys(p.set for p in prompts if p.set is not None))
    if len(sets) > 1:  # each set is batched on its own (bench/run.py), so its batches' wall times are its own
        report["by_set"] = {}
        for name in sets:
            idx = [i for i, p in enumerate(prompts) if p.set == name]
            per = {m: summarize([r[i] for i in idx]) for m, r in runs.items()}
            report["by_set"][name] = {"methods": per, "speedup": speedups(per)}
            if same is not None:
                report["by_set"][name]["identical_to_plain"] = {m: sum(e[i] for i in idx) for m, e in same.items()}
    cats = sorted({p.category for p in prompts if p.category is not None})
    if cats:
        report["by_category"] = {}
        for c in cats:
            idx = [i for i, p in enumerate(prompts) if p.category == c]
            per = {m: _subset_summary([r[i] for i in idx]) for m, r in runs.items()}
            report["by_category"][c] = {"methods": per, "speedup": speedups(per)}
    rows = []
    for i, p in enumerate(prompts):
        row = {"index": i, **p.meta, **({"set": p.set} if p.set else {}), "prompt_tokens": len(p.ids),
               "methods": {}}
        for m, r in runs.items():
            x = r[i]
            row["methods"][m] = {
                "tokens": len(x.tokens), "seconds": round(x.seconds, 4), "tokens_per_s": round(x.tokens_per_s, 3),
                "finish_reason": x.finish_reason,
                "accept_length": round(sum(x.accept_lengths) / len(x.accept_lengths), 4) if x.accept_lengths else None,
                "verifies": len(x.accept_lengths),
                # Each verify's tokens (accepted drafts + the target's own): where in the answer a run of
                # accepted tokens ended (scripts/vocab_coverage.py reads them).
                **({"accept_lengths": x.accept_lengths} if x.accept_lengths else {}),
                "text": texts[m][i],
            }
        if same is not None:
            row["identical_to_plain"] = {m: e[i] for m, e in same.items()}
        rows.append(row)
    report["prompts"] = rows
    return report


def _subset_summary(runs: list[Run]) -> dict:
    """Per-category numbers: time is apportioned to each prompt by its share of its batch's tokens."""
    s = summarize(runs)
    seconds = sum(r.share for r in runs)
    s["seconds"] = round(seconds, 4)
    s["tokens_per_s"] = round(s["tokens"] / seconds, 3) if seconds > 0 else None
    return s


def write_json(report: dict, out: Path) -> Path:
    return write_atomic(out / "report.json", json.dumps(report, indent=1))


def write_png(report: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    methods = report["methods"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for m, s in methods.items():
        if s.get("acceptance_by_position"):
            acc = s["acceptance_by_position"]
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=m)
    ax.set(title="acceptance by draft position", xlabel="draft position", ylabel="P(accepted)", ylim=(0, 1.05))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ax.lines:
        ax.legend()
    ax = axes[1]
    for m, s in methods.items():
        if s.get("accept_length_histogram"):
            h = {int(k): v for k, v in s["accept_length_histogram"].items()}
            total = sum(h.values())
            ax.bar(list(h), [v / total for v in h.values()], alpha=0.7, label=f"{m} (mean {s['accept_length']:.2f})")
    ax.set(title="accept length per verify (bonus included)", xlabel="tokens per verify", ylabel="fraction")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ax.patches:
        ax.legend()
    ax = axes[2]
    names = list(methods)
    vals = [methods[m]["tokens_per_s"] or 0 for m in names]
    bars = ax.bar(names, vals, color=["#4C72B0", "#DD8452", "#55A868", "#C44E52"][: len(names)])
    for b, v in zip(bars, vals):
        ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.1f}", ha="center", va="bottom")
    cfg = report["config"]
    ax.set(title=f"tokens/s ({cfg['device']}, batch {cfg['batch_size']})", ylabel="tokens/s")
    fig.suptitle(f"{cfg['target']}  draft: {cfg.get('draft') or 'none'}  temperature {cfg['temperature']}")
    return save_png(fig, out)


def save_png(fig, out: Path) -> Path:
    """A finished figure as ``out/report.png`` (closed afterwards)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = out / "report.png"
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def table(report: dict) -> str:
    methods = report["methods"]
    base = methods.get("plain", {}).get("tokens_per_s")
    lines = [f"{'method':<10} {'tok/s':>9} {'median':>9} {'accept':>7} {'vs plain':>9} {'identical':>10}"]
    ident = report.get("identical_to_plain", {})
    for m, s in methods.items():
        tps = s["tokens_per_s"] or 0.0
        rel = f"{tps / base:.2f}x" if base else "-"
        acc = f"{s['accept_length']:.2f}" if s["accept_length"] else "-"
        same = f"{ident[m]['identical']}/{ident[m]['of']}" if m in ident else "-"
        lines.append(f"{m:<10} {tps:>9.2f} {s['median_prompt_tokens_per_s'] or 0:>9.2f} {acc:>7} {rel:>9} {same:>10}")
    for k, v in report["speedup"].items():
        lines.append(f"  {k.replace('_', ' ')}: {v:.2f}x")
    for name, got in report.get("by_set", {}).items():
        n = next(iter(got["methods"].values()))["prompts"]
        acc = (got["methods"].get("spec") or {}).get("accept_length")
        ratios = ", ".join(f"{k.replace('_', ' ')} {v:.2f}x" for k, v in got["speedup"].items())
        same = ", ".join(f"{m} identical {k}/{n}" for m, k in got.get("identical_to_plain", {}).items())
        lines.append(f"  set {name} ({n} prompts): " + ", ".join(x for x in (
            ratios, f"accept {acc:.2f}" if acc else "", same) if x))
    return "\n".join(lines)
