"""What ``eaglet doctor`` checks, and with how much material (the CLI's flags, validated)."""

from __future__ import annotations

from dataclasses import dataclass

from eaglet.errors import EagletError
from eaglet.options import DEFAULT_TARGET, SamplingParams, torch_dtype


@dataclass(frozen=True)
class DoctorConfig:
    """What ``eaglet doctor`` checks, and with how much material.

    The serving settings stay loose fields, not a TreeConfig: judging them, an inconsistent
    tree included, is check 5's job.
    """

    target: str = DEFAULT_TARGET
    draft: str = "default"  # a draft directory, or 'default' (the target's shipped draft)
    prompts: str = "builtin"  # JSONL of chat prompts, or the built-in bench set
    num_prompts: int = 8
    max_new_tokens: int = 128  # per answer; the answers are what the draft is scored on
    serve_tokens: int = 48  # of each answer, decoded again by the speculative run (checks 2 and 4)
    features: str | None = None  # offline feature directory to compare as well
    tp: int | None = None  # run the tensor-parallel checks at this degree
    tp_timeout_s: float = 300.0
    # The serving settings to check (check 5); num_steps also sets the chain of checks 2 and 4.
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    # The draft as served (check 5): load_engine_draft's vocab, int8_head, extend and int8_layer.
    draft_vocab: int | None = None
    int8_head: bool | None = None
    extend_vocab: bool | None = None
    int8_layer: bool | None = None
    max_context: int | None = None
    device: str = "cpu"
    dtype: str = "float32"
    json: str | None = None  # also write the report here, as JSON

    def __post_init__(self) -> None:
        if self.num_prompts < 1:
            raise EagletError(f"--num-prompts must be >= 1, got {self.num_prompts}")
        if self.max_new_tokens < 4:
            raise EagletError(f"--max-new-tokens must be >= 4 (a chain needs answer tokens), got {self.max_new_tokens}")
        if self.serve_tokens < 4:
            raise EagletError(f"serve_tokens must be >= 4, got {self.serve_tokens}")
        if self.tp is not None and self.tp < 1:
            raise EagletError(f"--tp must be >= 1, got {self.tp}")
        _ = self.sampling  # SamplingParams checks each value

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.top_k, self.max_new_tokens)

    @property
    def torch_dtype(self):
        return torch_dtype(self.dtype)

    @property
    def tree_flags(self) -> dict[str, int | None]:
        return {"--num-steps": self.num_steps, "--tree-topk": self.topk, "--num-draft-tokens": self.num_draft_tokens}
