#!/bin/bash
# On the device, one call, no staging (~4 minutes on a fresh machine): the draft's LM head in int8 on CUDA against
# cuBLAS's bf16 head, alone (scripts/head_micro.py, with the verify's argmax by chunk) and inside SmolLM2's 6,8,48
# iteration at batch 1 (scripts/spec_step_costs.py with and without --int8-draft-head, random weights), then the
# CUDA tests of the int8 head. Writes head_micro.txt, steps.jsonl and steps_int8.jsonl to $OUT, or to /tmp/eg/res
# when run as a plan (`bash scripts/h200/start.sh 400 int8_head.sh` after the staging calls: watch.sh returns it).
# With the GGUF staged (/tmp/smol.gguf, as for every plan) ACCEPT=1 also benches the shipped draft's accept length
# both ways (eager 6,8,48, the policy off, 20 x 128 a set) and prints pick.py's verdict.
export PYTHONPATH=$PWD:/tmp/site
# Run as a plan (from start.sh's copy of the tree), the results go where watch.sh collects them.
[ "$PWD" = /tmp/eg/repo ] && OUT=/tmp/eg/res
nvidia-smi --query-gpu=name --format=csv,noheader
echo "### head_micro $(date +%T)"
timeout 150 python3 scripts/head_micro.py --vocabs 24576 --rows 1 8 --argmax-rows 48 2>&1 | grep -v -i warn \
  | tee "$OUT/head_micro.txt"
for h in "" --int8-draft-head; do
  echo "### step costs ${h:-bf16 head} $(date +%T)"
  timeout 120 python3 scripts/spec_step_costs.py --batch 1 --trees 6,8,48 --draft-vocab 24576 $h \
    --out "$OUT/steps${h:+_int8}.jsonl" 2>&1 | tail -3
done
echo "### tests $(date +%T)"
timeout 240 python3 -m pytest -q tests/models/test_int8_matmul.py tests/speculative/test_cuda_engine.py 2>&1 | tail -4
if [ "$ACCEPT" = 1 ] && [ -f /tmp/smol.gguf ]; then
  bash scripts/h200/accept_ab.sh "$OUT" int8 --int8-draft-head bf16 --no-int8-draft-head
fi
echo "### end $(date +%T)"
