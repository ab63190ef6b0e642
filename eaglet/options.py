"""What a command was asked to do, as typed frozen objects, each default written once.

cli_options.py turns the parsed arguments into these (cli.py's argparse defaults are read from them,
so the manual and the library agree) and ``eaglet/commands/`` runs them; the library modules take the
pieces they need (``SamplingParams``, ``TreeConfig``, ``TrainConfig``...). Values are checked at
construction, in the CLI's words. Nothing here imports torch, so parsing the command line and
printing --help stay quick: a dtype is a name until a model loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from eaglet.capture import CaptureSpec
from eaglet.errors import EagletError

if TYPE_CHECKING:
    import torch

DEFAULT_TARGET = "smollm2-135m"


def on_cuda_unless_given(flag: bool | None, device: torch.device) -> bool:
    """A tri-state option's value on ``device``: as given, else on where ``device`` is CUDA."""
    return device.type == "cuda" if flag is None else flag
BENCH_METHODS = ("plain", "spec", "hf", "hf-lookup")


def torch_dtype(name: str):
    """``torch.<name>``, imported when a model is about to load."""
    import torch

    return getattr(torch, name)


@dataclass(frozen=True)
class SamplingParams:
    """What to sample; ``sampling.probs`` defines the distribution these settings ask for."""

    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k cut
    max_new_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise EagletError(f"--temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise EagletError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise EagletError(f"--top-k must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise EagletError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0



@dataclass(frozen=True)
class TreeConfig:
    num_steps: int  # draft steps = tree depth
    topk: int  # children proposed per expanded node, and nodes expanded per step
    num_draft_tokens: int  # nodes verified, root included

    def __post_init__(self) -> None:
        s, k, n = self.num_steps, self.topk, self.num_draft_tokens
        for flag, v in (("--num-steps", s), ("--tree-topk", k), ("--num-draft-tokens", n)):
            if not isinstance(v, int) or v < 1:
                raise EagletError(f"{flag} must be a positive integer, got {v}")
        if k == 1 and n != s + 1:
            raise EagletError(f"topk=1 drafts a chain of num_steps={s} tokens, so num_draft_tokens must be "
                              f"{s + 1} (root included), got num_draft_tokens={n}")
        if n < 2:
            raise EagletError(f"num_draft_tokens={n} verifies no draft token; it must be at least 2")
        if n > self.reachable:
            raise EagletError(f"num_draft_tokens={n} exceeds the {self.reachable} nodes that num_steps={s} and "
                              f"topk={k} can reach (1 + topk + (num_steps-1)*topk^2)")
        if n - 1 < s:
            raise EagletError(f"num_draft_tokens={n} reaches depth {n - 1} at most, below num_steps={s}; "
                              f"lower num_steps or raise num_draft_tokens")

    @property
    def reachable(self) -> int:
        """Root plus every candidate the growth can propose."""
        return 1 + self.topk + (self.num_steps - 1) * self.topk ** 2

    @property
    def region(self) -> int:
        """Draft-cache scratch slots the frontier steps write above the committed slots."""
        return (self.num_steps - 1) * self.topk

    @property
    def noise_rows(self) -> int:
        """Distributions sampled per tree: the root's, then one per frontier node."""
        return 1 + (self.num_steps - 1) * self.topk

    def describe(self) -> str:
        return f"num_steps={self.num_steps} topk={self.topk} num_draft_tokens={self.num_draft_tokens}"


@dataclass(frozen=True)
class TargetOptions:
    """Which target, where: ``auto`` fills the device (CUDA when available) and the dtype (bfloat16 on CUDA)."""

    target: str = DEFAULT_TARGET  # an embedded name, an HF model directory or a .gguf file
    device: str = "cpu"
    dtype: str = "float32"  # a torch dtype's name
    max_context: int | None = None  # KV-cache tokens; None: the model's window, capped

    @classmethod
    def auto(cls, target: str = DEFAULT_TARGET, device: str | None = None, dtype: str | None = None,
             max_context: int | None = None) -> TargetOptions:
        import torch  # here, not at the top: the CLI reads this module before it knows a model will load

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        return cls(target, device, dtype or ("bfloat16" if device.startswith("cuda") else "float32"), max_context)

    @property
    def torch_dtype(self):
        return torch_dtype(self.dtype)


@dataclass(frozen=True)
class EngineOptions:
    """How the speculative engine runs (generate, bench, serve)."""

    tree: TreeConfig | None = None  # None: automatic, per batch size
    compile: bool | None = None  # torch.compile the iteration; None: with CUDA graphs
    policy: bool = True  # may step down to smaller trees or plain decoding when speculation is slower
    # Fuse the prefill buckets with torch.compile before capture; None: where captured (CUDA), except in `generate`
    compile_prefill: bool | None = None  # (one prompt: ~3 ms saved for a compile of ~20-40 s; docs/performance.md)
    draft_vocab: int | None = None  # a frequency-ordered draft's N most frequent tokens; None: load_engine_draft's
    int8_head: bool | None = None  # the draft's LM head in int8 (x86 CPU: float32, eager; CUDA); None: the device's
    extend_vocab: bool | None = None  # the draft's head over the target's whole vocabulary; None: load's EXTEND_ON

    def fused_prefill(self, device: torch.device) -> bool:
        """Whether the engines on ``device`` fuse their prefill buckets: --compile-prefill as given, else on CUDA."""
        return on_cuda_unless_given(self.compile_prefill, device)

    @property
    def tree_flags(self) -> tuple[int | None, int | None, int | None]:
        """(num_steps, topk, num_draft_tokens), all None when automatic: the engine's and the report's form."""
        t = self.tree
        return (t.num_steps, t.topk, t.num_draft_tokens) if t else (None, None, None)


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


@dataclass(frozen=True)
class GenerateOptions:
    prompt: str
    target: TargetOptions = TargetOptions()
    sampling: SamplingParams = SamplingParams()
    engine: EngineOptions = EngineOptions()
    draft: str = "default"  # 'default' (the target's shipped draft, if any), 'none' or a draft directory
    json: bool = False  # end with one JSON line
    tp: int = 1


@dataclass(frozen=True)
class BenchConfig:
    out: str
    target: TargetOptions = TargetOptions()
    draft: str = "default"
    prompts: str = "builtin"  # a JSONL file, the built-in bench prompts, or several sets comma-separated
    methods: tuple[str, ...] = BENCH_METHODS
    sampling: SamplingParams = SamplingParams(seed=0)
    batch_size: int = 1
    limit: int | None = None  # the first N prompts of each set
    engine: EngineOptions = EngineOptions()
    tp: int = 1

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m not in BENCH_METHODS]
        if bad or not self.methods:
            raise EagletError(f"--methods {','.join(self.methods)}: choose from {','.join(BENCH_METHODS)}")
        if self.batch_size < 1:
            raise EagletError(f"--batch-size must be >= 1, got {self.batch_size}")


