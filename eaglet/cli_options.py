"""The checked command line as options: one function a command turns cli.py's argparse
namespace into the typed objects of options.py. Nothing past this module reads the namespace."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable

from eaglet.doctor.config import DoctorConfig
from eaglet.options import (
    BenchConfig,
    EndpointBenchConfig,
    EngineOptions,
    GenerateOptions,
    SamplingParams,
    ServeConfig,
    TargetOptions,
    TreeConfig,
)
from eaglet.train_options import (
    CaptureOptions,
    DraftImportOptions,
    RegenConfig,
    RegenerateOptions,
    TrainConfig,
    TrainOptions,
)


def command_name(a: Namespace) -> str:
    """'generate', or with a subcommand 'data capture', 'draft import'."""
    sub = getattr(a, f"{a.command}_command", None)
    return f"{a.command} {sub}" if sub else a.command


def _target(a: Namespace) -> TargetOptions:
    return TargetOptions.auto(a.target, a.device, a.dtype, getattr(a, "max_context", None))


def _sampling(a: Namespace) -> SamplingParams:
    return SamplingParams(a.temperature, a.top_p, a.top_k, a.max_new_tokens, a.seed)


def _engine(a: Namespace) -> EngineOptions:
    # cli_checks has made sure the three tree flags come together or not at all
    tree = TreeConfig(a.num_steps, a.topk, a.num_draft_tokens) if a.num_steps is not None else None
    return EngineOptions(tree, a.compile, a.policy == "auto", a.compile_prefill, a.draft_vocab, a.int8_draft_head,
                         a.extend_draft_vocab, a.int8_draft_layer)


def _regen(a: Namespace) -> RegenConfig:
    return RegenConfig(a.regen_batch_size, a.max_new_tokens, a.answers, a.top_p, a.max_prompt_tokens,
                       a.max_samples, a.max_val_samples, a.self_prompts, a.follow_ups, a.seed,
                       a.self_prompt_openers)


def _split(a: Namespace) -> str | None:
    return None if a.split == "all" else a.split


def generate(a: Namespace) -> GenerateOptions:
    return GenerateOptions(a.prompt, _target(a), _sampling(a), _engine(a), a.draft, a.json, a.tp)


def bench(a: Namespace) -> BenchConfig | EndpointBenchConfig:
    if a.endpoint:  # a running server is measured: no model of ours, no device
        return EndpointBenchConfig(a.endpoint, a.out, a.prompts, a.limit, a.model, a.concurrency, a.request_rate,
                                   a.max_new_tokens, a.temperature, a.seed)
    methods = tuple(m.strip() for m in a.methods.split(",") if m.strip())
    return BenchConfig(a.out, _target(a), a.draft, a.prompts, methods, _sampling(a), a.batch_size, a.limit,
                       _engine(a), a.tp)


def regenerate(a: Namespace) -> RegenerateOptions:
    return RegenerateOptions(a.data, a.out, _target(a), _regen(a), _split(a), a.restart, a.time_budget_min,
                             a.endpoint, a.model, a.concurrency)


def capture(a: Namespace) -> CaptureOptions:
    return CaptureOptions(a.data, a.out, _target(a), _split(a), a.capture, a.shard_samples, a.batch_tokens,
                          a.max_len, a.feature_dtype, a.tp)


def train(a: Namespace) -> TrainOptions:
    cfg = TrainConfig(ttt_steps=a.ttt_steps, decay=a.decay, lr=a.lr, min_lr_ratio=a.min_lr_ratio,
                      warmup_steps=a.warmup_steps, weight_decay=a.weight_decay, grad_clip=a.grad_clip,
                      epochs=a.epochs, max_steps=a.max_steps, batch_tokens=a.batch_tokens, max_len=a.max_len,
                      draft_vocab_size=a.draft_vocab_size, draft_intermediate_size=a.draft_intermediate_size,
                      capture_points=a.capture, save_every=a.save_every,
                      val_every=a.val_every, seed=a.seed, autocast=False if a.no_autocast else None,
                      tensorboard=a.tensorboard, aux_norm=a.aux_norm, aux_noise=a.aux_noise,
                      label_temperature=a.label_temperature, ttt_reach=a.ttt_reach,
                      earlier_turns=not a.target_turns_only, compile_loss=a.compile_loss,
                      fused_ttt_attention=a.fused_ttt_attention, feature_cache=a.feature_cache,
                      init_draft=None if a.init_draft in (None, "none") else a.init_draft)
    return TrainOptions(a.out, a.data, _target(a), cfg, _regen(a) if a.regenerate else None, a.features,
                        a.val_features, a.val_fraction, a.time_budget_min, a.regen_budget_min, a.train_tokens_per_s,
                        a.tp)


def draft_import(a: Namespace) -> DraftImportOptions:
    return DraftImportOptions(a.src, a.out, _target(a), a.capture_ids, a.convention, a.overwrite)


def doctor(a: Namespace) -> DoctorConfig:
    t = _target(a)
    return DoctorConfig(target=a.target, draft=a.draft, prompts=a.prompts, num_prompts=a.num_prompts,
                        max_new_tokens=a.max_new_tokens, features=a.features, tp=a.tp, num_steps=a.num_steps,
                        topk=a.topk, num_draft_tokens=a.num_draft_tokens, temperature=a.temperature,
                        top_p=a.top_p, top_k=a.top_k, draft_vocab=a.draft_vocab, int8_head=a.int8_draft_head,
                        extend_vocab=a.extend_draft_vocab, int8_layer=a.int8_draft_layer,
                        max_context=t.max_context, device=t.device, dtype=t.dtype, json=a.json)


def serve(a: Namespace) -> ServeConfig:
    return ServeConfig(_target(a), a.draft, a.host, a.port, a.max_queue, a.max_batch, a.batch_sizes, a.warm_up,
                       a.grace, _engine(a), a.tp, a.stream_interval, a.overlap_handoff)


OPTIONS: dict[str, Callable[[Namespace], object]] = {
    "generate": generate, "bench": bench, "data regenerate": regenerate, "data capture": capture, "train": train,
    "draft import": draft_import, "doctor": doctor, "serve": serve}
