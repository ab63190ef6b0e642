#!/bin/bash
# On the device, as a plan (`bash scripts/h200/start.sh 300 admission_ab.sh`) or alone in a call (carry [".dev/ab"];
# ~3 minutes, no GGUF): where a prompt's admission goes at batch 1, plain and speculative, random weights of SmolLM2's
# shape, prompts of 160 tokens, the prefill fused and captured as bench and serve run it (scripts/prompt_timeline.py
# --random smollm2-135m --compile-prefill --profile 8): this tree, and a copy of it with the files that .dev/ab holds
# in place (at their paths in the repository, as iteration_ab.sh takes them). The tables and each compile's time
# in admission_ab.txt (the steps' columns too: from 7e9db65 to session 46 every layer's K was a view of one tensor,
# and torch.compile saw the compiled steps' cache inputs share a storage; since, a tensor a layer and land_rows).
export PYTHONPATH=$PWD:/tmp/site
[ "$PWD" = /tmp/eg/repo ] && OUT=/tmp/eg/res
run() {  # $1: what; $2: the tree's directory
  echo "### $1 $(date +%T)" | tee -a "$OUT/admission_ab.txt"
  (cd "$2" && PYTHONPATH=$PWD:/tmp/site timeout 240 python3 scripts/prompt_timeline.py --random smollm2-135m \
    --limit 16 --max-new-tokens 16 --compile-prefill --profile 8 2>&1 | grep -v "^eaglet: compiling \|[Ww]arn" \
    | tee -a "$OUT/admission_ab.txt")
}
source scripts/h200/ab_tree.sh
[ -d /tmp/ab_old ] && run "earlier files" /tmp/ab_old
run "this tree" .
