"""Two bench reports side by side (a new draft's, the shipped one's): accept length per prompt set and a verdict.

    python scripts/h200/pick.py NEW/report.json SHIPPED/report.json

NEW when the mean over the sets is at least 0.05 higher and no set is more than 0.05 lower, else KEEP.
"""

import json
import sys


def main() -> None:
    new, old = (json.load(open(p)) for p in sys.argv[1:3])
    diffs = []
    for name, got in new["by_set"].items():
        a = got["methods"]["spec"]["accept_length"]
        b = old["by_set"][name]["methods"]["spec"]["accept_length"]
        diffs.append(a - b)
        print(f"{name:16s} new {a:.2f}  shipped {b:.2f}  {a - b:+.2f}")
    print("verdict:", "NEW" if sum(diffs) / len(diffs) >= 0.05 and min(diffs) > -0.05 else "KEEP")


if __name__ == "__main__":
    main()
