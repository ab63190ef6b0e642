#!/bin/bash
# A device plan (`NO_GGUF=1 bash scripts/h200/start.sh 300 plan_warmup.sh`, carry [".dev/ab"], no staging; ~13
# minutes): the graphed prefills' cold warm-up and a prompt's admission since they take SDPA's causal path at every length
# (session 40). Before, a compiled prefill asked whether the Triton kernel applies (<= 128 tokens) and compiled
# twice per row count: 4 compiles a model, 8 for a server's target and draft at batch sizes above 1; a fresh H100's
# server printed "prefills ready (151.3 s)" at batch size 1 and 422.0 s at 1, 16 and 64. warm_up_cost.py with empty
# caches counts the compiles per graph (2 a model expected: one row, then more) and TORCH_LOGS names each
# recompile's cause; admission_ab.sh times an admission with this tree and with the files in .dev/ab (the earlier
# attention path, `git show 1373782:PATH`). Session 42 (a server's bars, and this script cut after ~6 min): one row's 12
# lengths compiled once, yet each new length cost ~8-13 s, warm caches or not; the bars fit a cost per new token count
# (rows x length). Two row counts tell it: two rows' buckets that repeat one row's counts (2 x 16 .. 2 x 512) should
# be fast, 2 x 768 and 2 x 1024 slow; the profile by own time names what waits. Session 43 (cold and pow2, each cut
# at 300 s): one row's first bucket compiled in 117 s, its other lengths took 0.04 s each, and two rows' recompile ran
# past 180 s: compiles, not lengths (the pow2 run, a test of the refuted hypothesis, is no longer a default).
export PYTHONPATH=$PWD:/tmp/site
[ "$PWD" = /tmp/eg/repo ] && OUT=/tmp/eg/res
echo "### warm-up cost $(date +%T)"
# Twice over one cache folder: a cold process, then a later one (what a later process still pays); RUNS may add
# pow2, cold again with the lengths in powers of two (7 a row instead of 12). AB=0 leaves out the admission A/B.
for run in ${RUNS:-cold warm}; do
  more=(--cache /tmp/warm_up_cache)
  [ $run = pow2 ] && more=(--cache /tmp/warm_up_cache_pow2 --lengths 16,32,64,128,256,512,1024)
  TORCH_LOGS=recompiles timeout 300 python3 scripts/warm_up_cost.py --device cuda --compile-prefill --rows 2 --top 20 \
    "${more[@]}" > "$OUT/warm_up_cost_$run.txt" 2>&1
  echo "## $run $(date +%T)"
  grep -v "^ \|^$" "$OUT/warm_up_cost_$run.txt" | grep -i "^target\|^draft\|recompil\|prefills,\|warm-up in all\|Error" \
    | cut -c1-200 | tail -60
done
[ "$AB" = 0 ] && exit 0
echo "### admission A/B $(date +%T)"
bash scripts/h200/admission_ab.sh > /dev/null 2>&1
grep -A6 "^### \|admit" "$OUT/admission_ab.txt" | cut -c1-160 | tail -40
echo "### end $(date +%T)"
