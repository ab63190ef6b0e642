"""The training loop: EAGLE-3 training-time test, AdamW, warmup + cosine, checkpoints, export.

Optimizer as in the paper: AdamW (0.9, 0.95), gradient clipping at 0.5. The learning
rate warms up linearly, then follows a cosine down to ``min_lr_ratio * lr``; the
cosine's progress is the larger of the step fraction and, under a time budget, the
elapsed fraction of the budget, so a run stopped by the clock has already decayed.

Outputs in ``out``: ``train_log.jsonl``, ``acc.png``, ``checkpoint/`` (resume state),
``draft/`` (the exported draft, bf16 shards of at most 16 MiB; also written with each checkpoint, its summary
marked ``in_progress``, until the end's export replaces it) and, with TensorBoard,
``tensorboard/``. A run whose ``checkpoint/`` exists resumes from it.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm import tqdm

from eaglet.data.dataset import TokenData, length_batches
from eaglet.data.features import FeatureSet
from eaglet.data.prompts import note
from eaglet.data.refill import release_memory
from eaglet.draft.checkpoint import MAX_SHARD_BYTES, save_draft
from eaglet.draft.compat import load_draft_for, target_identity
from eaglet.draft.model import DraftConfig, Eagle3Draft
from eaglet.draft.vocab import coverage, default_draft_vocab_size, select_vocab, token_counts
from eaglet.errors import EagletError
from eaglet.interrupt import Interrupted, stop_on_signal
from eaglet.loading.target import Target
from eaglet.options import on_cuda_unless_given
from eaglet.speculative.load import resolve_draft
from eaglet.train.dist import SINGLE_PROCESS, DistInfo, all_sum, any_rank
from eaglet.train.evaluate import score, unroll
from eaglet.train.feature_cache import FeatureCache, caches_for
from eaglet.train.inputs import Featurizer, StepInputs
from eaglet.train.report import RunLog, plot_accuracy, summarize
from eaglet.train.state import load_state, read_info, save_state
from eaglet.train.ttt import SERVE_WINDOW, TTTLoss, sharpen
from eaglet.train_options import TrainConfig


def lr_at(cfg: TrainConfig, step: int, total: int, time_frac: float) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    prog = min(1.0, max((step - cfg.warmup_steps) / max(total - cfg.warmup_steps, 1), time_frac))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog)))


class Trainer:
    def __init__(self, cfg: TrainConfig, target: Target, train: TokenData | FeatureSet,
                 val: TokenData | FeatureSet | None, out: Path, dist: DistInfo = SINGLE_PROCESS,
                 deadline: float | None = None):
        self.cfg, self.target, self.train_src, self.val_src, self.out, self.dist = cfg, target, train, val, out, dist
        self.deadline = deadline
        tc = target.config
        cfg.seq_len(tc.max_position_embeddings)
        self.capture = cfg.capture(tc.num_layers)
        for src in (train, val):
            if isinstance(src, FeatureSet):
                src.check(target, self.capture)
        dev = dist.device
        self.started_from = init = self._initial_draft()
        self.run_key = {"target": {k: v for k, v in target_identity(target).items() if k != "name"},
                        "capture": self.capture.to_json(), "draft_vocab_size": self.draft.config.draft_vocab_size,
                        "ttt_steps": cfg.ttt_steps, **({"aux_norm": True} if cfg.aux_norm else {}),
                        **({"intermediate_size": width} if (width := self.draft.config.intermediate_size)
                           != tc.draft_shape()[0] else {}),  # only where it differs: older checkpoints resume
                        "vocab_order": "frequency" if self.draft.config.vocab_by_frequency else "id",
                        **({"init_draft": str(init)} if init else {})}
        self.opt = torch.optim.AdamW(self.draft.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                                     weight_decay=cfg.weight_decay)
        self.step, self.epoch, self.batch_pos = 0, 0, 0
        self.last_val: dict | None = None  # the latest validation row, for the in-progress exports
        self.fingerprint = _fingerprint(train)
        info = read_info(out / "checkpoint")
        if info is not None:
            self._resume(info)
        elif init is None:
            self._init_vocab()
        elif dist.main:
            counts = token_counts(train.ids, train.mask, tc.vocab_size)
            note(f"starting from the draft at {init}: its vocabulary of {self.draft.config.draft_vocab_size} tokens "
                 f"covers {100 * coverage(counts, self.draft.vocab_ids().cpu()):.2f}% of this data's answer tokens")
        draft_ids = self.draft.vocab_ids()
        max_len = cfg.seq_len(tc.max_position_embeddings)
        train_cache, val_cache = self._feature_caches(train, val)
        self.train_feats = Featurizer(target, self.capture, draft_ids, train, dev, max_len, train_cache)
        self.val_feats = Featurizer(target, self.capture, draft_ids, val, dev, max_len, val_cache) \
            if val is not None else None
        self.loss = TTTLoss(self.draft, cfg.ttt_steps, cfg.decay, *cfg.fast_ttt(dev), cfg.ttt_reach)
        self.model = self.loss
        if dist.enabled:
            from torch.nn.parallel import DistributedDataParallel

            self.model = DistributedDataParallel(self.loss, device_ids=[dev] if dev.type == "cuda" else None)
        self.autocast = cfg.autocast if cfg.autocast is not None else dev.type == "cuda"
        self.batches_per_epoch = len(length_batches(train.lengths, cfg.batch_tokens, cfg.seed)) // dist.world
        if self.batches_per_epoch == 0:
            raise EagletError(f"the training data makes fewer batches than the {dist.world} ranks")
        self.total = cfg.epochs * self.batches_per_epoch
        if cfg.max_steps is not None:
            self.total = min(self.total, cfg.max_steps)

    # --- setup ---------------------------------------------------------------------------

    def _initial_draft(self) -> Path | None:
        """Sets ``self.draft``: a new one from the seed, or with ``init_draft`` that draft's weights and vocabulary
        (fine-tuning it on this run's data), refused unless it reads this run's capture points, norms them as this
        run would and keeps any --draft-vocab-size asked for. Returns the draft directory started from, if any."""
        cfg, tc, dev = self.cfg, self.target.config, self.dist.device
        if cfg.init_draft is None:
            size = cfg.draft_vocab_size or default_draft_vocab_size(tc.vocab_size)
            with torch.random.fork_rng(devices=[]), torch.device(dev):
                torch.manual_seed(cfg.seed)  # the same seed gives the same initial draft
                self.draft = Eagle3Draft(replace(DraftConfig.for_target(tc, self.capture, size, cfg.aux_norm,
                                                                        cfg.draft_intermediate_size),
                                                 vocab_by_frequency=True))
            return None
        path = resolve_draft(cfg.init_draft, self.target)
        if path is None:
            raise EagletError(f"--init-draft default: no draft ships for {self.target.name}; give a draft directory")
        draft = load_draft_for(path, self.target, dev)[0]
        c, bad = draft.config, []
        if c.capture.points != self.capture.points:
            bad.append(f"it reads points {list(c.capture.points)}, this run {list(self.capture.points)} (--capture)")
        if c.aux_norm != cfg.aux_norm:
            bad.append(f"it was trained {'with' if c.aux_norm else 'without'} --aux-norm")
        if cfg.draft_intermediate_size not in (None, c.intermediate_size):
            bad.append(f"its MLP is {c.intermediate_size} wide, not --draft-intermediate-size "
                       f"{cfg.draft_intermediate_size}")
        if cfg.draft_vocab_size not in (None, c.draft_vocab_size):
            bad.append(f"its vocabulary has {c.draft_vocab_size} tokens, not --draft-vocab-size {cfg.draft_vocab_size}")
        if bad:
            raise EagletError(f"--init-draft {path} does not fit this run: {'; '.join(bad)}")
        self.draft = draft.float().train()
        return path

    def _init_vocab(self) -> None:
        tc, d = self.target.config, self.draft
        counts = token_counts(self.train_src.ids, self.train_src.mask, tc.vocab_size)
        ids = select_vocab(counts, d.config.draft_vocab_size)
        d.set_vocab(ids.to(d.d2t.device))
        if self.dist.main:
            note(f"draft vocabulary: {ids.numel()} of {tc.vocab_size} tokens, covering "
                 f"{100 * coverage(counts, ids):.2f}% of the answer tokens")
        if self.cfg.init_from_target:
            with torch.no_grad():
                # The target's token geometry; the final norm stays at 1 (the target's own norm
                # weights, up to ~3 in SmolLM2, make the untrained draft confidently wrong).
                # head_rows: whole rows [Vd, H] (the embedding's when tied), also from a vocab-sharded head.
                rows = self.target.model.head_rows(ids.to(self.target.model.embed.weight.device))
                d.lm_head.weight.copy_(rows.float())

    def _feature_caches(self, train, val) -> tuple[FeatureCache | None, FeatureCache | None]:
        """(train, val) caches of the target's features for online sources, validation's first, as memory
        allows; none where training reads offline features."""
        if not on_cuda_unless_given(self.cfg.feature_cache, self.dist.device) or not isinstance(train, TokenData):
            return None, None
        tc = self.target.config
        val_tokens = val.num_tokens if isinstance(val, TokenData) else 0
        val_cache, train_cache = caches_for([val_tokens, train.num_tokens], len(self.capture.points) * tc.hidden_size,
                                            tc.hidden_size, self.target.model.embed.weight.dtype, self.dist.device)
        if self.dist.main:
            kept = train_cache.capacity
            note(f"keeping the target's features of {kept:,} of {train.num_tokens:,} training tokens in memory after "
                 "their first pass" + ("" if kept == train.num_tokens else " (the rest are recomputed each epoch)"))
        return train_cache, val_cache if val_tokens else None

    def _resume(self, info: dict) -> None:
        if info.get("run") != self.run_key:
            raise EagletError(f"{self.out / 'checkpoint'} belongs to a run with other settings "
                              f"({info.get('run')}); use another --out or the same target, capture and vocabulary")
        load_state(self.out / "checkpoint", self.draft, self.opt)
        self.step, self.epoch, self.batch_pos = info["step"], info["epoch"], info["batch"]
        if info.get("data") != self.fingerprint:
            note("the training data changed since the checkpoint; its epoch restarts with the new data")
            self.batch_pos = 0
        if self.dist.main:
            note(f"resuming from step {self.step} (epoch {self.epoch}, batch {self.batch_pos})")

    # --- loop ----------------------------------------------------------------------------

    def _forward(self, inp: StepInputs, model: torch.nn.Module):
        return unroll(model, inp, self.autocast)

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        b = length_batches(self.train_src.lengths, self.cfg.batch_tokens, self.cfg.seed, epoch)
        n = len(b) // self.dist.world * self.dist.world
        return b[self.dist.rank: n: self.dist.world]

    def run(self) -> dict:
        cfg, d = self.cfg, self.dist
        log = RunLog(self.out, self.step, cfg.tensorboard) if d.main else None
        start = time.time()
        span = (self.deadline - start) if self.deadline else None
        bar = tqdm(total=self.total, initial=self.step, desc="train", unit="step",
                   disable=not (cfg.progress and d.main), dynamic_ncols=True)
        tokens, val_row, val_seconds = 0, None, 0.0
        start_row = None
        if self.started_from is not None and self.step == 0 and self.val_src is not None:
            # Where the draft started on this run's validation set: the end is judged against it.
            start_row, val_seconds = self._validate(log)
            val_row = start_row
        stopped_by_clock = False
        paced = None  # (time, tokens) after this run's first step, which compiles: the pace is measured from there
        with stop_on_signal("training step") as stop:
            while self.step < self.total and self.epoch < cfg.epochs:
                batches = self._epoch_batches(self.epoch)
                while self.batch_pos < len(batches) and self.step < self.total:
                    if any_rank(bool(stop), d):
                        self._interrupted(log, bar)
                    now = time.time()
                    pace = (tokens - paced[1], now - paced[0]) if paced else (0, 0.0)
                    reserve = 5 + self._val_estimate(val_seconds, *pace)
                    if any_rank(self.deadline is not None and now + reserve >= self.deadline, d):
                        stopped_by_clock = True
                        break
                    t0 = time.perf_counter()
                    lr = lr_at(cfg, self.step, self.total, (now - start) / span if span else 0.0)
                    for g in self.opt.param_groups:
                        g["lr"] = lr
                    inp, stats = self._backward(batches[self.batch_pos])
                    gnorm = torch.nn.utils.clip_grad_norm_(self.draft.parameters(), cfg.grad_clip)
                    self.opt.step()
                    self.step += 1
                    self.batch_pos += 1
                    tokens += inp.num_tokens
                    row = summarize(all_sum(stats.detach(), d), cfg.decay)  # reads the GPU: the step has run
                    paced = paced or (time.time(), tokens)
                    if d.main:
                        row.update(step=self.step, split="train", epoch=self.epoch, lr=lr, grad_norm=float(gnorm),
                                   tokens=inp.num_tokens, seconds=round(time.perf_counter() - t0, 4))
                        log.write(row)
                        bar.update(1)
                        bar.set_postfix(loss=f"{row['loss']:.3f}", acc0=f"{row['acc_0']:.3f}",
                                        tau=f"{row['tau_pred']:.2f}")
                    if self.val_src is not None and self.step % cfg.val_every == 0:
                        val_row, val_seconds = self._validate(log)
                    if self.step % cfg.save_every == 0:
                        self._save(log)
                if stopped_by_clock or self.step >= self.total:
                    break
                self.epoch, self.batch_pos = self.epoch + 1, 0
        bar.close()
        if self.val_src is not None and (val_row is None or val_row["step"] != self.step):
            val_row, _ = self._validate(log)
        self._save(log, export=False)  # the export below replaces it
        result = {"steps": self.step, "epochs_done": self.epoch + self.batch_pos / max(self.batches_per_epoch, 1),
                  "stopped_by_clock": stopped_by_clock, "tokens_this_run": tokens * d.world,
                  "seconds_this_run": round(time.time() - start, 1), "val": val_row,
                  **({"val_at_start": start_row} if start_row else {}),
                  "train_conversations": len(self.train_src), "ttt_steps": cfg.ttt_steps,
                  "device": str(d.device), "world_size": d.world, "config": _jsonable(asdict(cfg))}
        if d.device.type == "cuda":
            result["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated(d.device) / 2**30, 1)
        if d.main:
            self._export(result, final=True)
            log.close()
        return result

    def _backward(self, batch: list[int]) -> tuple[StepInputs, torch.Tensor]:
        """The batch's inputs and loss statistics, its gradients computed. A single-process run whose GPU runs out
        of memory beside the kept features (their share is estimated before the first step: session 33's H100
        ran out at the second) drops them and does the step again, then goes on recomputing every batch's
        features as a run that keeps none (ranks that skipped a backward would leave the others waiting)."""
        try:
            return self._backward_once(batch)
        except torch.OutOfMemoryError:
            cache = self.train_feats.cache
            if self.dist.enabled or cache is None or cache.buf is None:
                raise
        # Outside the except block: its traceback holds the failed step's tensors.
        self.train_feats.cache, kept = None, cache.drop()
        self.opt.zero_grad(set_to_none=True)
        release_memory()
        tqdm.write(f"eaglet: out of GPU memory beside the features of {kept:,} training tokens kept in memory; they "
                   "are dropped and recomputed from here on (--no-feature-cache keeps none)", file=sys.stderr)
        return self._backward_once(batch)

    def _backward_once(self, batch: list[int]) -> tuple[StepInputs, torch.Tensor]:
        inp = self.train_feats(batch)
        if self.cfg.aux_noise:  # EAGLE's feature noise: the draft learns to read imperfect features
            inp = replace(inp, aux=inp.aux + (torch.rand_like(inp.aux) * 2 - 1) * self.cfg.aux_noise)
        if self.cfg.label_temperature != 1:  # validation keeps the target's own distribution
            inp = replace(inp, target_logp=sharpen(inp.target_logp, self.cfg.label_temperature))
        loss, stats = self._forward(inp, self.model)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        return inp, stats

    def _export(self, training: dict, final: bool) -> None:
        """Write the draft to OUT/draft with ``training`` as its summary: at the end, and at each checkpoint (marked
        in progress), so a run that never ends, its machine lost or its job killed, still leaves a draft to serve or
        to start another run from (--init-draft)."""
        # A draft with aux_norm runs in eaglet only anyway: a tensor over 16 MiB goes in row blocks, so every
        # shard still passes size-limited channels. Without it the draft is for other engines too: whole
        # tensors, in larger shards where one needs it.
        largest = max(2 * p.numel() for p in self.draft.parameters())  # bf16 bytes
        whole = not self.draft.config.aux_norm and largest > MAX_SHARD_BYTES
        if whole and final:
            note(f"a draft tensor takes {largest >> 20} MiB in bf16; exporting whole tensors in shards of up "
                 "to 4 GiB (other engines read no row blocks)")
        save_draft(self.draft, self.out / "draft", target=target_identity(self.target), extra={"training": training},
                   max_shard_bytes=4 << 30 if whole else MAX_SHARD_BYTES, split_rows=self.draft.config.aux_norm)

    def _interrupted(self, log: RunLog | None, bar: tqdm) -> None:
        """A signal asked to stop (eaglet.interrupt): checkpoint this step and say how to resume."""
        bar.close()
        self._save(log)
        if log is not None:
            log.close()
        raise Interrupted(f"training stopped at step {self.step} of {self.total}; {self.out / 'checkpoint'} holds "
                          "it: run the same command again to resume from there")

    def _val_estimate(self, measured: float, tokens: int, seconds: float) -> float:
        """Seconds the final validation will take: measured, else guessed from training throughput (``tokens``
        trained in ``seconds`` since the run's first step: that step compiles or loads its kernels, 2.4 s on an H100
        against ~0.13 s for the next ones, and a 45-second budget that extrapolated from it reserved more than it had
        left for validation and stopped at step 1, session 51)."""
        if self.val_src is None or not (measured or tokens):
            return 0.0  # until a step after the first there is nothing to extrapolate from
        if measured:
            return 1.5 * measured
        # A validation token costs a forward only, about a third of a training token.
        return 0.5 * sum(self.val_src.lengths) / self.dist.world * seconds / tokens

    @torch.no_grad()
    def _validate(self, log: RunLog | None) -> tuple[dict, float]:
        t0 = time.perf_counter()
        d = self.dist
        batches = length_batches(self.val_src.lengths, self.cfg.batch_tokens, self.cfg.seed)
        total = score(self.val_feats, batches[d.rank:: d.world], lambda inp: self._forward(inp, self.loss),
                      self.cfg.ttt_steps, d.device)
        row = summarize(all_sum(total, d), self.cfg.decay)
        row.update(step=self.step, split="val")
        self.last_val = row
        if log is not None:
            log.write(row)
            accs = " ".join(f"acc_{j}={row[f'acc_{j}']:.3f}" for j in range(self.cfg.ttt_steps))
            tqdm.write(f"eaglet: val step {self.step}: {accs} tau_pred={row['tau_pred']:.2f} "
                       f"(all answer tokens: acc_0={row['acc_all_0']:.3f} tau={row['tau_all']:.2f}; their first "
                       f"{SERVE_WINDOW}: acc_0={row['acc_serve_0']:.3f} tau={row['tau_serve']:.2f})", file=sys.stderr)
        return row, time.perf_counter() - t0

    def _save(self, log: RunLog | None, export: bool = True) -> None:
        if not self.dist.main:
            return
        info = {"step": self.step, "epoch": self.epoch, "batch": self.batch_pos, "run": self.run_key,
                "data": self.fingerprint, "config": _jsonable(asdict(self.cfg))}
        save_state(self.out / "checkpoint", self.draft, self.opt, info)
        plot_accuracy(log.path, self.out / "acc.png")
        if export:
            self._export({"in_progress": True, "steps": self.step, "of_steps": self.total, "val": self.last_val},
                         final=False)


def _fingerprint(src: TokenData | FeatureSet) -> str:
    return src.manifest["data_fingerprint"] if isinstance(src, FeatureSet) else src.fingerprint()


def _jsonable(d: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
