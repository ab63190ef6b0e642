#!/bin/bash
# An H200 plan (start.sh 400 plan_serve.sh, after wheels.sh install): issue 11's iteration costs (random weights: the
# SmolLM2 and Llama-3.1-8B shapes, 6,8,48 at batch 1, SmolLM2's with its 25 costliest kernels; ~3 minutes), issue
# 13's server at concurrency 1 against the offline bench on the same prompts (serve_matrix.sh), then issue 11's batch
# 64 on both prompt sets.
# C1_DRAFTS="default none" adds the plain server at concurrency 1 (speculation never slower, issue 13).
# ONLY=b64 runs the last part alone (no server: wheels.sh install is not needed then); STEPS=0 leaves out the first, B64=0
# the last.
# COLD=1: torch's caches start empty whatever this machine compiled before (a fresh machine's first use, issue 11:
# `COLD=1 ONLY=b64` after another plan reads a cold `bench`'s warm-up in its report's config.warm_up_s).
[ "$COLD" = 1 ] && export TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)" TRITON_CACHE_DIR="$(mktemp -d)"
S=/tmp/eg/res; E="python3 -m eaglet.cli"
t0=$SECONDS
stamp() { echo "### $(date +%T) +$((SECONDS - t0))s $*"; }
if [ "$ONLY" != b64 ] && [ "$STEPS" != 0 ]; then
  stamp "iteration costs, 6,8,48 at batch 1: SmolLM2's shape, then Llama-3.1-8B's"
  python3 scripts/spec_step_costs.py --batch 1 --trees 6,8,48 --draft-vocab 24576 --out $S/steps_smollm2.jsonl \
    --profile 25 | tee $S/steps_smollm2_kernels.txt
  python3 scripts/spec_step_costs.py --shape llama3-8b --batch 1 --trees 6,8,48 --out $S/steps_llama3_8b.jsonl
fi
if [ "$ONLY" != b64 ]; then
  stamp "c1: the server against offline, 64 bench prompts, 256 tokens"
  # Straight into what watch.sh returns, so that a plan cut short by the session's minutes still returns each finished run.
  SIZES=1 LEVELS=1 N=64 DRAFTS="${C1_DRAFTS:-default}" OFFLINE=1 RUN_TIMEOUT=400 bash scripts/serve_matrix.sh /tmp/smol.gguf $S/c1
fi
[ "$B64" = 0 ] && { stamp end; exit 0; }
stamp "batch 64, both sets, plain and spec"
$E bench --target /tmp/smol.gguf --prompts builtin,eaglet/data/corpus/other_prompts.jsonl \
  --methods plain,spec --batch-size 64 --out $S/b64
stamp end
