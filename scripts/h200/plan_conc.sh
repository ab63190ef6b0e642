#!/bin/bash
# A device plan (after stage.sh 1..16 and wheels.sh install: `bash scripts/h200/start.sh 300 plan_conc.sh`, ~9
# minutes): issue 13's "speculation never slower than no speculation at any concurrency" with today's draft, the
# server at concurrency 16 and 64, speculation on (the shipped draft) and off, 128 bench prompts streamed, 256 new
# tokens at most (scripts/serve_matrix.sh: both servers build batch sizes 1, 16 and 64 before they listen).
# Last measured in session 18 with an older draft (1.82x / 1.08x). N, LEVELS and SIZES as serve_matrix.sh takes them
# (SIZES=16,64 saves each server the batch-1 compiles when minutes are short).
S=/tmp/eg/res
t0=$SECONDS
stamp() { echo "### $(date +%T) +$((SECONDS - t0))s $*"; }
stamp "concurrency ${LEVELS:=16 64}, ${N:=128} requests, batch sizes ${SIZES:-1,16,64}, speculation on and off"
# Straight into what watch.sh returns: session 40 lost the speculative server's finished c16 and c64 runs when the
# minutes ran out while the plain server still warmed up (the copy came at the end).
SIZES="${SIZES:-1,16,64}" LEVELS="$LEVELS" N="$N" OFFLINE=0 RUN_TIMEOUT=300 bash scripts/serve_matrix.sh /tmp/smol.gguf $S/conc
stamp end
