"""The eaglet command line: the only place that parses arguments.

eaglet generate | bench | data | train | doctor | serve
"""

from __future__ import annotations

import argparse
import json
import sys

from eaglet.errors import EagletError


def _add_target(p: argparse.ArgumentParser, context: bool = True) -> None:
    p.add_argument("--target", default="smollm2-135m",
                   help="embedded model name, HF model directory, or .gguf file (default: smollm2-135m)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="the target's dtype (default: float32 on CPU, bfloat16 on CUDA)")
    if context:
        p.add_argument("--max-context", type=int, default=None,
                       help="KV-cache size in tokens (default: the model's window, capped at 4096)")


def _add_sampling(p: argparse.ArgumentParser, seed: int | None = None) -> None:
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--seed", type=int, default=seed)


# --- tensor parallelism: --tp N for generate, bench, data capture, train (bodies in eaglet/parallel/commands.py) ---


def _tp_size(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of ranks, got {text!r}")
    return n


def _add_tp(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp", type=_tp_size, default=1,
                   help="tensor-parallel ranks: shard the target over N processes, one per GPU (gloo on CPU); "
                        "eaglet starts them, or joins those torchrun started (default: 1)")


def _tp_job(args, under_torchrun_too: bool = True) -> bool:
    """Run as N ranks: --tp > 1, or (generate, bench) any torchrun job, whose size must then match --tp."""
    from eaglet.parallel.launch import under_torchrun

    return args.tp > 1 or (under_torchrun_too and under_torchrun())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eaglet", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text for one prompt (speculative when a draft is given)")
    _add_target(g)
    _add_sampling(g)
    _add_tp(g)
    g.add_argument("--prompt", required=True, help="user message; the chat template is applied")
    g.add_argument("--draft", default="default",
                   help="'default' (the target's shipped draft, if any), 'none' (plain decoding), or a draft directory")
    g.add_argument("--json", action="store_true", help="print one JSON object with the result on the last line")
    _add_spec_options(g)
    _add_engine_options(g)
    _add_bench_parser(sub)
    _add_training_parsers(sub)
    _add_doctor_parser(sub)
    _add_serve_parser(sub)
    return parser


def _device_dtype(args):
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise EagletError("--device cuda was asked for but no CUDA device is available")
    name = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    return device, getattr(torch, name)


def cmd_generate(args) -> int:
    from eaglet.parallel.commands import generate_rank, generate_tp
    from eaglet.parallel.state import SINGLE
    from eaglet.sampling import SamplingParams

    SamplingParams(args.temperature, args.top_p, args.top_k, args.max_new_tokens, args.seed)  # fail before loading
    device, dtype = _device_dtype(args)
    if _tp_job(args):
        return generate_tp(args, device, dtype)
    print(f"eaglet: loading {args.target} on {device} ({str(dtype).removeprefix('torch.')})", file=sys.stderr)
    result = generate_rank(SINGLE, args, device, dtype)
    if args.json:
        print(json.dumps(result))
    return 0


# --- speculative decoding: generate --draft, bench -----------------------------------------------------------


def _add_spec_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-steps", type=int, default=None, help="draft steps = tree depth (default: automatic)")
    p.add_argument("--topk", type=int, default=None, help="children per expanded node (default: automatic)")
    p.add_argument("--num-draft-tokens", type=int, default=None,
                   help="tree nodes verified, root included (default: automatic); set all three or none")


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="fuse the speculative engine's iteration with torch.compile before graph capture "
                        "(default: on with CUDA graphs; compiles once per batch size and tree; docs/speculative.md)")
    p.add_argument("--policy", choices=("auto", "off"), default="auto",
                   help="'auto': measure costs and acceptance, step down to smaller trees or plain decoding "
                        "when speculation is slower; 'off': keep the tree whatever it costs")


