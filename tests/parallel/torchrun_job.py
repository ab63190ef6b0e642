"""A job test_tp.py starts under torchrun: run_tp and compare_tp join torchrun's ranks."""

from __future__ import annotations

import sys

from eaglet.doctor.tp import compare_tp
from eaglet.errors import EagletError
from eaglet.parallel.launch import is_main_process, run_tp
from eaglet.parallel.state import TPGroup


def _whoami(tp: TPGroup) -> tuple[int, int]:
    return tp.rank, tp.size


def main(path: str) -> None:
    rank, size = run_tp(2, _whoami)
    try:
        run_tp(4, _whoami)
    except EagletError as e:
        print(f"rank {rank}: {e}")
    report = compare_tp(path, 2, [[1, 2, 3, 4, 5], [9, 8, 7]], (0, 3))
    print(f"rank {rank} of {size}: {'ok' if report.ok else 'MISMATCH'}")
    if is_main_process():
        print(report.format())


if __name__ == "__main__":
    main(sys.argv[1])
