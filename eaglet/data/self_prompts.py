"""User turns the target writes itself: Magpie-style prompts and second turns of a conversation.

An aligned chat model given only the chat template's text up to where a user's message
would begin (for ChatML ``<|im_start|>user\\n``, after the template's default system
message when it adds one) writes a plausible user message and ends it with its
end-of-turn token (Magpie, arXiv 2406.08464). No data package is needed, and the prompts
are the kind the target was tuned on. The same prefix after a conversation the target
has answered gives that conversation's next user turn (``follow_up_jobs``).

An aligned model left to itself writes some kinds of request more than others (the 135M
SmolLM2 mostly asks for advice and explanations), and a system message that asks for a
kind does not steer it. Starting the user turn does: after "Pretend you are" it writes a
role-play request, after "Write a poem" a poem request. ``TurnConfig.openers`` is the share
of Magpie prompts started with one of ``OPENERS`` (the kinds of chat traffic: writing,
role-play, reasoning, math, code, extraction, STEM, humanities), chosen per id; their source
is ``STEERED_SOURCE`` and the kept text is the opener and what the target wrote after it.

A written turn is kept when it ended on its own (not cut at ``max_new_tokens``) and its
text has ``min_chars..max_chars`` characters; a Magpie prompt also when it is no duplicate
(case and spacing ignored) of a kept one (a second turn such as "Thanks!" may recur).
Kept turns are appended to a prompt JSONL (one write per batch, settings in its
``.meta.json`` as for answers), and a dropped one as ``{"id", "dropped": why}``, so a
rerun skips every id tried before. Sampling is seeded per batch from the batch's first
id (identical contexts in two batches still draw different turns), and batches are formed
from all jobs whether done or not: a resumed run with the same rows writes what an uninterrupted
one would (a batch has ``batch_size`` rows, fewer where the GPU's free memory holds fewer or the
stage has fewer jobs).
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from eaglet.data.prompts import Conversation, note, parse_record
from eaglet.data.refill import PREFILL_TOKENS, capacity, release_memory, rows_fitting
from eaglet.data.regenerate import claim_output, whole_records
from eaglet.errors import EagletError
from eaglet.generate import PlainGenerator
from eaglet.interrupt import Interrupted, stop_on_signal
from eaglet.loading.target import Target
from eaglet.sampling import SamplingParams

SELF_SOURCE = "self"  # the source name of Magpie-style prompts
STEERED_SOURCE = "self-steered"  # Magpie prompts the target wrote after one of OPENERS
OPENERS = (
    "Write a short story about", "Write a poem about", "Write a letter to", "Write a blog post about",
    "Write a speech for", "Compose an email to", "Rewrite the following", "Draft a",
    "Pretend you are", "Imagine you are", "Act as", "Let's play a game where",
    "If", "Why do", "Which is more likely", "Solve this riddle:",
    "Calculate", "Solve for x:", "What is the probability that", "Prove that",
    "Write a Python function", "How do I", "Explain this code:", "Fix the bug in",
    "Summarize the following", "Extract", "List the", "Classify",
    "Explain how", "What causes", "Describe the process of", "What is the difference between",
    "Discuss", "Compare", "What was the significance of", "Describe",
)
_SENTINEL = "\ue000eaglet-user-turn\ue000"


@dataclass(frozen=True)
class TurnConfig:
    """How the target writes user turns (the defaults of --self-prompts and --follow-ups)."""
    temperature: float = 1.0
    top_p: float = 0.95
    max_new_tokens: int = 256  # a user turn cut here is dropped
    min_chars: int = 12
    max_chars: int = 2000
    batch_size: int = 256
    seed: int = 0
    openers: float = 0.0  # share of Magpie prompts started with one of OPENERS (``opener``)

    def params(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, 0, self.max_new_tokens, self.seed)


def user_prefix(tokenizer, messages: list[dict]) -> str:
    """The template's text of ``messages`` followed by the opening of a new user turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise EagletError("the target's tokenizer has no chat template; eaglet needs one to write user turns")
    text = tokenizer.apply_chat_template([*messages, {"role": "user", "content": _SENTINEL}], tokenize=False)
    cut = text.find(_SENTINEL)
    if cut < 0:
        raise EagletError("the chat template does not render a user message's text, so the target cannot be "
                          "asked to write one")
    return text[:cut]


def _key(text: str) -> str:
    return " ".join(text.lower().split())


