#!/bin/bash
# On the device, as a plan after the CUDA tests (`NO_GGUF=1 AB_DIR=.dev/kv bash scripts/h200/start.sh 300
# cuda_tests.sh plan_kv_layers.sh admission_ab.sh`; no GGUF, ~4 minutes for this part): the decoder layer's compile
# at SmolLM2's 30 layers (scripts/layer_compile.py, random weights, a fresh process with empty caches), this tree and
# a copy of it with the files that $AB_DIR holds in place (session 46 put there the KV cache of one stacked buffer a
# K and V: torch 2.11 compiled each layer's region on its own, 90 regions against 3 on an H100 in session 47).
export PYTHONPATH=$PWD:/tmp/site
[ "$PWD" = /tmp/eg/repo ] && OUT=/tmp/eg/res
run() {  # $1: what; $2: the tree's directory
  echo "### layer_compile, $1 $(date +%T)" | tee -a "$OUT/layer_compile_ab.txt"
  (cd "$2" && PYTHONPATH=$PWD:/tmp/site timeout 300 python3 scripts/layer_compile.py --layers 30 --device cuda 2>&1 \
    | tail -2 | tee -a "$OUT/layer_compile_ab.txt")
}
source scripts/h200/ab_tree.sh
# The earlier tree runs this tree's script: its own lacks the "regions" column.
[ -d /tmp/ab_old ] && cp scripts/layer_compile.py /tmp/ab_old/scripts/ && run "earlier files" /tmp/ab_old
run "this tree" .
