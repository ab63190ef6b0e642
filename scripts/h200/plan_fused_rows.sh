#!/bin/bash
# A device plan (after stage.sh 1..13 and wheels.sh install: `AB_DIR=.dev/fr bash scripts/h200/start.sh 300
# plan_fused_rows.sh`, carry [".dev/q14", ".dev/fr"]; ~14 minutes): a compiled prefill fusing one row's buckets only
# (prefill.FUSED_ROWS, session 43) against fusing every bucket (.dev/fr holds eaglet/prefill.py from before:
# `git show 317c187~1:eaglet/prefill.py`). Each tree serves with the shipped draft at batch sizes 1, 16 and 64 and is
# measured at concurrency 16 and 64 (128 requests asked, all 80 bench prompts, 256 new tokens at most): the
# server's "prefills ready" time (this tree first, on the machine's empty caches: a fresh server's start) and
# whether the unfused multi-row admissions cost throughput (session 42's fused run: 17,004.7 / 25,989.8 tok/s).
# First, whether the device's torch reuses the decoder layer's compiled region (on the CPU's torch 2.13 it does not).
S=/tmp/eg/res
t0=$SECONDS
stamp() { echo "### $(date +%T) +$((SECONDS - t0))s $*"; }
stamp "does dynamo reuse the layer's compiled region? (scripts/layer_compile.py; ~2 minutes)"
python3 scripts/layer_compile.py --layers 2 8 --device cuda 2>&1 | tee $S/layer_compile.txt
source scripts/h200/ab_tree.sh
[ -d /tmp/ab_old ] || { echo "no earlier prefill.py in ${AB_DIR:-.dev/ab}"; exit 1; }
for name in one_row every_bucket; do
  dir=$PWD; [ $name = every_bucket ] && dir=/tmp/ab_old
  stamp "$name ($dir): concurrency 16 and 64"
  (cd "$dir" && PYTHONPATH=$dir:/tmp/site SIZES=${SIZES:-1,16,64} LEVELS="${LEVELS:-16 64}" N=${N:-128} DRAFTS=default OFFLINE=0 \
    RUN_TIMEOUT=300 bash scripts/serve_matrix.sh /tmp/smol.gguf $S/fr_$name)
  grep "ready" $S/fr_$name/serve-default.log
done
stamp end
