#!/usr/bin/env bash
# The speculative bench matrix of docs/performance.md: one target + draft, greedy, every
# batch size, each `eaglet bench` in its own process (ratios are within each run).
#
#   scripts/bench_matrix.sh [TARGET] [DRAFT] [OUTDIR]      (defaults: smollm2-135m default runs/bench)
#
# Batch 1 runs twice: ours (plain, spec) on all 80 built-in prompts, then all four methods
# on 12 prompts x 128 tokens, because transformers' generate runs at ~33 tok/s on an H200.
# BENCH_TIMEOUT (s, default 300) bounds each run, so one stuck run cannot eat the rest.
# PROMPTS (default builtin) picks the prompt file; LIMIT (default 64) the prompts of the
# batched runs (a multiple of every batch size, so no partial batch is timed).
set -u
target=${1:-smollm2-135m}
draft=${2:-default}
out=${3:-runs/bench}
mkdir -p "$out"

bench() {
  local name=$1
  shift
  echo "== $name: $*"
  timeout "${BENCH_TIMEOUT:-300}" python3 -m eaglet.cli bench --target "$target" --draft "$draft" \
    --prompts "${PROMPTS:-builtin}" --out "$out/$name" "$@" >"$out/$name.log" 2>&1
  echo "exit $?"
  grep -v "it/s\|prompt/s" "$out/$name.log" | tail -n 14
}

bench b1 --batch-size 1 --methods plain,spec
bench b1-hf --batch-size 1 --limit 12 --max-new-tokens 128
for b in ${BATCHES:-4 16 64}; do
  bench "b$b" --batch-size "$b" --limit "${LIMIT:-64}" --methods plain,spec
done