def _add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="side-by-side speed: plain, speculative, transformers generate, prompt lookup")
    _add_target(b)
    b.add_argument("--draft", default="default", help="'default' (the target's shipped draft) or a draft directory")
    b.add_argument("--prompts", default="builtin",
                   help="JSONL of OpenAI 'messages' or {'prompt': ...} lines, or 'builtin' (80 bench prompts)")
    b.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    _add_sampling(b, seed=0)
    b.add_argument("--batch-size", type=int, default=1, help="prompts decoded together (ours and hf)")
    b.add_argument("--methods", default="plain,spec,hf,hf-lookup", help="comma-separated subset of the default")
    b.add_argument("--out", required=True, help="directory for report.json and report.png")
    _add_spec_options(b)
    _add_engine_options(b)
    _add_tp(b)
    b.add_argument("--endpoint", default=None,
                   help="measure a running OpenAI-compatible server at this URL instead (streamed chat completions; "
                        "only --prompts --limit --max-new-tokens --temperature --seed --out apply)")
    b.add_argument("--concurrency", type=int, default=None, help="with --endpoint: requests in flight at most")
    b.add_argument("--request-rate", type=float, default=None, help="with --endpoint: Poisson arrivals per second")
    b.add_argument("--model", default=None, help="with --endpoint: the model name (default: the first listed)")


def cmd_bench(args) -> int:
    from eaglet.bench.run import BenchConfig, run_bench

    if args.endpoint:
        from eaglet.bench.endpoint import EndpointBenchConfig, run_endpoint_bench

        report = run_endpoint_bench(EndpointBenchConfig(
            args.endpoint, args.out, args.prompts, args.limit, args.model, args.concurrency, args.request_rate,
            args.max_new_tokens, args.temperature, args.seed))
        return 1 if report["summary"]["failed"] else 0
    device, dtype = _device_dtype(args)
    cfg = BenchConfig(target=args.target, draft=args.draft, prompts=args.prompts, out=args.out,
                      methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
                      max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                      top_k=args.top_k, seed=args.seed, batch_size=args.batch_size, limit=args.limit,
                      device=device, dtype=dtype, max_context=args.max_context,
                      tree=(args.num_steps, args.topk, args.num_draft_tokens), compile_engine=args.compile,
                      policy=args.policy == "auto")
    if _tp_job(args):
        from eaglet.parallel.commands import bench_tp

        return bench_tp(args, cfg)
    run_bench(cfg)
    return 0


# --- training: eaglet data regenerate | data capture | train | draft import ----------------------------------


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None



def _add_regen_options(p: argparse.ArgumentParser, batch_flag: str) -> None:
    p.add_argument(batch_flag, dest="regen_batch_size", type=int, default=256, help="prompts decoded together")
    p.add_argument("--max-new-tokens", type=int, default=384)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="longer prompts are skipped and counted")
    p.add_argument("--max-samples", type=int, default=None, help="regenerate at most this many training prompts")
    p.add_argument("--max-val-samples", type=int, default=None, help="and at most this many validation prompts")


