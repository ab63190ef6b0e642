#!/bin/bash
# An H200 plan (start.sh 400 plan_train.sh): issue 12's one-command draft, then the new draft beside the shipped
# one on both prompt sets (eager 6,8,48, the policy off, 20 x 128 a set), then pick.py's verdict.
# TRAIN_FLAGS overrides the flags after --recipe chat; BUDGET the minutes (the whole command's). SHIPPED_REPORT: the
# shipped draft's bench report of an earlier H200 session (the same command) instead of benching it again, when its
# directory holds another draft for this run (a draft carried on with --init-draft) or to save the minute.
R=/tmp/runs; S=/tmp/eg/res; E="python3 -m eaglet.cli"
t0=$SECONDS
stamp() { echo "### $(date +%T) +$((SECONDS - t0))s $*"; }
nvidia-smi --query-gpu=name,memory.used --format=csv
stamp "train: --recipe chat ${TRAIN_FLAGS:=--max-samples 48000 --epochs 5}, ${BUDGET:=18.5} minutes"
# shellcheck disable=SC2086
$E train --target /tmp/smol.gguf --device cuda --data builtin --regenerate --recipe chat $TRAIN_FLAGS \
  --time-budget-min "$BUDGET" --out $R/A
echo "train rc=$?"
# The run's small files only: its regenerated answers (hundreds of MB) would push res.tgz past what $OUT returns.
find $R/A -maxdepth 1 -type f -size -4M \( -name '*.json' -o -name '*.jsonl' \) -exec cp {} $S/ \;
stamp "side by side: eager 6,8,48, the policy off, 20 x 128 a set"
for d in A shipped; do
  if [ $d = shipped ] && [ -n "$SHIPPED_REPORT" ]; then cp "$SHIPPED_REPORT" $S/accept_shipped.json; continue; fi
  dir=$R/A/draft; [ $d = shipped ] && dir=eaglet/drafts/smollm2-135m
  $E bench --target /tmp/smol.gguf --draft $dir --prompts builtin,eaglet/data/corpus/other_prompts.jsonl \
    --limit 20 --max-new-tokens 128 --methods spec --num-steps 6 --tree-topk 8 --num-draft-tokens 48 \
    --policy off --no-compile --no-compile-prefill --out $R/accept_$d
  cp $R/accept_$d/report.json $S/accept_$d.json
done
python3 scripts/h200/pick.py $S/accept_A.json $S/accept_shipped.json
# A draft of another MLP width than the shipped one (--draft-intermediate-size) costs another iteration: SmolLM2's
# 6,8,48 at batch 1 with each width (random weights, one process each, ~1 minute apiece), last, so that losing it
# loses nothing else.
mlp() { python3 -c "import json; print(json.load(open('$1/config.json'))['intermediate_size'])" 2>/dev/null; }
width=$(mlp $R/A/draft); shipped=$(mlp eaglet/drafts/smollm2-135m)
if [ -n "$width" ] && [ "$width" != "$shipped" ]; then
  for w in "$shipped" "$width"; do
    stamp "6,8,48 iteration, draft MLP $w wide"
    timeout 150 python3 scripts/spec_step_costs.py --batch 1 --trees 6,8,48 --draft-vocab 24576 \
      --draft-intermediate-size "$w" --out $S/steps_width.jsonl 2>&1 | tail -2
  done
fi
stamp end
