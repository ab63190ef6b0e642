#!/bin/bash
# An H200 plan (start.sh 300 plan_ablate.sh, after the staging calls): issue 12's recipe options compared at equal
# minutes on one regeneration (scripts/ablate.py --recipe chat): the recipe as shipped and one change each, every
# variant scored on the same validation sources and in serving (eager, 6,8,48 and 5,2,8, the policy off, 20 x 128
# a set). VARIANTS, REGEN_MIN, TRAIN_MIN override the defaults (~20 minutes in all on an H200: the regeneration,
# then ~5 a variant with tokenizing, scoring and serving). Each variant's result.json goes to res as it finishes, so
# a plan cut short by the session's minutes still returns the variants done. ABLATE_ARGS: more flags for ablate.py
# (a dry run on the CPU: S=DIR R=DIR ABLATE_ARGS="--target TINY --device cpu --max-samples 24 ...").
S=${S:-/tmp/eg/res}; R=${R:-/tmp/runs/ablate}
t0=$SECONDS
stamp() { echo "### $(date +%T) +$((SECONDS - t0))s $*"; }
nvidia-smi --query-gpu=name,memory.used --format=csv 2>/dev/null
: "${VARIANTS:=chat,chat-reach2,chat-reach8}" "${REGEN_MIN:=3.5}" "${TRAIN_MIN:=3}"
warm="--warm-up-steps 3"  # the first variant's command compiles the training step before its minutes start
for v in ${VARIANTS//,/ }; do
  # One variant a command: the same regeneration (resumed from its files) and the variants finished before.
  stamp "variant $v: $TRAIN_MIN minutes"
  # shellcheck disable=SC2086
  python3 scripts/ablate.py --target /tmp/smol.gguf --out $R --recipe chat --regen-min "$REGEN_MIN" \
    --train-min "$TRAIN_MIN" --variants "$v" --serve 20 $warm $ABLATE_ARGS 2>&1 | grep -v '^\s*$'
  warm=""
  [ -f $R/$v/result.json ] && cp $R/$v/result.json "$S/ablate_$v.json"
  [ -f $R/ablation.md ] && cp $R/ablation.md $S/
done
stamp end
