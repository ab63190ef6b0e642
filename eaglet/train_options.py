"""What the commands that make a draft were asked to do (data regenerate, data capture, train, draft import),
as typed frozen objects beside ``options``'s (the same rules: each default written once, checked at construction
in the CLI's words, no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from eaglet.capture import CaptureSpec
from eaglet.errors import EagletError
from eaglet.options import SamplingParams, TargetOptions, on_cuda_unless_given

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TrainConfig:
    ttt_steps: int = 7  # draft steps unrolled in training-time test
    decay: float = 0.8  # loss weight of step j is decay**j
    lr: float = 5e-4
    min_lr_ratio: float = 0.05
    warmup_steps: int = 50
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    epochs: int = 1
    max_steps: int | None = None
    batch_tokens: int = 16384  # padded tokens per batch and rank (rows x longest row)
    max_len: int | None = None  # conversations are cut to this; None: 2048 or the target's window
    draft_vocab_size: int | None = None  # None: half the target's, at most 32768 (draft.vocab)
    draft_intermediate_size: int | None = None  # the draft layer's MLP width; None: the target layer's
    capture_points: tuple[int, ...] | None = None  # None: EAGLE-3's [2, N//2, N-3]
    save_every: int = 250
    val_every: int = 250
    seed: int = 0
    autocast: bool | None = None  # bf16 autocast; None: on CUDA only
    tensorboard: bool = False
    init_from_target: bool = True  # start the LM head from the target's rows for the draft vocabulary
    init_draft: str | None = None  # start from this draft's weights and vocabulary ('default': the shipped one)
    # RMS-normalise each captured point before fc (stored in the draft; eaglet-only, other engines lack it).
    # On by default: +0.23 predicted accept length at equal training time (docs/training.md, ablation).
    aux_norm: bool = True
    aux_noise: float = 0.0  # uniform noise in [-aux_noise, aux_noise] on the captured points, training only
    # Training only: the labels are the target's distribution at this temperature (ttt.sharpen); below 1 the loss
    # weighs the target's argmax, what greedy verification accepts, more than its tail. 1: the distribution as is.
    label_temperature: float = 1.0
    # Training only: TTT step j counts an anchor while each earlier step had the answer's next token (the next step's
    # input) in the draft's top K (ttt.py): the chains a K-way tree holds. 0: every anchor, as EAGLE-3 trains.
    ttt_reach: int = 0
    earlier_turns: bool = True  # loss on every assistant turn; False: only on those the target wrote
    # The TTT loss's soft cross-entropy through torch.compile (ttt.fused_soft_ce), and the TTT attention without
    # its dense mask (draft/ttt_attention.py); None: on CUDA, where together they took the H200's step of
    # 16k tokens from 134 to 111 ms (docs/training.md, session 18), off on the CPU (a compile outweighs it).
    compile_loss: bool | None = None
    fused_ttt_attention: bool | None = None
    feature_cache: bool | None = None  # target features kept after their first pass (train/feature_cache.py)
    progress: bool = True

    def fast_ttt(self, device: torch.device) -> tuple[bool, bool]:
        """(compile_loss, fused_ttt_attention) for a run on ``device``: as given, else on CUDA."""
        return on_cuda_unless_given(self.compile_loss, device), on_cuda_unless_given(self.fused_ttt_attention, device)

    def __post_init__(self) -> None:
        checks = [(self.ttt_steps >= 1, "--ttt-steps must be >= 1"),
                  (0 < self.decay <= 1, "--decay must be in (0, 1]"),
                  (self.lr > 0, "--lr must be > 0"),
                  (self.grad_clip > 0, "--grad-clip must be > 0"),
                  (self.epochs >= 1, "--epochs must be >= 1"),
                  (self.batch_tokens >= 16, "--batch-tokens must be >= 16"),
                  (self.max_len is None or self.max_len >= 8, "--max-len must be >= 8"),
                  (self.warmup_steps >= 0, "--warmup-steps must be >= 0"),
                  (self.aux_noise >= 0, "--aux-noise must be >= 0"),
                  (self.label_temperature > 0, "--label-temperature must be > 0"),
                  (self.ttt_reach >= 0, "--ttt-reach must be >= 0"),
                  ((self.draft_intermediate_size or 1) >= 1, "--draft-intermediate-size must be >= 1"),
                  (self.max_steps is None or self.max_steps >= 1, "--max-steps must be >= 1"),
                  (self.save_every >= 1 and self.val_every >= 1, "--save-every and --val-every must be >= 1")]
        for ok, msg in checks:
            if not ok:
                raise EagletError(msg)

    def seq_len(self, window: int) -> int:
        """The token cap per conversation; the draft's last step reaches position max_len + ttt_steps."""
        if self.max_len is None:
            return min(2048, window - self.ttt_steps)
        if self.max_len + self.ttt_steps > window:
            raise EagletError(f"--max-len {self.max_len} plus {self.ttt_steps} draft steps exceeds the target's "
                              f"{window}-position window")
        return self.max_len

    def capture(self, num_layers: int) -> CaptureSpec:
        if self.capture_points is None:
            return CaptureSpec.eagle3_default(num_layers)
        return CaptureSpec(tuple(self.capture_points), num_layers)


