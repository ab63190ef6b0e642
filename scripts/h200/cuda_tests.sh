#!/bin/bash
# On the device, as a plan (`bash scripts/h200/start.sh 400 cuda_tests.sh [more plans]`) or alone in a call: the
# tests that only run where CUDA is present (the graphed engine's greedy output equal to plain's, with the fused
# top-k and with the int8 draft head; the int8 GEMM and the norm kernels in bf16; the CUDA regeneration and
# feature cache): the whole log in cuda_tests_full.txt, its end in cuda_tests.txt.
export PYTHONPATH=$PWD:/tmp/site
[ "$PWD" = /tmp/eg/repo ] && OUT=/tmp/eg/res
echo "### cuda tests $(date +%T)"
# Files of one folder side by side: in session 38 the device's pytest found no `target` (tests/speculative/conftest.py)
# for test_prefill.py's tests when other folders came between it and its neighbours (pytest 9.0 here finds it in either
# order); in this order all 64 passed on the device (session 39, 4:43: give this script a call of its own).
timeout 420 python3 -m pytest -q -rs -p no:warnings --durations=5 tests/speculative/test_cuda_engine.py \
  tests/speculative/test_fused_top_k.py tests/speculative/test_prefill.py tests/models/test_int8_matmul.py \
  tests/models/test_rms_norm.py tests/models/test_slot_moves.py tests/test_session_chunk.py tests/test_kv_cache.py tests/data/test_cuda_regenerate.py \
  tests/train/test_feature_cache.py > "$OUT/cuda_tests_full.txt" 2>&1
# the whole log comes back; the last lines (the summary's counts last) go to the plan's log
tail -25 "$OUT/cuda_tests_full.txt" | tee "$OUT/cuda_tests.txt"
echo "### cuda tests end $(date +%T)"
