#!/bin/bash
# A device plan (after stage.sh 1..16 and wheels.sh install: `AB_DIR=.dev/fr bash scripts/h200/start.sh 300
# plan_fused_rows.sh`, carry [".dev/q17", ".dev/fr"]; ~16 minutes): a compiled prefill fusing one row's buckets only
# (prefill.FUSED_ROWS, session 43) against fusing every bucket (.dev/fr holds eaglet/prefill.py from before:
# `git show 317c187~1:eaglet/prefill.py`). Each tree serves with the shipped draft at batch sizes 1, 16 and 64 and is
# measured at concurrency 16 and 64 (128 requests asked, all 80 bench prompts, 256 new tokens at most): the
# server's "prefills ready" time (this tree first, after the step costs as in session 43's plan: 58.7 s there) and
# whether the unfused multi-row admissions cost throughput (session 42's fused run: 17,004.7 / 25,989.8 tok/s).
# VARIANTS=one_row serves this tree only (compare with session 42's numbers; ~8 minutes less).
# First, whether the device's torch reuses the decoder layer's compiled region (the CPU's torch 2.13 does since
# session 43's LayerKV: a 30-layer decode step compiles in 20 s instead of 52).
S=/tmp/eg/res
t0=$SECONDS
stamp() { echo "### $(date +%T) +$((SECONDS - t0))s $*"; }
stamp "does dynamo reuse the layer's compiled region? (scripts/layer_compile.py; ~2 minutes)"
python3 scripts/layer_compile.py --layers 2 8 --device cuda 2>&1 | tee $S/layer_compile.txt
stamp "6,8,48 at batch 1: its cost and its compiles (session 43 on an H100: 1.424 / 0.935 ms, compiles 53.0 / 37.3 s)"
python3 scripts/spec_step_costs.py --batch 1 --trees 6,8,48 --draft-vocab 24576 --out $S/steps_smollm2.jsonl 2>&1 \
  | grep -v "^eaglet: compil" | tail -4
VARIANTS=${VARIANTS:-one_row every_bucket}
if [[ $VARIANTS == *every_bucket* ]]; then
  source scripts/h200/ab_tree.sh
  [ -d /tmp/ab_old ] || { echo "no earlier prefill.py in ${AB_DIR:-.dev/ab}"; exit 1; }
fi
for name in $VARIANTS; do
  dir=$PWD; [ $name = every_bucket ] && dir=/tmp/ab_old
  stamp "$name ($dir): concurrency 16 and 64"
  (cd "$dir" && PYTHONPATH=$dir:/tmp/site SIZES=${SIZES:-1,16,64} LEVELS="${LEVELS:-16 64}" N=${N:-128} DRAFTS=default OFFLINE=0 \
    RUN_TIMEOUT=300 bash scripts/serve_matrix.sh /tmp/smol.gguf $S/fr_$name)
  grep "ready" $S/fr_$name/serve-default.log
done
stamp end
