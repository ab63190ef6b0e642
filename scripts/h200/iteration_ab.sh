#!/bin/bash
# On the device, as a plan (`bash scripts/h200/start.sh 400 iteration_ab.sh`) or alone in a call (carry [".dev/ab"];
# ~3 minutes): SmolLM2's 6,8,48 iteration and plain step at batch 1 (random weights, scripts/spec_step_costs.py), one
# process each: this tree, and a copy of it with the files that .dev/ab holds (at their paths in the repository, say
# `mkdir -p .dev/ab/eaglet/models && git show REV:eaglet/models/tree_attention.py >
# .dev/ab/eaglet/models/tree_attention.py`) in place, before and after. Each run's JSON line in iteration_ab.jsonl.
export PYTHONPATH=$PWD:/tmp/site
[ "$PWD" = /tmp/eg/repo ] && OUT=/tmp/eg/res
run() {  # $1: what; $2: the tree's directory; the rest: spec_step_costs.py's flags
  echo "### $1 $(date +%T)"
  rm -f /tmp/ab_row.jsonl
  (cd "$2" && PYTHONPATH=$PWD:/tmp/site timeout 150 python3 scripts/spec_step_costs.py --batch 1 --trees 6,8,48 \
    --draft-vocab 24576 "${@:3}" --out /tmp/ab_row.jsonl 2>&1 | tail -1)
  [ -f /tmp/ab_row.jsonl ] && sed "s/^{/{\"run\": \"$1\", /" /tmp/ab_row.jsonl >> "$OUT/iteration_ab.jsonl"
}
source scripts/h200/ab_tree.sh
[ -d /tmp/ab_old ] && run "earlier files" /tmp/ab_old
run "this tree" .
[ -d /tmp/ab_old ] && run "earlier files, again" /tmp/ab_old
# WIDTH=3072: also this tree's iteration with a draft MLP that wide (what a draft trained with
# --draft-intermediate-size would cost; the shipped draft's is 1,536).
[ -n "$WIDTH" ] && run "this tree, draft MLP $WIDTH" . --draft-intermediate-size "$WIDTH"
cut -c1-300 "$OUT/iteration_ab.jsonl"
