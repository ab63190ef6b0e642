#!/bin/bash
# A device plan (after the staging; `start.sh 300 plan_extvocab.sh`, ~6 minutes): the shipped draft's head as trained
# against the head extended to the target's whole vocabulary (--extend-draft-vocab, off on CUDA by default), in bf16
# and in int8 (an int8 head over 49,152 rows reads the bytes of the bf16 head over 24,576): the accept length by
# plan_train.sh's side-by-side command (eager 6,8,48, the policy off, 128 new tokens) over the whole sets (LIMIT=20
# for 20 a set), one process each, then what each head costs in SmolLM2's 6,8,48 iteration (random weights).
S=/tmp/eg/res; E="python3 -m eaglet.cli"
t0=$SECONDS
stamp() { echo "### $(date +%T) +$((SECONDS - t0))s $*"; }
for run in "as_trained:--no-extend-draft-vocab" "extended:--extend-draft-vocab" \
    "extended_int8:--extend-draft-vocab --int8-draft-head"; do
  name=${run%%:*}; v=${run#*:}
  stamp "accept, draft head $name: $v"
  # shellcheck disable=SC2086
  $E bench --target /tmp/smol.gguf --prompts builtin,eaglet/data/corpus/other_prompts.jsonl ${LIMIT:+--limit $LIMIT} \
    --max-new-tokens 128 --methods spec --num-steps 6 --tree-topk 8 --num-draft-tokens 48 \
    --policy off --no-compile --no-compile-prefill $v --out /tmp/runs/vocab_$name 2>&1 | tail -3
  cp /tmp/runs/vocab_$name/report.json $S/vocab_$name.json
done
for v in "24576" "49152" "49152 --int8-draft-head"; do
  stamp "6,8,48 iteration, draft vocabulary $v"
  # shellcheck disable=SC2086
  timeout 150 python3 scripts/spec_step_costs.py --batch 1 --trees 6,8,48 --draft-vocab $v --out $S/steps_vocab.jsonl \
    2>&1 | tail -2
done
stamp end
