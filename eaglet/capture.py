"""CaptureSpec: which residual-stream points of the target feed the draft.

The one convention (the README's "The capture contract"): an ``N``-layer target has points ``0..N``.
Point ``j`` is the full residual stream entering decoder layer ``j`` (after every
all-reduce); point 0 is the embedding output, point ``N`` the last layer's output
before the final norm. Hugging Face ``hidden_states[j]`` equals point ``j`` for j < N.

Other tools name "the output of layer i", which is our point ``i + 1``:
SGLang's ``eagle_aux_hidden_state_layer_ids`` and SpecForge's layer ids use that
form; vLLM's ids are already points. Conversions live here, are explicit, and are
tested both ways; nothing else in eaglet adds or subtracts one.
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglet.errors import EagletError

CONVENTIONS = ("eaglet", "vllm", "sglang", "specforge")


@dataclass(frozen=True)
class CaptureSpec:
    points: tuple[int, ...]  # residual-stream points, in the order the draft's fc reads them
    num_layers: int  # N of the target the points refer to

    def __post_init__(self) -> None:
        if not self.points:
            raise EagletError("a capture spec needs at least one point")
        bad = [p for p in self.points if not 0 <= p <= self.num_layers]
        if bad:
            raise EagletError(
                f"capture points {bad} are outside 0..{self.num_layers} for a {self.num_layers}-layer target"
            )
        if len(set(self.points)) != len(self.points):
            raise EagletError(f"capture points {list(self.points)} repeat a point")

    @classmethod
    def eagle3_default(cls, num_layers: int) -> CaptureSpec:
        """EAGLE-3's low/middle/high choice: points [2, N//2, N-3]."""
        return cls((2, num_layers // 2, num_layers - 3), num_layers)

    @property
    def k(self) -> int:
        return len(self.points)

    def to_ids(self, convention: str) -> list[int]:
        """Layer ids as the named tool writes them."""
        _check(convention)
        if convention in ("eaglet", "vllm"):
            return list(self.points)
        if 0 in self.points:
            raise EagletError(
                f"point 0 (the embedding output) has no layer id in the {convention} convention"
            )
        return [p - 1 for p in self.points]

    @classmethod
    def from_ids(cls, ids: list[int], convention: str, num_layers: int) -> CaptureSpec:
        """Read layer ids written in the named tool's convention."""
        _check(convention)
        ids = [int(i) for i in ids]
        points = convention in ("eaglet", "vllm")
        top = num_layers if points else num_layers - 1
        bad = [i for i in ids if not 0 <= i <= top]
        if bad:
            # Judged as typed: after conversion the error would name ids the user never wrote, and
            # -1 would silently become point 0 (the embedding output), not "the last layer".
            raise EagletError(f"layer ids {bad} are outside 0..{top}, the {convention} ids of a "
                              f"{num_layers}-layer target")
        return cls(tuple(ids if points else (i + 1 for i in ids)), num_layers)

    def to_json(self) -> dict:
        return {"points": list(self.points), "num_layers": self.num_layers, "convention": "eaglet"}

    @classmethod
    def from_json(cls, d: dict) -> CaptureSpec:
        try:
            return cls.from_ids(d["points"], d.get("convention", "eaglet"), int(d["num_layers"]))
        except KeyError as e:
            raise EagletError(f"capture spec lacks the key {e.args[0]!r}") from None


def _check(convention: str) -> None:
    if convention not in CONVENTIONS:
        raise EagletError(f"unknown layer-id convention '{convention}': use one of {', '.join(CONVENTIONS)}")
