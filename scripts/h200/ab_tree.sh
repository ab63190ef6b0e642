#!/bin/bash
# Sourced by the A/B scripts (iteration_ab.sh, admission_ab.sh): /tmp/ab_old becomes a copy of this tree with the
# files that .dev/ab holds in place (at their paths in the repository); without any, no /tmp/ab_old.
rm -rf /tmp/ab_old
if [ -n "$(ls -A .dev/ab 2>/dev/null)" ]; then
  mkdir -p /tmp/ab_old && tar --exclude=./.git -cf - . | (cd /tmp/ab_old && tar xf -)
  cp -r .dev/ab/. /tmp/ab_old/
fi
