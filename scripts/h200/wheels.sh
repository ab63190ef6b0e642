#!/bin/bash
# Here (no argument): download the wheels `eaglet serve` needs that the H200's image lacks into the ignored
# .dev/p8 (~4.5 MiB; its own call: the start call is full with part 10).
# On the H200 (`bash scripts/h200/wheels.sh install`, carry [".dev/p8"], a call between the last stage.sh and
# start.sh): install them into /tmp/site, which the plans put on PYTHONPATH.
set -e
if [ "$1" = install ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .dev/p8/*.whl
  ls /tmp/site
  exit
fi
cd "$(git rev-parse --show-toplevel)"
mkdir -p .dev/p8
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .dev/p8 \
  fastapi starlette uvicorn httptools pydantic pydantic-core annotated-types typing-inspection opentelemetry-api
du -sh .dev/p8