def write_turns(target: Target, jobs: list[Conversation], out: Path, cfg: TurnConfig, kind: str,
                stop_when: Callable[[], bool] | None = None, progress: bool = True, dedupe: bool = True) -> int:
    """For each job (its id, split and source, and the messages so far) whose id is not yet in ``out``:
    the target writes the next user turn; kept turns are appended as prompt records. Returns how many
    were kept this run. ``kind`` names the run in ``out``'s recorded settings."""
    # The batch size is left out (it groups the turns sampled together); openers at 0 too, so files written
    # before they existed resume.
    claim_output(out, {"target": str(target.name), "kind": kind, **{k: v for k, v in vars(cfg).items()
                                                                    if k != "batch_size" and (k, v) != ("openers", 0)}},
                 fix="pass another --out")
    tried = whole_records(out)
    done = {str(r.get("id")) for r in tried}
    seen = {_key(c.messages[-1]["content"]) for c in _kept(tried)}
    tok = target.tokenizer
    pending = [c for c in jobs if c.id not in done]
    if not pending:
        return 0
    heads = {c.id: opener(c.id, cfg.openers, cfg.seed) for c in pending}
    ids = dict(zip(heads, tok([user_prefix(tok, list(c.messages)) + heads[c.id] for c in pending],
                              add_special_tokens=False)["input_ids"]))
    # One generator and one cache for the stage, its rows what the memory holds beside a live Refill's cache
    # (a generator per batch's longest context, each keeping its cache, ran an H200 out of memory), its
    # admissions prefilled in parts of PREFILL_TOKENS padded tokens (one forward of 512 rows of second-turn
    # contexts asked 21.96 GiB for attention scores), and released before the next stage sizes its own.
    kept = 0
    bar = tqdm(total=len(pending), desc=kind, unit="turn", disable=not progress, dynamic_ncols=True)
    with _released(generator_for(target, max(map(len, ids.values())), cfg.max_new_tokens)) as gen, \
            open(out, "a", encoding="utf-8") as fh, stop_on_signal("batch") as stop:
        rows = rows_fitting(target, gen.capacity, min(cfg.batch_size, len(pending)))  # a short stage: its own rows
        for lo in range(0, len(jobs), rows):
            first = jobs[lo].id
            batch = [c for c in jobs[lo: lo + rows] if c.id not in done]
            if not batch:
                continue
            if stop:
                bar.close()
                raise Interrupted(f"{kept} user turns were added to {out} this run; run the same command again "
                                  "to resume")
            if stop_when is not None and stop_when():
                break
            fits = [c for c in batch if len(ids[c.id]) < gen.capacity]  # others are too long to continue
            written = gen.generate([ids[c.id] for c in fits], replace(cfg.params(), seed=zlib.crc32(
                f"{cfg.seed}:{first}".encode())), batch=rows, prefill_tokens=PREFILL_TOKENS) if fits else []
            outs = dict(zip((c.id for c in fits), written))
            lines = []
            for c in batch:
                o, head = outs.get(c.id), heads[c.id]
                text = (head + tok.decode(o.tokens, skip_special_tokens=True)).strip() if o is not None else ""
                why = ("too long to continue" if o is None else "cut at max_new_tokens" if o.finish_reason != "stop"
                       else "length" if not cfg.min_chars <= len(text) <= cfg.max_chars
                       else "duplicate" if dedupe and _key(text) in seen else None)
                if why is not None:
                    lines.append(json.dumps({"id": c.id, "dropped": why}) + "\n")
                    continue
                seen.add(_key(text))
                kept += 1
                rec = {"id": c.id, "messages": [*c.messages, {"role": "user", "content": text}], "split": c.split,
                       "source": c.source}
                if c.target_turns:
                    rec["target_turns"] = c.target_turns
                lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
            fh.write("".join(lines))
            fh.flush()
            os.fsync(fh.fileno())
            bar.update(len(batch))
        if stop:  # asked during the last batch, which is saved: stop here, not in a later stage
            bar.close()
            raise Interrupted(f"{kept} user turns were added to {out} this run; run the same command again "
                              "to resume")
    bar.close()
    return kept


@contextmanager
def _released(gen: PlainGenerator) -> Iterator[PlainGenerator]:
    """``gen`` for one stage, then its caches dropped and the memory handed back: the next stage sizes its rows
    from the memory free then."""
    try:
        yield gen
    finally:
        gen.release()
        release_memory()


def generator_for(target: Target, longest: int, max_new_tokens: int) -> PlainGenerator:
    """A generator whose KV capacity holds ``longest`` prompt tokens plus the turn (``refill.capacity``, capped at
    the window: a longer context is too long to continue). Its decode steps are captured (on a GPU) but not
    compiled: a stage's one shape would compile for minutes, and at hundreds of rows a step is not launch-bound;
    admissions run eagerly, as ``Refill``'s (the prefill graphs' buckets padded regeneration's admissions)."""
    return PlainGenerator(target, capacity(target, longest, max_new_tokens), compile=False, bucketed_prefill=False)


def self_prompt_jobs(n: int, system: str | None = None, openers: float = 0.0, seed: int = 0) -> list[Conversation]:
    """``n`` empty conversations (or a system message alone) for Magpie prompts, ids ``self-<i>``; those that
    ``opener`` starts (``openers`` of them, by id) have the source STEERED_SOURCE."""
    msgs = ({"role": "system", "content": system},) if system else ()
    return [Conversation(cid, msgs, split="train",
                         source=STEERED_SOURCE if opener(cid, openers, seed) else SELF_SOURCE)
            for cid in (f"self-{i}" for i in range(n))]


def opener(conv_id: str, share: float, seed: int) -> str:
    """The start of the Magpie prompt ``conv_id`` (one of OPENERS for ``share`` of the ids, by a seeded hash of
    the id, so a resumed run starts each as before), or "" (the target writes the whole turn)."""
    if not share:
        return ""
    h = zlib.crc32(f"opener:{seed}:{conv_id}".encode())
    return OPENERS[h % len(OPENERS)] if h < share * 2**32 else ""


def follow_up_jobs(answered: list[Conversation]) -> list[Conversation]:
    """Each answered conversation, to be continued by a second user turn; ids ``<id>+2``."""
    return [Conversation(f"{c.id}+2", c.messages, c.split, c.source, target_turns=c.target_turns)
            for c in answered]


def _kept(records: list[dict]) -> list[Conversation]:
    return [parse_record(r) for r in records if "dropped" not in r]


def load_written(out: Path) -> list[Conversation]:
    """The prompt records ``write_turns`` kept in ``out`` (none when it does not exist yet)."""
    records = whole_records(out)
    convs = _kept(records)
    if records:
        note(f"{len(convs)} of {len(records)} user turns the target wrote are kept in {out.name}")
    return convs
