"""From prompts to an exported draft in one call: regenerate, tokenize, train.

``run_train`` is what ``eaglet train`` runs. With ``regen`` set, the target first
writes the training data (``eaglet.data.sources``: its own prompts, answers at every
setting, validation prompts first so a time budget never leaves the run without
validation data, second turns) into ``out/regenerated*.jsonl``, for as long as
``eaglet.train.budget`` allows; then the conversations are tokenized once (cached in
``out/tokens-{train,val}.safetensors``, shared by DDP ranks and resumed runs) and the
trainer runs on what the remaining time allows.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections.abc import Callable
from pathlib import Path

from eaglet.data.dataset import TokenData
from eaglet.data.features import FeatureSet
from eaglet.data.prompts import BUILTIN, Conversation, load_conversations, note, split_train_val
from eaglet.data.refill import release_memory
from eaglet.data.sources import RegenConfig, answer_sources
from eaglet.data.template import tokenize_conversations
from eaglet.errors import EagletError
from eaglet.loading.target import Target
from eaglet.train import probe
from eaglet.train.budget import BudgetSplit, Clock, mark_done, regen_done
from eaglet.train.dist import SINGLE_PROCESS, DistInfo, any_rank, barrier
from eaglet.train.trainer import TrainConfig, Trainer

ANSWER_FILE = re.compile(r"regenerated(-\d+)?\.jsonl")  # not the prompt files of regeneration's stages


def eos_ids(target: Target) -> set[int]:
    ids = set(target.config.eos_token_ids)
    if target.tokenizer.eos_token_id is not None:
        ids.add(target.tokenizer.eos_token_id)
    return ids


def capture_run(target: Target, data: str, split: str | None, out: Path, capture_points: str | None,
                max_len: int | None, shard_samples: int, batch_tokens: int, feature_dtype) -> dict:
    """``eaglet data capture``: offline features for every answered conversation of ``data``."""
    from eaglet.data.features import capture_features

    convs = [c for c in load_conversations(data, split) if c.has_answer]
    if not convs:
        raise EagletError(f"{data} holds no assistant answers; run `eaglet data regenerate` first")
    tc = TrainConfig(capture_points=capture_points, max_len=max_len)
    seq = tc.seq_len(target.config.max_position_embeddings)
    items = [t for t in tokenize_conversations(target.tokenizer, convs, eos_ids(target), seq) if t]
    capture = tc.capture(target.config.num_layers)
    written = capture_features(target, TokenData.from_tokenized(items), out, capture, shard_samples,
                               batch_tokens, feature_dtype)
    return {"out": str(out), "conversations": len(items), "shards_written": written, "capture": list(capture.points)}


def capped(convs: list[Conversation], n: int | None, seed: int) -> list[Conversation]:
    if n is None or n >= len(convs):
        return convs
    return random.Random(seed).sample(convs, n)


def sampled_prompts(convs: list[Conversation], rc: RegenConfig) -> list[Conversation]:
    """``data regenerate``'s prompts: validation records capped at max_val_samples, the rest at max_samples."""
    val = [c for c in convs if c.split == "val"]
    return capped(val, rc.max_val_samples, rc.seed) + capped([c for c in convs if c.split != "val"],
                                                            rc.max_samples, rc.seed)


def answer_files(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("regenerated*.jsonl") if ANSWER_FILE.fullmatch(p.name))


def regenerate_run(target: Target, data: str, out: Path, rc: RegenConfig, dist: DistInfo,
                   stop_when: Callable[[int], bool] | None, val_fraction: float, progress: bool = True) -> str:
    """Regenerate the training data for ``data``'s prompts into ``out``; returns the comma-joined answer files.

    ``stop_when(tokens)``: the time budget (``BudgetSplit.stopper``) or None.
    """
    done = regen_done(out)
    if done is not None:
        if dist.main:
            note(f"regeneration ended on an earlier run's time budget ({done.get('answers')} answers); training on "
                 f"that data (remove {out / 'regenerated.done.json'} to regenerate more)")
        return ",".join(str(p) for p in answer_files(out))
    train, val = split_train_val(load_conversations(data), val_fraction)
    name = "regenerated.jsonl" if dist.world == 1 else f"regenerated-{dist.rank}.jsonl"
    others = [p for p in answer_files(out) if p.name != name]
    # Records without a split of their own get this one, so training reads it back.
    prompts = [c if c.split else Conversation(c.id, c.messages, split, c.source)
               for split, convs, cap in (("val", val, rc.max_val_samples), ("train", train, rc.max_samples))
               for c in capped(convs, cap, rc.seed)]
    stats = answer_sources(target, prompts, out / name, rc, stop_when, others, progress and dist.main,
                           shard=(dist.rank, dist.world))
    stopped = any_rank(any(s.stopped_early for s in stats), dist)
    barrier(dist)
    if stopped and dist.main:
        mark_done(out, {"answers": sum(s.done_before + s.written for s in stats), "stopped_by_budget": True})
    return ",".join(str(p) for p in answer_files(out))


