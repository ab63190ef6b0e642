#!/bin/bash
# On the device, as a plan (`bash scripts/h200/start.sh 400 iteration_ab.sh`) or alone in a call (carry [".dev/ab"];
# ~4 minutes): SmolLM2's 6,8,48 iteration at batch 1 (random weights, scripts/spec_step_costs.py), one process each:
# this tree; this tree with the verify's argmax in chunks of 128 (tree.argmax_chunk takes 1,024); and, where .dev/ab holds
# an earlier eaglet/speculative/fused_top_k.py (`git show REV:eaglet/speculative/fused_top_k.py >
# .dev/ab/fused_top_k.py`), a copy of this tree with that file in its place. Each run's JSON line in iteration_ab.jsonl.
export PYTHONPATH=$PWD:/tmp/site
[ "$PWD" = /tmp/eg/repo ] && OUT=/tmp/eg/res
run() {  # $1: what; $2: the tree's directory; the rest: spec_step_costs.py's flags
  echo "### $1 $(date +%T)"
  rm -f /tmp/ab_row.jsonl
  (cd "$2" && PYTHONPATH=$PWD:/tmp/site timeout 150 python3 scripts/spec_step_costs.py --batch 1 --trees 6,8,48 \
    --draft-vocab 24576 "${@:3}" --out /tmp/ab_row.jsonl 2>&1 | tail -1)
  [ -f /tmp/ab_row.jsonl ] && sed "s/^{/{\"run\": \"$1\", /" /tmp/ab_row.jsonl >> "$OUT/iteration_ab.jsonl"
}
if [ -f .dev/ab/fused_top_k.py ]; then
  rm -rf /tmp/ab_old && mkdir -p /tmp/ab_old && tar --exclude=./.git -cf - . | (cd /tmp/ab_old && tar xf -)
  cp .dev/ab/fused_top_k.py /tmp/ab_old/eaglet/speculative/fused_top_k.py
  run "earlier fused top-k" /tmp/ab_old
fi
run "this tree" .
run "argmax chunk 128" . --argmax-chunk 128
[ -f .dev/ab/fused_top_k.py ] && run "earlier fused top-k, again" /tmp/ab_old
cut -c1-300 "$OUT/iteration_ab.jsonl"