@dataclass(frozen=True)
class RegenConfig:
    """How the target answers prompts for training (``data regenerate``, ``train --regenerate``)."""

    batch_size: int | None = None  # rows; None: ``refill.auto_rows`` (from free GPU memory), 256 for an endpoint
    max_new_tokens: int = 384
    answers: tuple[float, ...] = (0.0,)  # one answer per prompt at each temperature; 0 = greedy
    top_p: float = 1.0
    max_prompt_tokens: int = 1024
    max_samples: int | None = None  # cap on training prompts
    max_val_samples: int | None = None
    self_prompts: int = 0  # Magpie attempts: user prompts the target writes itself
    follow_ups: float = 0.0  # fraction of greedily answered conversations given a second turn
    seed: int = 0
    self_prompt_openers: float = 0.0  # share of the Magpie prompts started with an opener (self_prompts.OPENERS)

    def __post_init__(self) -> None:
        if not self.answers or len(set(self.answers)) != len(self.answers) or min(self.answers) < 0:
            raise EagletError(f"--answers must name distinct settings (greedy or temperatures > 0), "
                              f"got {list(self.answers)}")
        if not 0 <= self.follow_ups <= 1:
            raise EagletError(f"--follow-ups must be a fraction in [0, 1], got {self.follow_ups}")
        if not 0 <= self.self_prompt_openers <= 1:
            raise EagletError(f"--self-prompt-openers must be a fraction in [0, 1], got {self.self_prompt_openers}")

    def params(self) -> SamplingParams:
        return SamplingParams(self.answers[0], self.top_p, 0, self.max_new_tokens, self.seed)


# `train --recipe NAME`: the flags a recipe sets where the command line does not. "chat": the command that made
# the shipped SmolLM2 draft (docs/training.md, session 27, --time-budget-min 17), for chat targets (the Magpie
# prompts need a chat template); the budget and batch sizes stay the user's; a budget cuts the sampled answers.
RECIPES: dict[str, dict[str, object]] = {
    "chat": {"answers": (0.0, 0.7, 1.0), "max_samples": 16000, "self_prompts": 20000, "self_prompt_openers": 0.5,
             "follow_ups": 0.0, "max_new_tokens": 256, "epochs": 6},
}


REGEN_CONCURRENCY = 32  # data regenerate --endpoint: requests in flight unless --concurrency says


@dataclass(frozen=True)
class RegenerateOptions:
    data: str  # 'builtin' or JSONL files, comma-separated
    out: str
    target: TargetOptions = TargetOptions()
    regen: RegenConfig = RegenConfig()
    split: str | None = None  # 'train', 'val' or None: every record
    restart: bool = False
    time_budget_min: float | None = None
    endpoint: str | None = None  # a running OpenAI-compatible server answers instead of the local target
    model: str | None = None  # with endpoint: the served model; None: the first listed
    concurrency: int | None = None  # with endpoint: requests in flight at most; None: data.remote's default


@dataclass(frozen=True)
class CaptureOptions:
    data: str
    out: str
    target: TargetOptions = TargetOptions()
    split: str | None = None
    capture: tuple[int, ...] | None = None  # None: EAGLE-3's [2, N//2, N-3]
    shard_samples: int = 512
    batch_tokens: int = 16384
    max_len: int | None = None
    feature_dtype: str = "bfloat16"
    tp: int = 1


@dataclass(frozen=True)
class TrainOptions:
    out: str
    data: str = "builtin"
    target: TargetOptions = TargetOptions()
    train: TrainConfig = TrainConfig()
    regen: RegenConfig | None = None  # --regenerate: answer --data's prompts first
    features: str | None = None  # offline features; None: online
    val_features: str | None = None
    val_fraction: float = 0.02
    time_budget_min: float | None = None
    regen_budget_min: float | None = None
    train_tokens_per_s: float | None = None
    tp: int = 1


@dataclass(frozen=True)
class DraftImportOptions:
    src: str
    out: str
    target: TargetOptions = TargetOptions()
    capture_ids: tuple[int, ...] | None = None
    convention: str | None = None  # how capture_ids count: eaglet, vllm, sglang or specforge
    overwrite: bool = False
