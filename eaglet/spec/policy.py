"""Tree sizes per device and batch, and the rule that keeps speculation from being slower.

Defaults (a table, largest tree first). A verify of N nodes costs about as much as
one plain step while the target is launch- or bandwidth-bound (small N, small batch,
GPU) and about N times as much once it is compute-bound (CPU, large batches); big trees
pay off only in the first regime.

The rule. Speculation must never make a batch slower than plain decoding. Once per
batch size the engine times a plain step (a target forward at the scratch slot above
``lens``, which leaves the caches unchanged). Every speculative iteration then books
its wall time and the tokens it emitted; plain decoding would have needed
``tokens / active rows`` steps for them. After ``WINDOW`` iterations on a tree, if the
speculative time exceeds that plain time, the policy steps down to the next smaller
tree of the table and, below the smallest, to plain decoding for the rest of the
engine's life at that batch size. Each decision is printed. The first iteration on a
tree (graph capture, allocator warm-up) is not booked. With an explicit tree
(``--num-steps/--topk/--num-draft-tokens``) the only step down is to plain decoding.

Under tensor parallelism each rank times its own steps, so each would decide
differently; ``agree`` turns a rank's decision into rank 0's (a broadcast), and every
rank switches at the same iteration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from eaglet.spec.tree import TreeConfig

WINDOW = 8

# (largest batch size, tree); the first row whose batch bound holds is the default and
# the rows below it are the steps down.
TABLE = {
    "cuda": [
        (1, TreeConfig(6, 8, 48)),
        (2, TreeConfig(6, 6, 32)),
        (4, TreeConfig(5, 4, 24)),
        (8, TreeConfig(5, 4, 16)),
        (16, TreeConfig(4, 2, 10)),
        (32, TreeConfig(3, 2, 6)),
        (64, TreeConfig(3, 1, 4)),
        (None, TreeConfig(2, 1, 3)),
    ],
    "cpu": [
        (1, TreeConfig(5, 2, 8)),
        (4, TreeConfig(4, 1, 5)),
        (None, TreeConfig(3, 1, 4)),
    ],
}


def default_ladder(device_type: str, batch: int) -> list[TreeConfig]:
    rows = TABLE["cuda" if device_type == "cuda" else "cpu"]
    start = next(i for i, (bound, _) in enumerate(rows) if bound is None or batch <= bound)
    return [cfg for _, cfg in rows[start:]]


@dataclass
class _Rung:
    seconds: float = 0.0
    plain_steps: float = 0.0  # plain steps needed for the same tokens
    iters: int = 0
    tokens: int = 0
    row_iters: int = 0  # sum of active rows over booked iterations


class BatchPolicy:
    def __init__(self, device_type: str, fixed: TreeConfig | None, adaptive: bool,
                 log: Callable[[str], None], agree: Callable[[bool], bool] = bool):
        self.device_type, self.fixed, self.adaptive, self.log = device_type, fixed, adaptive, log
        self.agree = agree  # a per-rank decision -> the one all ranks take (identity at tp=1)
        self._ladders: dict[int, list[TreeConfig]] = {}
        self._rung: dict[int, int] = {}
        self._stats: dict[tuple[int, int], _Rung] = {}
        self.plain_step_s: dict[int, float] = {}

    def ladder(self, batch: int) -> list[TreeConfig]:
        if batch not in self._ladders:
            self._ladders[batch] = [self.fixed] if self.fixed else default_ladder(self.device_type, batch)
            how = "as given" if self.fixed else f"automatic for {self.device_type} batch {batch}"
            self.log(f"tree {self._ladders[batch][0].describe()} ({how})")
        return self._ladders[batch]

    def tree(self, batch: int) -> TreeConfig | None:
        """The tree to use now at this batch size, or None for plain decoding."""
        ladder = self.ladder(batch)
        i = self._rung.setdefault(batch, 0)
        return ladder[i] if i < len(ladder) else None

    @property
    def needs_plain_timing(self) -> bool:
        return self.adaptive

    def observe(self, batch: int, seconds: float, tokens: int, active: int) -> None:
        """Book one speculative iteration: wall time, tokens emitted by the ``active`` rows."""
        if not self.adaptive or active == 0:
            return
        i = self._rung[batch]
        st = self._stats.setdefault((batch, i), _Rung())
        st.iters += 1
        if st.iters == 1:
            return  # warm-up iteration
        st.seconds += seconds
        st.plain_steps += tokens / active
        st.tokens += tokens
        st.row_iters += active
        if st.iters - 1 < WINDOW:
            return
        plain_s = st.plain_steps * self.plain_step_s[batch]
        if not self.agree(st.seconds > plain_s):
            return
        ladder = self._ladders[batch]
        self._rung[batch] = i + 1
        nxt = ladder[i + 1].describe() if i + 1 < len(ladder) else "plain decoding"
        booked = st.iters - 1
        self.log(f"batch {batch}: tree {ladder[i].describe()} ran at {plain_s / st.seconds:.2f}x plain decoding "
                 f"(accept length {st.tokens / st.row_iters:.2f}, one iteration costs "
                 f"{st.seconds / booked / self.plain_step_s[batch]:.2f} plain steps); switching to {nxt}")
