#!/bin/bash
# On the device: stop the plan start.sh began, if it still runs, and wait until every process of its session has
# exited. A trainer saves its checkpoint on SIGTERM and holds the GPU's memory until it exits: in session 51 a plan
# started beside a stopping one ran out of GPU memory, and the old one wrote its checkpoint into a folder just
# removed for the new one. start.sh calls this first. The signal reaches the plan's output filters too, so a
# trainer may die on its next print rather than save: what it saved last stays (checkpoints are renamed into place
# whole). By hand, not `pkill -f PATTERN` in a call: the call's own command line holds the pattern, so the call
# killed itself first (session 51 lost two calls so).
sid=$(cat /tmp/eg/pid 2>/dev/null) || exit 0
pgrep -s "$sid" > /dev/null || exit 0
echo "stopping the plan still running (session $sid)"
kill -TERM -- "-$sid"  # setsid made the plan's shell the leader of its session and of its process group
for _ in $(seq 90); do
  pgrep -s "$sid" > /dev/null || { echo "the plan has stopped"; exit 0; }
  sleep 1
done
pkill -KILL -s "$sid"
sleep 2
echo "the plan was killed after 90 s"
