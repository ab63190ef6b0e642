"""What a command was asked to do, as typed frozen objects, each default written once.

cli_options.py turns the parsed arguments into these (cli.py's argparse defaults are read from them,
so the manual and the library agree) and ``eaglet/commands/`` runs them; the library modules take the
pieces they need (``SamplingParams``, ``TreeConfig``...); those of the commands that make a draft
(``TrainConfig``, ``RegenConfig``...) are in ``train_options``. Values are checked at
construction, in the CLI's words. Nothing here imports torch, so parsing the command line and
printing --help stay quick: a dtype is a name until a model loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

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
    int8_layer: bool | None = None  # the draft's fc and layer in int8 too (where int8_head can be); None: load's

    def fused_prefill(self, device: torch.device) -> bool:
        """Whether the engines on ``device`` fuse their prefill buckets: --compile-prefill as given, else on CUDA."""
        return on_cuda_unless_given(self.compile_prefill, device)

    @property
    def tree_flags(self) -> tuple[int | None, int | None, int | None]:
        """(num_steps, topk, num_draft_tokens), all None when automatic: the engine's and the report's form."""
        t = self.tree
        return (t.num_steps, t.topk, t.num_draft_tokens) if t else (None, None, None)


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
