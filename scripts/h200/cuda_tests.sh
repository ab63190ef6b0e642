#!/bin/bash
# On the device, as a plan (`bash scripts/h200/start.sh 400 cuda_tests.sh [more plans]`) or alone in a call: the
# tests that only run where CUDA is present (the graphed engine's greedy output equal to plain's, with the fused
# top-k and with the int8 draft head; the int8 GEMM and the norm kernels in bf16; the CUDA regeneration and
# feature cache), each file's verdict in cuda_tests.txt.
export PYTHONPATH=$PWD:/tmp/site
[ "$PWD" = /tmp/eg/repo ] && OUT=/tmp/eg/res
echo "### cuda tests $(date +%T)"
timeout 420 python3 -m pytest -q -rs --durations=5 tests/speculative/test_cuda_engine.py tests/speculative/test_fused_top_k.py \
  tests/models/test_int8_matmul.py tests/test_session_chunk.py \
  tests/models/test_rms_norm.py tests/speculative/test_prefill.py tests/data/test_cuda_regenerate.py \
  tests/train/test_feature_cache.py 2>&1 \
  | grep -v -i warn | tail -25 | tee "$OUT/cuda_tests.txt"
echo "### cuda tests end $(date +%T)"
