#!/bin/bash
# On the H200: follow the plan for $1 seconds or until it has ended (/tmp/eg/DONE; a later call then returns at once),
# then send back through $OUT its log, /tmp/eg/res as res.tgz and the draft /tmp/runs/A/draft once written (the
# latest checkpoint's while training runs)
# (ALL=1: also the small files of /tmp/runs/A). At most 8 files come back: draft (5) + log + res + runA.
end=$((SECONDS + $1))
last=0
copied=""
while [ $SECONDS -lt $end ] && [ ! -f /tmp/eg/DONE ]; do
  sleep 5
  if [ $((SECONDS - last)) -ge 60 ]; then
    last=$SECONDS
    echo "--- $(date +%T)"; tail -c 3000 /tmp/eg/log | tr '\r' '\n' | grep -v '^\s*$' | tail -n 3 | cut -c1-250
    # What a call cut by the session's budget still returns ($OUT comes back from a timed-out call; session 41 lost
    # a finished server's c16 / c64 when the budget ended the last watch before its copy below).
    cp /tmp/eg/log "$OUT/log.txt" 2>/dev/null; tar -czf "$OUT/res.tgz" -C /tmp/eg res 2>/dev/null
    # The draft too, each time a checkpoint has replaced it: a call the budget cuts still returns the latest one.
    if [ -f /tmp/runs/A/draft/config.json ] && [ "$(stat -c %i /tmp/runs/A/draft)" != "$copied" ]; then
      copied=$(stat -c %i /tmp/runs/A/draft)
      rm -rf "$OUT/draft" && mkdir -p "$OUT/draft" && cp /tmp/runs/A/draft/* "$OUT/draft/" 2>/dev/null
    fi
  fi
done
echo "=== $(date +%T) done=$([ -f /tmp/eg/DONE ] && echo yes || echo no)"
tail -c 5000 /tmp/eg/log
cp /tmp/eg/log "$OUT/log.txt" 2>/dev/null
tar -czf "$OUT/res.tgz" -C /tmp/eg res 2>/dev/null
# A checkpoint replaces the draft directory whole (a new inode): copy again if that happened during the copy.
for _ in 1 2 3; do
  [ -f /tmp/runs/A/draft/config.json ] || break
  ino=$(stat -c %i /tmp/runs/A/draft)
  rm -rf "$OUT/draft" && mkdir -p "$OUT/draft" && cp /tmp/runs/A/draft/* "$OUT/draft/"
  [ "$(stat -c %i /tmp/runs/A/draft)" = "$ino" ] && break
done
if [ "$ALL" = 1 ] && [ -d /tmp/runs/A ]; then
  (cd /tmp/runs/A && find . -maxdepth 1 -type f -size -4M | tar -czf "$OUT/runA.tgz" -T -)
fi
ls -la "$OUT" "$OUT/draft" 2>/dev/null