def _add_training_parsers(sub) -> None:
    data = sub.add_parser("data", help="training data: regenerate answers with the target, capture features")
    dsub = data.add_subparsers(dest="data_command", required=True)
    r = dsub.add_parser("regenerate", help="the target answers the prompts itself (self-distillation); resumable")
    _add_target(r, context=False)
    r.add_argument("--data", required=True, help="'builtin' (the prompt corpus) or JSONL files, comma-separated")
    r.add_argument("--split", choices=["train", "val", "all"], default="all")
    r.add_argument("--out", required=True, help="output JSONL; finished records are appended, a rerun resumes")
    _add_regen_options(r, "--batch-size")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--time-budget-min", type=float, default=None, help="stop after the batch running at this time")

    c = dsub.add_parser("capture", help="offline features: captured points and final hidden states, sharded")
    _add_target(c, context=False)
    c.add_argument("--data", required=True, help="JSONL with assistant answers (e.g. from `data regenerate`)")
    c.add_argument("--split", choices=["train", "val", "all"], default="all")
    c.add_argument("--out", required=True, help="feature directory (resumes per shard)")
    c.add_argument("--capture", type=_ints, default=None, help="points in eaglet's convention (default: EAGLE-3's)")
    c.add_argument("--shard-samples", type=int, default=512, help="conversations per shard")
    c.add_argument("--batch-tokens", type=int, default=16384)
    c.add_argument("--max-len", type=int, default=None, help="tokens per conversation (default: 2048 or the window)")
    c.add_argument("--feature-dtype", choices=["bfloat16", "float32"], default="bfloat16")
    _add_tp(c)

    t = sub.add_parser("train", help="train an EAGLE-3 draft (training-time test); resumes from OUT/checkpoint")
    _add_target(t, context=False)
    t.add_argument("--data", default="builtin", help="JSONL with answers, or 'builtin' / prompts with --regenerate")
    t.add_argument("--out", required=True, help="run directory: logs, checkpoint/, draft/ (the export), acc.png")
    t.add_argument("--regenerate", action="store_true", help="first have the target answer --data's prompts")
    _add_regen_options(t, "--regen-batch-size")
    t.add_argument("--regen-budget-min", type=float, default=None,
                   help="time for regeneration (default: half of --time-budget-min)")
    t.add_argument("--features", default=None, help="offline feature directory (`data capture`) instead of online")
    t.add_argument("--val-features", default=None, help="offline features for validation")
    t.add_argument("--val-fraction", type=float, default=0.02, help="held out when records carry no split")
    t.add_argument("--time-budget-min", type=float, default=None,
                   help="whole-command budget; training stops in time to validate and export")
    t.add_argument("--ttt-steps", type=int, default=7)
    t.add_argument("--decay", type=float, default=0.8, help="loss weight decay**j of draft step j")
    t.add_argument("--lr", type=float, default=5e-4)
    t.add_argument("--min-lr-ratio", type=float, default=0.05)
    t.add_argument("--warmup-steps", type=int, default=50)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--grad-clip", type=float, default=0.5)
    t.add_argument("--epochs", type=int, default=1)
    t.add_argument("--max-steps", type=int, default=None)
    t.add_argument("--batch-tokens", type=int, default=16384, help="padded tokens per batch and rank")
    t.add_argument("--max-len", type=int, default=None, help="tokens per conversation (default: 2048 or the window)")
    t.add_argument("--draft-vocab-size", type=int, default=None, help="default: largest with a 16 MiB bf16 LM head")
    t.add_argument("--capture", type=_ints, default=None, help="points in eaglet's convention (default: EAGLE-3's)")
    t.add_argument("--save-every", type=int, default=250)
    t.add_argument("--val-every", type=int, default=250)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--no-autocast", action="store_true", help="no bf16 autocast on CUDA")
    t.add_argument("--tensorboard", action="store_true", help="also log to OUT/tensorboard (needs tensorboard)")
    _add_tp(t)

    d = sub.add_parser("draft", help="draft checkpoints")
    dd = d.add_subparsers(dest="draft_command", required=True)
    i = dd.add_parser("import", help="re-write an SGLang/SpecForge/vLLM EAGLE-3 draft as an eaglet draft")
    i.add_argument("src")
    i.add_argument("out")
    _add_target(i, context=False)
    i.add_argument("--capture-ids", type=_ints, default=None, help="layer ids, in --convention")
    i.add_argument("--convention", choices=["eaglet", "vllm", "sglang", "specforge"], default=None,
                   help="how --capture-ids count (sglang/specforge: output of layer i = eaglet point i+1)")


def _load_for_training(args, device):
    import torch

    from eaglet.loading import load_target

    name = args.dtype or ("bfloat16" if str(device).startswith("cuda") else "float32")
    print(f"eaglet: loading {args.target} on {device} ({name})", file=sys.stderr)
    return load_target(args.target, dtype=getattr(torch, name), device=device)


