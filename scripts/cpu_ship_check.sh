#!/bin/bash
# What a candidate SmolLM2 draft must show on the 2-core CPU before it replaces the shipped one (issue 12), in the
# order the docs quote it: `eaglet doctor` (every check, float32), the accept length over both whole prompt sets
# with the CPU's tree 5,2,8 (the policy off, 128 tokens: issue 12's CPU goal, 3.0 on each set), then speed, plain
# against speculative with default flags over 20 prompts a set (issue 11's CPU goal, 1.5x, outputs identical).
# ~13 minutes on an idle 2-core machine (session 49). Reports go to OUT (default runs/ship_check); the last lines
# are a summary.
#   bash scripts/cpu_ship_check.sh DRAFT_DIR [OUT]
set -euo pipefail
draft=${1:?usage: cpu_ship_check.sh DRAFT_DIR [OUT]}
out=${2:-runs/ship_check}
[ -f "$draft/config.json" ] || { echo "$draft holds no draft (config.json missing)"; exit 2; }
mkdir -p "$out"
sets=builtin,eaglet/data/corpus/other_prompts.jsonl
eaglet doctor --draft "$draft" --device cpu --json "$out/doctor.json" || echo "doctor: a check failed (see above)"
eaglet bench --draft "$draft" --prompts $sets --max-new-tokens 128 --methods spec --policy off --num-steps 5 \
  --tree-topk 2 --num-draft-tokens 8 --out "$out/whole_528"
eaglet bench --draft "$draft" --prompts $sets --limit 20 --max-new-tokens 128 --methods plain,spec --out "$out/speed"
python3 - "$out" <<'EOF'
import json
import sys

out = sys.argv[1]
doctor = json.load(open(f"{out}/doctor.json"))
whole = json.load(open(f"{out}/whole_528/report.json"))
speed = json.load(open(f"{out}/speed/report.json"))
print("doctor:", ", ".join(f"{c['number']} {c['title']} {c['status']}" for c in doctor["checks"]))
print("accept, 5,2,8 over the whole sets:", {s: round(v["methods"]["spec"]["accept_length"], 2)
                                             for s, v in whole["by_set"].items()})
by_set = {s: v["speedup"]["spec_over_plain"] for s, v in speed["by_set"].items()}
print("speed, 20 prompts a set, spec over plain:", speed["speedup"]["spec_over_plain"], by_set,
      "identical:", speed["identical_to_plain"]["spec"])
EOF
