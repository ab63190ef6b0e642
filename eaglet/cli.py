"""The eaglet command line: the only place that parses arguments.

eaglet generate | bench | data | train | doctor
"""

from __future__ import annotations

import argparse
import json
import sys

from eaglet.errors import EagletError


def _add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="smollm2-135m",
                   help="embedded model name, HF model directory, or .gguf file (default: smollm2-135m)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--max-context", type=int, default=None,
                   help="KV-cache size in tokens (default: the model's window, capped at 4096)")


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--seed", type=int, default=None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eaglet", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text for one prompt (speculative when a draft is given)")
    _add_target(g)
    _add_sampling(g)
    g.add_argument("--prompt", required=True, help="user message; the chat template is applied")
    g.add_argument("--draft", default="default",
                   help="'default' (the target's shipped draft, if any), 'none' (plain decoding), or a draft directory")
    g.add_argument("--json", action="store_true", help="print one JSON object with the result on the last line")
    return parser


def _device_dtype(args):
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise EagletError("--device cuda was asked for but no CUDA device is available")
    name = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    return device, getattr(torch, name)


def cmd_generate(args) -> int:
    from transformers import TextStreamer

    from eaglet.chat import encode_chat
    from eaglet.generate import PlainGenerator
    from eaglet.loading import load_target
    from eaglet.sampling import SamplingParams

    params = SamplingParams(args.temperature, args.top_p, args.top_k, args.max_new_tokens, args.seed)
    device, dtype = _device_dtype(args)
    print(f"eaglet: loading {args.target} on {device} ({str(dtype).removeprefix('torch.')})", file=sys.stderr)
    target = load_target(args.target, dtype=dtype, device=device)
    if args.draft not in ("none", "default"):
        raise EagletError("speculative decoding with a draft directory is not available yet; use --draft none")
    if args.draft == "default":
        print(f"eaglet: no default draft ships for {args.target}; plain decoding", file=sys.stderr)
    prompt = encode_chat(target.tokenizer, [{"role": "user", "content": args.prompt}])
    gen = PlainGenerator(target, args.max_context)
    streamer = TextStreamer(target.tokenizer, skip_special_tokens=True)
    import torch

    [done] = gen.generate([prompt], params, on_token=lambda _row, t: streamer.put(torch.tensor([t])))
    streamer.end()
    if args.json:
        text = target.tokenizer.decode(done.tokens, skip_special_tokens=True)
        print(json.dumps({
            "text": text,
            "prompt_tokens": len(prompt),
            "completion_tokens": len(done.tokens),
            "finish_reason": done.finish_reason,
            "seconds": round(done.seconds, 4),
            "tokens_per_s": round(done.tokens_per_s, 2),
            "draft": None,
        }))
    return 0


COMMANDS = {"generate": cmd_generate}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except EagletError as e:
        print(f"eaglet: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("eaglet: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
