#!/bin/bash
# On the device, one call, no staging (~7 minutes on a fresh machine; timeout 540): the draft's fc and layer in int8
# (--int8-draft-layer, session 52) for issue 11's Llama-3.1-8B-shaped goal. The draft's six GEMMs alone, cuBLAS bf16
# against eaglet::int8_matmul with and without split inputs (scripts/int8_layer_micro.py), then the 6,8,48 iteration
# at batch 1 with random weights (scripts/spec_step_costs.py): bf16, the head in int8, head and layer in int8, on
# the 8B shape and on SmolLM2's; then the CUDA tests of the int8 kernel and the graphed engine. Writes micro.txt and
# steps_<shape>_<how>.jsonl to $OUT, or to /tmp/eg/res when run as a plan (`bash scripts/h200/start.sh 400
# int8_layer.sh` after the staging calls: watch.sh returns it). With the GGUF staged (/tmp/smol.gguf) ACCEPT=1 also
# benches the shipped draft's accept length with the whole draft in int8 against bf16 (eager 6,8,48, the policy
# off, 20 x 128 a set; accept_ab.sh) and prints pick.py's verdict.
export PYTHONPATH=$PWD:/tmp/site
[ "$PWD" = /tmp/eg/repo ] && OUT=/tmp/eg/res
nvidia-smi --query-gpu=name --format=csv,noheader
echo "### int8_layer_micro $(date +%T)"
timeout 120 python3 scripts/int8_layer_micro.py --shape llama3-8b --rows 1 8 2>&1 | grep -v -i warn \
  | tee "$OUT/micro.txt"
for shape in llama3-8b smollm2-135m; do
  vocab=$([ $shape = llama3-8b ] && echo 32000 || echo 24576)
  for how in bf16 head all; do
    flags=$(case $how in head) echo --int8-draft-head;; all) echo --int8-draft-head --int8-draft-layer;; esac)
    echo "### step costs $shape $how $(date +%T)"
    # shellcheck disable=SC2086
    timeout 150 python3 scripts/spec_step_costs.py --shape $shape --batch 1 --trees 6,8,48 --draft-vocab $vocab \
      $flags --out "$OUT/steps_${shape}_$how.jsonl" 2>&1 | tail -2
  done
done
echo "### tests $(date +%T)"
timeout 240 python3 -m pytest -q tests/models/test_int8_matmul.py tests/speculative/test_cuda_engine.py 2>&1 | tail -4
if [ "$ACCEPT" = 1 ] && [ -f /tmp/smol.gguf ]; then
  bash scripts/h200/accept_ab.sh "$OUT" int8 "--int8-draft-head --int8-draft-layer" bf16 --no-int8-draft-head
fi
echo "### end $(date +%T)"
