"""Option groups several commands share: the target, sampling, --tp, the draft tree, the engine."""

from __future__ import annotations

import argparse

from eaglet import options
from eaglet.cli_checks import device, integer, number


def add_target(p: argparse.ArgumentParser, context: bool = True) -> None:
    p.add_argument("--target", default=options.DEFAULT_TARGET,
                   help="the target model: an embedded name (smollm2-135m), a Hugging Face model directory "
                        "(config.json, safetensors, tokenizer) or a .gguf file")
    p.add_argument("--device", type=device, default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="the target's dtype (default: float32 on CPU, bfloat16 on CUDA)")
    if context:
        p.add_argument("--max-context", type=integer(2), default=None,
                       help="KV-cache size in tokens, prompt and answer together (default: the model's window, "
                            "capped at 4096)")


def add_sampling(p: argparse.ArgumentParser, defaults: options.SamplingParams) -> None:
    seed = defaults.seed
    p.add_argument("--max-new-tokens", type=integer(1), default=defaults.max_new_tokens,
                   help="tokens generated per answer at most")
    p.add_argument("--temperature", type=number(0), default=defaults.temperature,
                   help="sampling temperature; 0 = greedy")
    p.add_argument("--top-p", type=number(0, 1, low_open=True), default=defaults.top_p,
                   help="nucleus sampling: keep the most likely tokens up to this probability mass; 1 = off")
    p.add_argument("--sample-top-k", "--top-k", dest="top_k", metavar="K", type=integer(0), default=defaults.top_k,
                   help="sampling: keep the k most likely tokens; 0 = off (not the draft tree's --tree-topk)")
    p.add_argument("--seed", type=int, default=seed,
                   help="random seed of sampling" + (" (default: none, a fresh draw each run)" if seed is None else ""))


def add_tp(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp", type=integer(1), default=1,
                   help="tensor-parallel ranks: shard the target over N processes, one per GPU (gloo on CPU); "
                        "eaglet starts them, or joins those torchrun started")


def add_spec_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-steps", type=integer(1), default=None,
                   help="draft tree: draft steps = tree depth (default: automatic)")
    p.add_argument("--tree-topk", "--topk", dest="topk", metavar="K", type=integer(1), default=None,
                   help="draft tree: children per expanded node (default: automatic; not sampling's --sample-top-k)")
    p.add_argument("--num-draft-tokens", type=integer(2), default=None,
                   help="draft tree: nodes verified per step, root included (default: automatic); "
                        "set all three tree options or none")


def add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="fuse the speculative engine's iteration with torch.compile before graph capture "
                        "(default: on with CUDA graphs; compiles once per batch size and tree; docs/speculative.md)")
    p.add_argument("--compile-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="fuse the prefill's captured buckets with torch.compile too (CUDA): ~3 ms less a joining "
                        "prompt on an H200 for ~20-40 s more at start (default: on with CUDA graphs, off in "
                        "generate; docs/performance.md)")
    add_head_options(p)
    p.add_argument("--policy", choices=("auto", "off"), default="auto",
                   help="'auto': measure costs and acceptance, step down to smaller trees or plain decoding "
                        "when speculation is slower; 'off': keep the tree whatever it costs")


def add_head_options(p: argparse.ArgumentParser) -> None:
    """How the draft's LM head and layer are served (the engine's options; the doctor checks them)."""
    p.add_argument("--draft-vocab", type=integer(1), default=None, metavar="N",
                   help="serve the draft with the N most frequent tokens of its vocabulary (drafts eaglet trained "
                        "since 2026-12-02 list it by frequency; default: all, and 12288 on a CPU whose draft LM head "
                        "stays float32; docs/speculative.md)")
    p.add_argument("--int8-draft-head", action=argparse.BooleanOptionalAction, default=None,
                   help="serve the draft's LM head in int8: fbgemm's on an x86 CPU with a float32 target, where "
                        "the head is most of a draft step (default: there, unless --compile), a Triton GEMM on "
                        "CUDA (default: off; docs/speculative.md)")
    p.add_argument("--int8-draft-layer", action=argparse.BooleanOptionalAction, default=None,
                   help="serve the draft's fc and decoder layer in int8 as well, halving the weight a draft step "
                        "reads: fbgemm's on an x86 CPU with a float32 target (default: there, with the head in "
                        "int8), a Triton GEMM on CUDA (default: off; docs/speculative.md)")
    p.add_argument("--extend-draft-vocab", action=argparse.BooleanOptionalAction, default=None,
                   help="serve the draft's LM head over the target's whole vocabulary, the tokens it was not "
                        "trained on given rows mapped from the target's LM head (default: on a CPU that serves "
                        "the head in int8 over all its tokens; docs/speculative.md)")
