"""Two bench reports side by side (a new draft's, the shipped one's): accept length per prompt set and a verdict.

    python scripts/h200/pick.py NEW/report.json SHIPPED/report.json

Beside each set's difference, a 95% interval from a paired bootstrap over its prompts (both reports ran the same
prompts): a set's accept length pools its verifies, so each resample divides its prompts' accepted tokens (verifies
times mean accept length) by their verifies. Reports written before session 35 keep no per-prompt verifies; a
prompt's tokens over its mean accept length stand in for them there.
NEW when some set's interval lies above 0 and none lies below it, else KEEP.
Twenty prompts a set read differences of ~0.1 that the interval shows as noise (session 34: -0.14 on the other
set, [-0.35, +0.05]); session 27's +0.30 on it, [+0.06, +0.54], was a gain. Reports without per-prompt records:
NEW when the mean over the sets is at least 0.05 higher and no set is more than 0.05 lower (the rule before).
"""

import json
import random
import sys

RESAMPLES = 2000


def per_prompt(report: dict, name: str) -> dict[int, tuple[float, float]]:
    """prompt index -> (accepted tokens, verifies) of the spec method, for the prompts of set ``name``."""
    out = {}
    for p in report["prompts"]:
        m = p["methods"]["spec"]
        if p["set"] == name and m["accept_length"]:
            verifies = m.get("verifies") or m["tokens"] / m["accept_length"]
            out[p["index"]] = (verifies * m["accept_length"], verifies)
    return out


def interval(new: dict, old: dict, rng: random.Random) -> tuple[float, float] | None:
    """The 2.5th and 97.5th percentiles of the resampled difference in accept length, or None without pairs."""
    keys = sorted(new.keys() & old.keys())
    if len(keys) < 2:
        return None
    def pooled(side: dict, pick: list[int]) -> float:
        return sum(side[k][0] for k in pick) / sum(side[k][1] for k in pick)

    diffs = []
    for _ in range(RESAMPLES):
        pick = [rng.choice(keys) for _ in keys]
        diffs.append(pooled(new, pick) - pooled(old, pick))
    diffs.sort()
    return diffs[int(0.025 * RESAMPLES)], diffs[int(0.975 * RESAMPLES) - 1]


def main() -> None:
    new, old = (json.load(open(p)) for p in sys.argv[1:3])
    rng, diffs, bands = random.Random(0), [], []
    paired = "prompts" in new and "prompts" in old
    for name, got in new["by_set"].items():
        a = got["methods"]["spec"]["accept_length"]
        b = old["by_set"][name]["methods"]["spec"]["accept_length"]
        diffs.append(a - b)
        ci = interval(per_prompt(new, name), per_prompt(old, name), rng) if paired else None
        bands.append(ci)
        band = f"  95% [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""
        print(f"{name:16s} new {a:.2f}  shipped {b:.2f}  {a - b:+.2f}{band}")
    if all(bands):
        better = any(lo > 0 for lo, _ in bands) and not any(hi < 0 for _, hi in bands)
    else:
        better = sum(diffs) / len(diffs) >= 0.05 and min(diffs) > -0.05
    print("verdict:", "NEW" if better else "KEEP")


if __name__ == "__main__":
    main()
