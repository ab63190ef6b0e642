#!/bin/bash
# On the device, as a plan (`bash scripts/h200/start.sh 400 argmax_ab.sh`) or alone in a call (~2.5 minutes): SmolLM2's
# 6,8,48 iteration at batch 1 (random weights) with the verify's two-stage argmax in chunks of 128 (today's
# ARGMAX_CHUNK) and of 1,024, in one process each, one after the other: argmax_<chunk>.jsonl.
export PYTHONPATH=$PWD:/tmp/site
[ "$PWD" = /tmp/eg/repo ] && OUT=/tmp/eg/res
for c in 128 1024; do
  echo "### argmax chunk $c $(date +%T)"
  timeout 150 python3 scripts/spec_step_costs.py --batch 1 --trees 6,8,48 --draft-vocab 24576 --argmax-chunk $c \
    --out "$OUT/argmax_$c.jsonl" 2>&1 | tail -2
done
