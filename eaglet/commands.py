"""What each command does at tp=1, from the options cli.py parsed and checked; tp > 1 goes to
``eaglet/parallel/commands.py``. A command returns its exit status."""

from __future__ import annotations

import json
import sys

from eaglet.errors import EXIT_CHECK_FAILED, EagletError


def _tp_job(args, under_torchrun_too: bool = True) -> bool:
    """Run as N ranks: --tp > 1, or (generate, bench) any torchrun job, whose size must then match --tp."""
    from eaglet.parallel.launch import under_torchrun

    return args.tp > 1 or (under_torchrun_too and under_torchrun())


def _device_dtype(args):
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
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


def _load_for_training(args, device):
    import torch

    from eaglet.loading import load_target

    name = args.dtype or ("bfloat16" if str(device).startswith("cuda") else "float32")
    print(f"eaglet: loading {args.target} on {device} ({name})", file=sys.stderr)
    return load_target(args.target, dtype=getattr(torch, name), device=device)


def _split(args) -> str | None:
    return None if args.split == "all" else args.split


def _regen_config(args):
    from eaglet.data.sources import RegenConfig

    return RegenConfig(args.regen_batch_size, args.max_new_tokens, args.answers, args.top_p, args.max_prompt_tokens,
                       args.max_samples, args.max_val_samples, args.self_prompts, args.follow_ups, args.seed)


def _endpoint(args):
    """The server of ``data regenerate --endpoint``, with --target's tokenizer (no weights are read)."""
    from eaglet.data.remote import CONCURRENCY, Endpoint
    from eaglet.loading.target import load_tokenizer, resolve_target_dir
    from eaglet.openai_client import api_base, served_model

    base = api_base(args.endpoint)
    return Endpoint(base, served_model(base, args.model), load_tokenizer(resolve_target_dir(args.target)),
                    args.concurrency or CONCURRENCY)


def cmd_data(args) -> int:
    import time
    from pathlib import Path

    from eaglet.train.dist import init_distributed

    if args.data_command == "capture" and _tp_job(args, under_torchrun_too=False):
        from eaglet.parallel.commands import capture_tp

        return capture_tp(args, *_device_dtype(args))
    dist = init_distributed(args.device)
    if dist.enabled:
        raise EagletError("`eaglet data` runs as one process; under torchrun use `eaglet train --regenerate`")
    dev = dist.device
    if args.data_command == "regenerate":
        from eaglet.data.prompts import load_conversations
        from eaglet.data.regenerate import claim_output, discard, regen_settings
        from eaglet.data.sources import answer_sources, side_file
        from eaglet.train.pipeline import sampled_prompts

        rc = _regen_config(args)
        convs = sampled_prompts(load_conversations(args.data, _split(args)), rc)
        out = Path(args.out)
        endpoint = _endpoint(args) if args.endpoint else None
        claim_output(out, regen_settings(endpoint or args.target, rc.params(), rc.answers),
                     restart=args.restart)  # before loading
        if args.restart:
            for kind in ("self-prompts", "follow-ups"):
                discard(side_file(out, kind))
        deadline = time.time() + 60 * args.time_budget_min if args.time_budget_min else None
        target = endpoint or _load_for_training(args, dev)
        stats = answer_sources(target, convs, out, rc, (lambda _: time.time() >= deadline) if deadline else None,
                               claim_fix="pass another --out, or --restart to start over")
        print(json.dumps({"out": args.out, **{k: sum(getattr(s, k) for s in stats)
                                              for k in ("done_before", "written", "too_long", "tokens")},
                          "stopped_early": any(s.stopped_early for s in stats),
                          "seconds": round(sum(s.seconds for s in stats), 1)}))
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
    from eaglet.train.pipeline import run_train
    from eaglet.train.trainer import TrainConfig

    cfg = TrainConfig(ttt_steps=args.ttt_steps, decay=args.decay, lr=args.lr, min_lr_ratio=args.min_lr_ratio,
                      warmup_steps=args.warmup_steps, weight_decay=args.weight_decay, grad_clip=args.grad_clip,
                      epochs=args.epochs, max_steps=args.max_steps, batch_tokens=args.batch_tokens,
                      max_len=args.max_len, draft_vocab_size=args.draft_vocab_size, capture_points=args.capture,
                      save_every=args.save_every, val_every=args.val_every, seed=args.seed,
                      autocast=False if args.no_autocast else None, tensorboard=args.tensorboard,
                      aux_norm=args.aux_norm, aux_noise=args.aux_noise, earlier_turns=not args.target_turns_only)
    regen = _regen_config(args) if args.regenerate else None
    if _tp_job(args, under_torchrun_too=False):  # torchrun without --tp: data parallel (DDP)
        from eaglet.parallel.commands import train_tp

        return train_tp(args, cfg, regen, *_device_dtype(args))
    start = time.time()  # --time-budget-min covers loading the target too
    dist = init_distributed(args.device)
    target = _load_for_training(args, dist.device)
    budget = 60 * args.time_budget_min if args.time_budget_min else None
    regen_budget = 60 * args.regen_budget_min if args.regen_budget_min else None
    result = run_train(target, args.data, Path(args.out), cfg, dist, regen, args.features, args.val_features,
                       args.val_fraction, budget, regen_budget, start, args.train_tokens_per_s)
    if dist.main:
        result.pop("config")
        print(json.dumps({"draft": str(Path(args.out) / "draft"), **result}))
    return 0


def cmd_draft(args) -> int:
    from eaglet.draft.compat import import_draft
    from eaglet.train.dist import init_distributed

    target = _load_for_training(args, init_distributed(args.device).device)
    spec = import_draft(args.src, args.out, target, list(args.capture_ids) if args.capture_ids else None,
                        args.convention, overwrite=args.overwrite)
    print(json.dumps({"out": args.out, "capture_points": list(spec.points), "convention": "eaglet"}))
    return 0


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
    return 0 if report.ok else EXIT_CHECK_FAILED


def cmd_serve(args) -> int:
    from eaglet.serve.server import ServeConfig, serve

    device, dtype = _device_dtype(args)
    cfg = ServeConfig(target=args.target, draft=args.draft, host=args.host, port=args.port, max_queue=args.max_queue,
                      max_batch=args.max_batch, batch_sizes=args.batch_sizes, warm_up=args.warm_up,
                      grace_s=args.grace, device=device, dtype=dtype, max_context=args.max_context,
                      tree=(args.num_steps, args.topk, args.num_draft_tokens), compile_engine=args.compile,
                      policy=args.policy == "auto", tp=args.tp)
    if _tp_job(args):
        from eaglet.parallel.commands import check_before_ranks

        check_before_ranks(args, device, dtype)
    return serve(cfg)


COMMANDS = {"generate": cmd_generate, "bench": cmd_bench}
COMMANDS.update(data=cmd_data, train=cmd_train, draft=cmd_draft)
COMMANDS.update(doctor=cmd_doctor, serve=cmd_serve)