def _split(args) -> str | None:
    return None if args.split == "all" else args.split


def cmd_data(args) -> int:
    import time
    from pathlib import Path

    from eaglet.data.prompts import load_conversations
    from eaglet.train.dist import init_distributed

    if args.data_command == "capture" and _tp_job(args, under_torchrun_too=False):
        from eaglet.parallel.commands import capture_tp

        return capture_tp(args, *_device_dtype(args))
    dist = init_distributed(args.device)
    if dist.enabled:
        raise EagletError("`eaglet data` runs as one process; under torchrun use `eaglet train --regenerate`")
    dev = dist.device
    if args.data_command == "regenerate":
        from eaglet.data.regenerate import regenerate
        from eaglet.train.pipeline import RegenConfig, capped

        convs = capped(load_conversations(args.data, _split(args)), args.max_samples, args.seed)
        rc = RegenConfig(args.regen_batch_size, args.max_new_tokens, args.temperature, args.top_p,
                         args.max_prompt_tokens, seed=args.seed)
        deadline = time.time() + 60 * args.time_budget_min if args.time_budget_min else None
        target = _load_for_training(args, dev)
        stats = regenerate(target, convs, Path(args.out), rc.params(), rc.batch_size, rc.max_prompt_tokens,
                           seed=args.seed, deadline=deadline)
        print(json.dumps({"out": args.out, **vars(stats)}))
        return 0
    import torch

    from eaglet.train.pipeline import capture_run

    target = _load_for_training(args, dev)
    print(json.dumps(capture_run(target, args.data, _split(args), Path(args.out), args.capture, args.max_len,
                                 args.shard_samples, args.batch_tokens, getattr(torch, args.feature_dtype))))
    return 0


def cmd_train(args) -> int:
    import time
    from pathlib import Path

    from eaglet.train.dist import init_distributed
    from eaglet.train.pipeline import RegenConfig, run_train
    from eaglet.train.trainer import TrainConfig

    cfg = TrainConfig(ttt_steps=args.ttt_steps, decay=args.decay, lr=args.lr, min_lr_ratio=args.min_lr_ratio,
                      warmup_steps=args.warmup_steps, weight_decay=args.weight_decay, grad_clip=args.grad_clip,
                      epochs=args.epochs, max_steps=args.max_steps, batch_tokens=args.batch_tokens,
                      max_len=args.max_len, draft_vocab_size=args.draft_vocab_size, capture_points=args.capture,
                      save_every=args.save_every, val_every=args.val_every, seed=args.seed,
                      autocast=False if args.no_autocast else None, tensorboard=args.tensorboard)
    regen = None
    if args.regenerate:
        regen = RegenConfig(args.regen_batch_size, args.max_new_tokens, args.temperature, args.top_p,
                            args.max_prompt_tokens, args.max_samples, args.max_val_samples, args.seed)
    if _tp_job(args, under_torchrun_too=False):  # torchrun without --tp: data parallel (DDP)
        from eaglet.parallel.commands import train_tp

        return train_tp(args, cfg, regen, *_device_dtype(args))
    start = time.time()  # --time-budget-min covers loading the target too
    dist = init_distributed(args.device)
    target = _load_for_training(args, dist.device)
    budget = 60 * args.time_budget_min if args.time_budget_min else None
    regen_budget = 60 * args.regen_budget_min if args.regen_budget_min else None
    result = run_train(target, args.data, Path(args.out), cfg, dist, regen, args.features, args.val_features,
                       args.val_fraction, budget, regen_budget, start)
    if dist.main:
        result.pop("config")
        print(json.dumps({"draft": str(Path(args.out) / "draft"), **result}))
    return 0