def tokenized(target: Target, convs: list[Conversation], path: Path, max_len: int, dist: DistInfo,
              earlier_turns: bool = True) -> TokenData:
    """Tokenize (rank 0, cached by content) and load on every rank."""
    h = hashlib.sha256(f"{target.tokenizer_hash}:{max_len}:{earlier_turns}".encode())
    for c in convs:
        h.update(json.dumps([c.messages, c.truncated, c.answer_ids, c.target_turns], ensure_ascii=False).encode())
    key = h.hexdigest()[:16]
    if dist.main:
        cached = None
        if path.is_file():
            try:
                cached, meta = TokenData.load(path)
                cached = cached if meta.get("key") == key else None
            except EagletError:
                cached = None
        if cached is None:
            t0 = time.perf_counter()
            items = tokenize_conversations(target.tokenizer, convs, eos_ids(target), max_len,
                                           earlier_turns=earlier_turns)
            kept = [t for t in items if t is not None]
            if len(kept) < len(items):
                note(f"{len(items) - len(kept)} conversations have no answer token within --max-len {max_len}")
            if not kept:
                raise EagletError(f"no conversation for {path.stem} has an assistant answer to train on")
            TokenData.from_tokenized(kept).save(path, {"key": key})
            note(f"tokenized {len(kept)} conversations into {path.name} in {time.perf_counter() - t0:.1f} s")
    barrier(dist)
    return TokenData.load(path)[0]


def run_train(target: Target, data: str, out: Path, cfg: TrainConfig, dist: DistInfo = SINGLE_PROCESS,
              regen: RegenConfig | None = None, features: str | None = None, val_features: str | None = None,
              val_fraction: float = 0.02, time_budget_s: float | None = None,
              regen_budget_s: float | None = None, train_tokens_per_s: float | None = None,
              clock: Clock | None = None) -> dict:
    """Budgets count from ``clock.start`` (default: a clock started now), e.g. the command's own start,
    target loading and earlier pieces of the job included; the clock books the seconds of each stage
    (regenerate, tokenize, train: validation and export included).

    With ``regen`` and a budget, regeneration stops as ``BudgetSplit`` says (``regen_budget_s``
    caps it explicitly), with the training rate ``train_tokens_per_s``, else one timed here (``probe``; a
    single process), else the H200 figure.
    """
    clock = clock or Clock()
    start = clock.start
    where = target.model.embed.weight.device
    if dist.device.type != where.type:  # SINGLE_PROCESS is the CPU: a caller with a GPU target must say so
        raise EagletError(f"the target is on {where} but training would run on {dist.device}; pass "
                          f"DistInfo(device=...) for the target's device")
    deadline = start + time_budget_s if time_budget_s else None
    out.mkdir(parents=True, exist_ok=True)
    if regen is not None:
        stop_when = None
        if time_budget_s or regen_budget_s:
            cached = None
            if time_budget_s and not (regen_budget_s or train_tokens_per_s or dist.enabled or regen_done(out)):
                with clock.stage("probe"):
                    train_tokens_per_s, cached = probe.train_tokens_per_s(target, cfg, dist.device)
                again = f", {cached:,.0f} with its features kept" if cached != train_tokens_per_s else ""
                note(f"training here makes ~{train_tokens_per_s:,.0f} padded tokens a second{again} (a few "
                     "steps timed; --train-tokens-per-s sets it): the budget's split counts with that")
            split = BudgetSplit(time_budget_s or float("inf"), cfg.epochs, regen_budget_s=regen_budget_s,
                                cached_tokens_per_s=cached,
                                **({"train_tokens_per_s": train_tokens_per_s} if train_tokens_per_s else {}))
            stop_when = split.stopper(start)
        with clock.stage("regenerate"):
            data = regenerate_run(target, data, out, regen, dist, stop_when, val_fraction, cfg.progress)
        release_memory()  # its running batch, held by cycles: training sizes its feature cache from what is free
    elif data == BUILTIN:  # the CLI refuses this before loading; here for callers of run_train
        raise EagletError("the built-in corpus holds prompts only: add --regenerate to have the target answer them")
    budget_cut = regen is not None and regen_done(out) is not None
    try:
        convs = [c for c in load_conversations(data) if c.has_answer]
    except EagletError:
        if not budget_cut:
            raise
        convs = []  # the budget ended regeneration before anything was written
    train_convs, val_convs = split_train_val(convs, val_fraction)
    if not train_convs and budget_cut:
        why = ("--regen-budget-min ended regeneration before any training answer; raise it" if regen_budget_s else
               "the time budget ended regeneration before any training answer: at this machine's training rate it "
               "held room for none; raise --time-budget-min (or set --train-tokens-per-s)")
        raise EagletError(f"{why} and remove {out / 'regenerated.done.json'} to regenerate more")
    if not convs:
        raise EagletError(f"{data} holds no assistant answers to train on; regenerate them first "
                          "(eaglet data regenerate, or eaglet train --regenerate)")
    if not train_convs:
        raise EagletError(f"{data} holds no training conversations (all are in the val split)")
    max_len = cfg.seq_len(target.config.max_position_embeddings)
    with clock.stage("tokenize"):
        train_src = FeatureSet(features) if features else tokenized(
            target, train_convs, out / "tokens-train.safetensors", max_len, dist, cfg.earlier_turns)
        val_src = None
        if val_features:
            val_src = FeatureSet(val_features)
        elif val_convs:
            val_src = tokenized(target, val_convs, out / "tokens-val.safetensors", max_len, dist, cfg.earlier_turns)
    if dist.main:
        note(f"training on {len(train_src)} conversations ({sum(train_src.lengths)} tokens), validating on "
             f"{len(val_src) if val_src is not None else 0}")
    with clock.stage("train"):
        return Trainer(cfg, target, train_src, val_src, out, dist, deadline).run()