@dataclass(frozen=True)
class EndpointBenchConfig:
    endpoint: str  # base URL, e.g. http://127.0.0.1:8000 (with or without /v1)
    out: str
    prompts: str = "builtin"
    limit: int | None = None
    model: str | None = None  # default: the first model the server lists
    concurrency: int | None = None  # None: no cap
    request_rate: float | None = None  # requests/s (Poisson); None: all at once (capped by concurrency)
    max_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise EagletError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.request_rate is not None and not self.request_rate > 0:
            raise EagletError(f"--request-rate must be > 0, got {self.request_rate}")
        if self.concurrency is None and self.request_rate is None:
            raise EagletError("--endpoint needs --concurrency N or --request-rate R (or both)")


# `train --recipe NAME`: the flags a recipe sets where the command line does not. "chat": the command that made
# the shipped SmolLM2 draft (docs/training.md, session 27, --time-budget-min 17), for chat targets (the Magpie
# prompts need a chat template); the budget and batch sizes stay the user's; a budget cuts the sampled answers.
RECIPES: dict[str, dict[str, object]] = {
    "chat": {"answers": (0.0, 0.7, 1.0), "max_samples": 16000, "self_prompts": 20000, "self_prompt_openers": 0.5,
             "follow_ups": 0.0, "max_new_tokens": 256, "epochs": 6},
}
REGEN_CONCURRENCY = 32  # data regenerate --endpoint: requests in flight unless --concurrency says
DEFAULT_MAX_BATCH = 8  # serve: rows decoded together, when neither --max-batch nor --batch-sizes says


@dataclass(frozen=True)
class ServeConfig:
    target: TargetOptions = TargetOptions()
    draft: str = "default"  # 'default', 'none' or a draft directory
    host: str = "127.0.0.1"
    port: int = 8000
    max_queue: int = 256
    max_batch: int | None = None  # rows at most; None: the largest of batch_sizes, else DEFAULT_MAX_BATCH
    batch_sizes: tuple[int, ...] | None = None  # the sizes a batch opens with; None: powers of two
    warm_up: bool | None = None  # build each size's step before listening; None: under CUDA graphs
    grace_s: float = 30.0
    engine: EngineOptions = EngineOptions()
    tp: int = 1
    stream_interval: int = 1  # a streamed row's tokens go out once this many have gathered (and at its end)
    overlap_handoff: bool = False  # a step's tokens go to the loop once the next step is queued (no gain measured)

    def __post_init__(self) -> None:
        if self.max_batch is not None and self.max_batch < 1:
            raise EagletError(f"--max-batch must be >= 1, got {self.max_batch}")
        if self.batch_sizes and self.max_batch is not None and self.max_batch != max(self.batch_sizes):
            raise EagletError(f"--max-batch {self.max_batch} and --batch-sizes {','.join(map(str, self.batch_sizes))} "
                              "disagree: the largest batch size is the limit, so give one of them")
        if self.max_queue < 1:
            raise EagletError(f"--max-queue must be >= 1, got {self.max_queue}")
        if not 0 < self.port < 65536:
            raise EagletError(f"--port must be in 1..65535, got {self.port}")
        if self.grace_s < 0:
            raise EagletError(f"--grace must be >= 0, got {self.grace_s}")
        if self.stream_interval < 1:
            raise EagletError(f"--stream-interval must be >= 1, got {self.stream_interval}")


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

