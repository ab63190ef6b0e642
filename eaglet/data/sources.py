"""The regeneration stages: every source of self-distilled training data, in one order.

1. prompts the target writes itself (``self_prompts`` Magpie attempts, source ``self``)
   into ``<out>.self-prompts.jsonl``; a hash-chosen 5% of them (source ``self-heldout``) are
   validation: open-ended requests of the kind the target was tuned on, beside the unseen
   evals and held-back chats (written by the same generator as the training ones, so a
   held-out sample rather than a held-out source);
2. greedy answers to the validation prompts (scored as greedy serving sees them), then to
   the training prompts (``regenerate``);
3. second turns (``follow_ups``: a seeded fraction of the conversations answered greedily
   in step 2 whose answer ended, not cut at ``max_new_tokens``: a cut answer followed by
   the template's end of turn is not what the target wrote): the target writes the next
   user turn into ``<out>.follow-ups.jsonl``, then answers it greedily. Such a record
   keeps its first conversation's id (plus ``+2``), split and source, so validation still
   holds whole sources out, and its ``target_turns`` (2) says both assistant turns are the
   target's;
4. the answers at the other settings of ``answers`` (sampled temperatures), one record
   each, for the training prompts and second turns: the bulk of the tokens, so last.

Every stage resumes from its file; a time budget (``stop_when``) stops admitting prompts
(answers: before each prompt joins the running batch, those in flight finish; written turns:
between batches), so later stages are the first to be cut.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from eaglet.data.prompts import Conversation, note, read_jsonl
from eaglet.data.refill import Refill
from eaglet.data.regenerate import RegenStats, regenerate, run_rows
from eaglet.data.remote import Endpoint
from eaglet.data.self_prompts import TurnConfig, follow_up_jobs, load_written, self_prompt_jobs, write_turns
from eaglet.loading.target import Target
from eaglet.train_options import RegenConfig

SELF_VAL_SOURCE = "self-heldout"
SELF_VAL_FRACTION = 0.05  # of the Magpie prompts, held out for validation


def _turns(rc: RegenConfig) -> TurnConfig:
    return TurnConfig(batch_size=rc.batch_size, seed=rc.seed)


def side_file(out: Path, kind: str) -> Path:
    """Where a stage that writes prompts keeps them: beside ``out``, named after it."""
    return out.with_name(f"{out.name.removesuffix('.jsonl')}.{kind}.jsonl")


def picked(conv_id: str, fraction: float, salt: str) -> bool:
    """A seeded, order-free choice of ``fraction`` of the ids."""
    return int(hashlib.sha1(f"{salt}:{conv_id}".encode()).hexdigest()[:8], 16) < fraction * 2**32


def answer_sources(target: Target | Endpoint, prompts: list[Conversation], out: Path, rc: RegenConfig,
                   stop_when: Callable[[int], bool] | None = None, also_done: list[Path] = (),
                   progress: bool = True, claim_fix: str = "pass another --out", shard: tuple[int, int] = (0, 1),
                   ) -> list[RegenStats]:
    """Run the stages for ``prompts`` into ``out``; ``shard`` (rank, world) takes every world-th job.

    ``stop_when(tokens)``: see ``regenerate``; the prompt-writing stages ask it with 0.
    """
    rank, world = shard
    rc = replace(rc, batch_size=run_rows(target, rc.batch_size, rc.max_prompt_tokens, rc.max_new_tokens))
    turn_stop = (lambda: stop_when(0)) if stop_when else None
    val = [c for c in prompts if c.split == "val"][rank::world]
    train = [c for c in prompts if c.split != "val"][rank::world]
    if rc.self_prompts:
        path = side_file(out, "self-prompts")
        jobs = [replace(c, split="val", source=SELF_VAL_SOURCE) if picked(c.id, SELF_VAL_FRACTION, "self-val") else c
                for c in self_prompt_jobs(rc.self_prompts, openers=rc.self_prompt_openers, seed=rc.seed)[rank::world]]
        write_turns(target, jobs, path, replace(_turns(rc), openers=rc.self_prompt_openers), "self-prompts",
                    turn_stop, progress)
        written = load_written(path)
        val += [c for c in written if c.split == "val"]
        train += [c for c in written if c.split != "val"]

    # One running batch answers every stage, so its step is compiled and captured once a run, not a stage.
    refill = None if isinstance(target, Endpoint) else Refill(target, rc.batch_size, rc.max_prompt_tokens,
                                                                 rc.params())

    def answer(convs: list[Conversation], what: str, greedy_only: bool = True) -> RegenStats:
        stats = regenerate(target, convs, out, rc.params(), rc.batch_size, rc.max_prompt_tokens, seed=rc.seed,
                           stop_when=stop_when, also_done=also_done, progress=progress, claim_fix=claim_fix,
                           temperatures=rc.answers, greedy_only=greedy_only, refill=refill)
        if rank == 0:
            note(f"answered {stats.written} {what} ({stats.tokens} answer tokens) in {stats.seconds:.0f} s; "
                 f"{stats.done_before} were done before" + ("; stopped by the time budget" * stats.stopped_early))
        return stats

    # Validation first: a time budget then cuts training data, never the validation set. Greedy
    # answers and second turns come before the sampled answers, the bulk of the tokens.
    done = [answer(val, "validation prompts"), answer(train, "training prompts, greedily")]
    if rc.follow_ups and not any(s.stopped_early for s in done):
        answered = sorted(read_jsonl(out)[0] if out.is_file() else [], key=lambda c: c.id)  # this rank's own
        firsts = [c for c in answered if c.target_turns == 1 and not c.truncated and "~t" not in c.id
                  and not c.id.endswith("+2") and picked(c.id, rc.follow_ups, f"follow-ups:{rc.seed}")]
        path = side_file(out, "follow-ups")
        if refill is not None:  # its admission scratch goes, so the turn writer's rows count that memory
            refill.trim()
        write_turns(target, follow_up_jobs(firsts), path, _turns(rc), "follow-ups", turn_stop, progress,
                    dedupe=False)
        second = load_written(path)
        done += [answer([c for c in second if c.split == "val"], "validation second turns"),
                 answer([c for c in second if c.split != "val"], "training second turns, greedily")]
        train += [c for c in second if c.split != "val"]
    if len(rc.answers) > 1 and not any(s.stopped_early for s in done):
        done.append(answer(train, "training prompts at every setting", greedy_only=False))
    return done
