#!/bin/bash
# The shipped SmolLM2 draft's accept length served two ways (eager 6,8,48, the policy off, 20 x 128 a set, the GGUF
# staged at /tmp/smol.gguf), then pick.py's verdict on the first against the second. Reports: $1/accept_<name>.json.
#   bash scripts/h200/accept_ab.sh OUT NEW "NEW'S FLAGS" OLD "OLD'S FLAGS"   (int8_head.sh, int8_layer.sh)
out=$1
for pair in "$2|$3" "$4|$5"; do
  name=${pair%%|*} flags=${pair#*|}
  echo "### accept $name ($flags) $(date +%T)"
  # shellcheck disable=SC2086
  python3 -m eaglet.cli bench --target /tmp/smol.gguf --prompts builtin,eaglet/data/corpus/other_prompts.jsonl \
    --limit 20 --max-new-tokens 128 --methods spec --num-steps 6 --tree-topk 8 --num-draft-tokens 48 --policy off \
    --no-compile --no-compile-prefill $flags --out "/tmp/runs/accept_$name" 2>&1 | tail -4
  cp "/tmp/runs/accept_$name/report.json" "$out/accept_$name.json"
done
python3 scripts/h200/pick.py "$out/accept_$2.json" "$out/accept_$4.json"
