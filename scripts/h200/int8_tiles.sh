#!/bin/bash
# A plan (`NO_GGUF=1 bash scripts/h200/start.sh 300 int8_tiles.sh`, no staging; ~5 minutes): issue 11's 8B goal.
# First the two micro-benchmarks (~1 minute, so that a call the budget cuts still returns them): the draft's GEMMs in
# int8 over ten tiles (scripts/int8_layer_micro.py, rows 1 and 8: micro.txt), and the target's GEMMs at verify's 48
# rows against a plain step's one, cuBLAS against the same Triton kernel over the bf16 weights
# (scripts/verify_gemm_micro.py: verify_gemm.txt). Where a tile's cold step at rows 1 beats CONFIG's by more than 5%
# (the micro's --best-out: tile.json), the iterations below run with it (spec_step_costs.py --int8-tile): the
# 8B-shaped 6,8,48 iteration with the draft's head and layer in int8 over the head as served (32,000) and cut in half
# (16,384, as `--draft-vocab` serves a frequency-ordered head), and with verify's GEMMs in the Triton kernel
# (--triton-gemm-rows 16): steps_llama3-8b_int8_{v32000,v16384,triton16}.jsonl. All to /tmp/eg/res.
S=${S:-/tmp/eg/res}
echo "### int8_layer_micro $(date +%T)"
timeout 150 python3 scripts/int8_layer_micro.py --shape llama3-8b --rows 1 8 --best-out "$S/tile.json" 2>&1 \
  | grep -v -i warn | tee "$S/micro.txt"
echo "### verify_gemm_micro $(date +%T)"
timeout 150 python3 scripts/verify_gemm_micro.py --shape llama3-8b --rows 1 48 2>&1 | grep -v -i warn \
  | tee "$S/verify_gemm.txt"
tile=$(cat "$S/tile.json" 2>/dev/null || echo "{}")
for how in v32000 v16384 triton16; do
  vocab=$([ $how = v16384 ] && echo 16384 || echo 32000)
  extra=$([ $how = triton16 ] && echo --triton-gemm-rows 16)
  echo "### step costs llama3-8b int8 $how $(date +%T)"
  # shellcheck disable=SC2086
  timeout 150 python3 scripts/spec_step_costs.py --shape llama3-8b --batch 1 --trees 6,8,48 --draft-vocab $vocab \
    --int8-draft-head --int8-draft-layer --int8-tile "$tile" $extra --out "$S/steps_llama3-8b_int8_$how.jsonl" 2>&1 \
    | tail -2
done
echo "### int8_tiles end $(date +%T)"
