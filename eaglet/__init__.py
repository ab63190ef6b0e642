"""eaglet: train EAGLE-3 drafts and serve their target with tree speculative decoding."""

import os

__version__ = "0.1.0"

# OpenMP threads sleep rather than spin while they wait (set before torch loads its OpenMP runtime;
# a value the user set wins). On the shared 2-core CPU, with another job on one core, spinning
# threads ran a speculative `eaglet bench` at 1.3 tok/s and sleeping ones at 33 (docs/performance.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
