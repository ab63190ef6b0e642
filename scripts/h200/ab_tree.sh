#!/bin/bash
# Sourced by the A/B scripts (iteration_ab.sh, admission_ab.sh): /tmp/ab_old becomes a copy of this tree with the
# files that .dev/ab (or AB_DIR) holds in place (at their paths in the repository); without any, no /tmp/ab_old.
rm -rf /tmp/ab_old
src=${AB_DIR:-.dev/ab}
if [ -n "$(ls -A "$src" 2>/dev/null)" ]; then
  mkdir -p /tmp/ab_old && tar --exclude=./.git -cf - . | (cd /tmp/ab_old && tar xf -)
  cp -r "$src/." /tmp/ab_old/
fi