def cmd_draft(args) -> int:
    from eaglet.draft.compat import import_draft
    from eaglet.train.dist import init_distributed

    target = _load_for_training(args, init_distributed(args.device).device)
    if args.capture_ids is not None and args.convention is None:
        raise EagletError("--capture-ids needs --convention (eaglet, vllm, sglang or specforge)")
    spec = import_draft(args.src, args.out, target, list(args.capture_ids) if args.capture_ids else None,
                        args.convention)
    print(json.dumps({"out": args.out, "capture_points": list(spec.points), "convention": "eaglet"}))
    return 0


# --- end of training commands -------------------------------------------------------------------------------


# --- eaglet doctor: does serving feed the draft what training fed it? (body in eaglet/doctor/) ---------------


def _add_doctor_parser(sub) -> None:
    d = sub.add_parser("doctor", help="check a draft against its target, training against serving, with evidence")
    _add_target(d)
    d.add_argument("--draft", default="default", help="a draft directory, or 'default' (the target's shipped draft)")
    d.add_argument("--prompts", default="builtin",
                   help="JSONL of chat prompts (OpenAI 'messages' or {'prompt': ...}), or 'builtin' (bench set)")
    d.add_argument("--num-prompts", type=int, default=8, help="prompts the target answers and the draft is scored on")
    d.add_argument("--max-new-tokens", type=int, default=128,
                   help="tokens per answer the draft is scored on; the speculative run decodes the first 48")
    d.add_argument("--features", default=None, help="offline feature directory (`data capture`) to compare too")
    d.add_argument("--tp", type=_tp_size, default=None, help="also compare the target at tp=N with tp=1")
    d.add_argument("--json", default=None, metavar="PATH", help="write the whole report as JSON to PATH")
    d.add_argument("--temperature", type=float, default=0.0, help="sampling settings to judge (default: greedy)")
    d.add_argument("--top-p", type=float, default=1.0)
    d.add_argument("--top-k", type=int, default=0, help="0 = off")
    _add_spec_options(d)


def cmd_doctor(args) -> int:
    from eaglet.doctor.config import DoctorConfig
    from eaglet.doctor.run import run_doctor

    device, dtype = _device_dtype(args)
    cfg = DoctorConfig(target=args.target, draft=args.draft, prompts=args.prompts, num_prompts=args.num_prompts,
                       max_new_tokens=args.max_new_tokens, features=args.features, tp=args.tp,
                       num_steps=args.num_steps, topk=args.topk, num_draft_tokens=args.num_draft_tokens,
                       temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                       max_context=args.max_context, device=device, dtype=dtype)
    report = run_doctor(cfg)
    print(report.format())
    if args.json:
        report.write_json(args.json)
    return 0 if report.ok else 1


# --- eaglet serve: the OpenAI-compatible server (body in eaglet/serve/) ---------------------------------------


def _add_serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching (docs/serving.md)")
    _add_target(s)
    s.add_argument("--draft", default="default",
                   help="'default' (the target's shipped draft, if any), 'none' (plain decoding), or a draft directory")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-batch", type=int, default=8, help="rows decoded together (the running batch)")
    s.add_argument("--max-queue", type=int, default=256, help="requests waiting for a row; more are answered 429")
    s.add_argument("--grace", type=float, default=30.0, help="seconds running requests get after SIGTERM")
    _add_spec_options(s)
    _add_engine_options(s)


def cmd_serve(args) -> int:
    from eaglet.serve.server import ServeConfig, serve

    device, dtype = _device_dtype(args)
    return serve(ServeConfig(target=args.target, draft=args.draft, host=args.host, port=args.port,
                             max_queue=args.max_queue, max_batch=args.max_batch, grace_s=args.grace, device=device,
                             dtype=dtype, max_context=args.max_context,
                             tree=(args.num_steps, args.topk, args.num_draft_tokens), compile_engine=args.compile,
                             policy=args.policy == "auto"))


COMMANDS = {"generate": cmd_generate, "bench": cmd_bench}
COMMANDS.update(data=cmd_data, train=cmd_train, draft=cmd_draft)
COMMANDS.update(doctor=cmd_doctor)
COMMANDS.update(serve=cmd_serve)


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
