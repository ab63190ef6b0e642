"""A job test_tp.py starts under torchrun: each rank writes a line, then ends through
end_torchrun_rank, which must exit with the rank's code and not return."""

from __future__ import annotations

import sys

from eaglet.parallel.launch import end_torchrun_rank, init_tp


def main(failing_rank: int) -> int:
    tp = init_tp(2)
    print(f"rank {tp.rank} done")
    return end_torchrun_rank(3 if tp.rank == failing_rank else 0)


if __name__ == "__main__":
    main(int(sys.argv[1]))
    raise AssertionError("end_torchrun_rank returned under torchrun")
