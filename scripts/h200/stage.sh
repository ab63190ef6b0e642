#!/bin/bash
# On the H200, staging call N of 1..16 (carry [".dev/qN"]; split_gguf.sh cuts 17 parts, start.sh appends the
# last): append part N to /tmp/smol.gguf.part; part 1 starts it afresh. The calls must follow one another while
# the machine stays warm (it keeps /tmp 30 s after a call): send them, start.sh and every watch.sh in one message.
set -e
mkdir -p /tmp/eg
[ "$1" = 1 ] && rm -f /tmp/smol.gguf.part
cat .dev/q$1/part >> /tmp/smol.gguf.part
ls -l /tmp/smol.gguf.part
