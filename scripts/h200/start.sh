#!/bin/bash
# On the H200, the last staging call (carry the last part's folder, [".dev/q17"]): that part and the gguf wheel, the
# GGUF's checksum (or, on a machine that has run a plan already, the GGUF left in place), this tree copied to
# /tmp/eg/repo, then the plan scripts/h200/$2 started in a session of its own (it outlives this call; its log is
# /tmp/eg/log, what it keeps goes to /tmp/eg/res, emptied first; /tmp/eg/DONE once it exits) and watched for $1
# seconds. Further names after $2 run after it in the same background session (`start.sh 400 int8_head.sh
# plan_serve.sh`): nothing waits on a reply between them, so the machine cannot go back in the gap.
# NO_GGUF=1: a plan that needs no GGUF (plan_warmup.sh, random weights) starts without any staging call.
set -e
if [ "$NO_GGUF" = 1 ]; then
  echo "no GGUF staged (NO_GGUF=1)"
elif [ -f /tmp/smol.gguf ] && [ ! -f /tmp/smol.gguf.part ]; then
  # A second plan on a machine still warm from the first (as in session 36): the GGUF is in place already.
  echo "/tmp/smol.gguf staged by an earlier call: the last part not appended"
else
  # The one part folder this call carries (the others are not on the device).
  cat .dev/q*/part >> /tmp/smol.gguf.part
  sum=$(md5sum /tmp/smol.gguf.part | cut -d' ' -f1)
  [ "$sum" = a1231443440b107ff29f02bdb38c9d0a ] || { echo "the staged GGUF's md5 is $sum: a part is missing"; exit 1; }
  mv /tmp/smol.gguf.part /tmp/smol.gguf
fi
if ls .dev/q*/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .dev/q*/*.whl
fi
bash scripts/h200/stop.sh  # a plan still running from an earlier call: never two beside each other
rm -rf /tmp/eg/repo /tmp/eg/DONE /tmp/eg/res && mkdir -p /tmp/eg/repo /tmp/eg/res
# The tree and what else this call carries in .dev (an earlier kernel for iteration_ab.sh), not the GGUF's parts.
tar --exclude='./.dev/q*' --exclude='./.dev/p*' --exclude=./.git -cf - . | (cd /tmp/eg/repo && tar xf -)
cd /tmp/eg/repo
# The plan's environment, and its end marked here whatever the plan does (a plan that fails ends the watching too).
export PYTHONPATH=/tmp/eg/repo:/tmp/site PYTHONUNBUFFERED=1 TQDM_MININTERVAL=15
plans=""; for p in "${@:2}"; do plans+="bash scripts/h200/$p; "; done
setsid nohup bash -c "$plans touch /tmp/eg/DONE" > /tmp/eg/log 2>&1 < /dev/null &
echo $! > /tmp/eg/pid  # the leader of the plan's session, for stop.sh
sleep 2
bash scripts/h200/watch.sh "$1"
