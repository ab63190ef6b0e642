#!/bin/bash
# A device plan (after the staging; `start.sh 300 plan_extvocab.sh`, ~2 minutes): the shipped draft's head as trained
# against the head extended to the target's whole vocabulary (--extend-draft-vocab, off on CUDA by default), by
# plan_train.sh's side-by-side command (eager 6,8,48, the policy off, 20 x 128 a set), one process each.
S=/tmp/eg/res; E="python3 -m eaglet.cli"
t0=$SECONDS
stamp() { echo "### $(date +%T) +$((SECONDS - t0))s $*"; }
for v in no-extend extend; do
  stamp "accept, draft head: $v"
  $E bench --target /tmp/smol.gguf --prompts builtin,eaglet/data/corpus/other_prompts.jsonl \
    --limit 20 --max-new-tokens 128 --methods spec --num-steps 6 --tree-topk 8 --num-draft-tokens 48 \
    --policy off --no-compile --no-compile-prefill --$v-draft-vocab --out $S/vocab_$v
done
stamp end
