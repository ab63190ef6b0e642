"""Regeneration on the local target: one running batch whose finished rows are refilled at once.

A batch decoded to its end runs until its longest answer ends, while answers run from a few
tokens to ``max_new_tokens``: most rows idle. Here a ``Session`` keeps ``rows`` rows busy: after
every step the finished rows are released (their answers handed on); once a sixteenth of the rows
is free (or none runs) the next prompts are prefilled into every free row in one forward, wherever
the rows lie (``Session.admit``), so a step's few finished rows do not each cost a prefill.

A ``Refill`` serves every stage of a run (``sources.answer_sources``: validation, training, second
turns, sampled answers): one generator whose KV capacity comes from the run's settings
(``max_prompt_tokens`` + ``max_new_tokens``), not from a stage's longest prompt, and one session per
batch size, every stage taking the run's batch under CUDA graphs. On CUDA a decode chunk is compiled
(torch.compile) and captured per shape, so the run pays that once (per sampling rule: the greedy chunk,
then the sampled one at the first sampled answer) instead of once per stage; on CPU it runs the plain step.

Each answer draws from its own generator (``Draws``: the run's seed and the answer's id), so a
sampled answer does not depend on the row or the company it lands in; a resumed run writes the
answers an uninterrupted one would have, up to floating-point rounding: a row's logits can move
in the last bits with the rows beside it (padding, kernel choice), which in a near-tie changes
a token. Greedy answers are the target's greedy output (``PlainGenerator.generate``).
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from eaglet.data.prompts import Conversation, note
from eaglet.detokenize import decode_many
from eaglet.errors import EagletError
from eaglet.generate import PlainGenerator, cache_slots
from eaglet.loading.target import Target
from eaglet.sampling import SamplingParams
from eaglet.session import Draws, Session, admission_size, bucket_size

CAPACITY_STEP = 256  # the KV capacity is rounded up to this
ADMIT_WAIT = 16  # admit once batch/ADMIT_WAIT rows are free (or none runs): fewer, larger prefills
PREFILL_TOKENS = 131072  # an admission of long prompts is split until its padded prefill fits this
# Admissions as eager forwards, not the prefill graphs (``prefill.PrefillGraphs``, made for a server's
# one-row admissions): at batch 512 on an H200 they admit tens of rows at a time, where one forward's
# launches are shared by every row, and the graphs' buckets padded 41% more tokens and kept capturing
# new ones: 39.4k new tokens/s graphed against 50.7k eager (docs/performance.md, session 11).
GRAPHED_PREFILL = False
# Rows when the run names none (``auto_rows``). An H200 with SmolLM2 (bf16, 256 new tokens, eager
# admissions) gave 50.7k new tokens/s at 512 rows, 62.0k at 1,024, 69.5k at 2,048; larger is unmeasured.
MAX_ROWS = 2048
CPU_ROWS = 256  # a CPU's step costs in proportion to its rows: more only delays the first answers
MEMORY_SHARE = 0.6  # of the device's free memory, for the batch's KV cache and logits


@dataclass(frozen=True)
class Job:
    """One answer to write: the conversation (its id is the answer's id), its templated prompt, its setting."""

    conv: Conversation
    prompt: list[int]
    temperature: float  # 0 = greedy
    seed: int  # the answer's own draws


@dataclass(frozen=True)
class Answer:
    job: Job
    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int
    answer_ids: list[int] | None  # the target's own token ids; None when a server answered


def capacity(target: Target, longest: int, max_new_tokens: int) -> int:
    """KV slots for ``longest`` prompt tokens plus the answer, rounded up to CAPACITY_STEP and capped at the
    window (an answer to a prompt near the window's end is cut there; none fits when this is <= longest)."""
    return min(target.config.context_window, -(-(longest + max_new_tokens + 1) // CAPACITY_STEP) * CAPACITY_STEP)


def auto_rows(target: Target, max_prompt_tokens: int, max_new_tokens: int) -> int:
    """Rows of a run that names none (said): on a GPU the largest power of two, at most MAX_ROWS, whose KV
    cache at the run's capacity and float32 logits fit MEMORY_SHARE of the free memory; elsewhere CPU_ROWS."""
    on_gpu = target.model.embed.weight.device.type == "cuda"
    rows = rows_fitting(target, capacity(target, max_prompt_tokens, max_new_tokens), MAX_ROWS) if on_gpu else CPU_ROWS
    why = "from the free GPU memory" if on_gpu else "the CPU's default"
    note(f"decoding up to {rows} rows at a time ({why}; --batch-size sets it)")
    return rows


def rows_fitting(target: Target, slots: int, most: int) -> int:
    """At most ``most`` rows: on a GPU the largest power of two whose KV cache of ``slots`` slots and float32
    logits fit MEMORY_SHARE of the memory free now, less ``prefill_reserve`` (an admission's transient).

    Free is the driver's after ``empty_cache``: the allocator's unused blocks go back first, so an earlier
    stage's freed cache counts, and a live one (such as ``Refill``'s) does not. Blocks it keeps (part of a
    segment still in use) are not counted: without expandable segments they are fragments, which cannot
    hold one layer's cache of hundreds of rows (counting them sized a cache larger than could be allocated).
    """
    device = target.model.embed.weight.device
    if device.type != "cuda":
        return most
    # the cache a PlainGenerator of capacity ``slots`` allocates, + logits and softmax
    per_row = target.model.new_cache(1, 1).nbytes() * cache_slots(slots) + 2 * 4 * target.config.vocab_size
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info(device)[0] - prefill_reserve(target, slots)
    return min(most, fitting_rows(max(free, 0), per_row))


def prefill_reserve(target: Target, slots: int) -> int:
    """Bytes of one admission's attention scores, float32: an eager prefill of PREFILL_TOKENS padded tokens
    over at most ``slots`` slots (SDPA's math path materializes them; a stage admitting all its rows in one
    forward asked 21.96 GiB at 512 rows and 87.83 GiB at 2,048 on an H200). Since session 23 a Llama-family
    admission into empty rows runs SDPA's causal kernels with no mask and materializes none (``AttnMeta.
    from_empty``); MLA's dense path still does, so the reserve stays."""
    return PREFILL_TOKENS * slots * target.config.num_heads * 4


def release_memory() -> None:
    """After a stage has dropped its generator: collect what only cycles still hold (a captured chunk and its
    closure), then hand the allocator's unused blocks back, before the next stage sizes its rows."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def fitting_rows(free: int, per_row: int) -> int:
    """The largest power of two of rows, 1 to MAX_ROWS, of ``per_row`` bytes each within MEMORY_SHARE of ``free``."""
    fit = max(1, int(MEMORY_SHARE * free) // per_row)
    return min(MAX_ROWS, 1 << (fit.bit_length() - 1))


def stage_batch(rows: int, jobs: int, graphs: bool) -> int:
    """The batch a stage of ``jobs`` answers runs. Under CUDA graphs the run's bucket whatever the stage's
    size: each batch size is a compile and a capture, which cost more than a short stage's idle rows.
    Eagerly nothing is built per size, so a stage shorter than the batch computes only its own rows."""
    return bucket_size(rows, graphs) if graphs else min(rows, jobs)


class Refill:
    """The local target answering the jobs of one run's stages, ``rows`` rows at a time, at ``params``'s
    top-p and top-k (a job's temperature and seed are its own)."""

    def __init__(self, target: Target, rows: int, max_prompt_tokens: int, params: SamplingParams):
        self.target, self.rows, self.params = target, rows, params
        # Every prompt the run admits has at most max_prompt_tokens (``regenerate`` skips longer ones), so
        # one capacity holds every stage's answers, each to the limit a capacity of its own would give it.
        self.gen = PlainGenerator(target, capacity(target, max_prompt_tokens, params.max_new_tokens),
                                  bucketed_prefill=GRAPHED_PREFILL)
        # batch -> its session, reused by every stage of that batch: a stage returns with every row released
        # (an exception out of ``done`` ends the run).
        self.sessions: dict[int, Session] = {}

    def answer(self, jobs: list[Job], admitting: Callable[[], bool], done: Callable[[list[Answer]], None]
               ) -> None:
        """Answer ``jobs`` in order with a batch of ``rows`` rows refilled as rows finish.

        ``admitting()`` is asked before each admission while jobs wait; once False, no job is admitted
        again and the rows in flight finish. ``done(answers)`` receives the answers finished by each
        admission or step (often none), while the next step runs on the device: it may raise to stop the
        run (Ctrl-C), dropping the rows in flight.
        """
        if not jobs:
            return
        longest = max(len(j.prompt) for j in jobs)
        if self.gen.capacity <= longest:
            raise EagletError(f"a prompt of {longest} tokens leaves no room in the model's {self.gen.capacity}-token "
                              "window; lower --max-prompt-tokens")
        session = self._session(stage_batch(self.rows, len(jobs), self.gen.use_graphs))
        queue, owner = deque(jobs), {}
        min_free = max(1, session.batch // ADMIT_WAIT)
        with torch.inference_mode():
            while True:
                free = len(session.free_rows())
                if queue and free and (free >= min(min_free, len(queue)) or not session.running()):
                    if admitting():
                        _admit(session, queue, owner, self.params)
                    else:
                        queue.clear()  # the budget ended: the rows in flight finish, nothing joins them
                finished = [i for i in owner if session.rows[i].done]
                ended = [owner.pop(i) for i in finished], [session.release(i) for i in finished]
                if not session.running():
                    done(_answers(self.target, *ended))
                    if not queue:
                        return
                    continue
                # Decoded and written while the device runs the step: the host's work off the GPU's path.
                session.step(launched=lambda ended=ended: done(_answers(self.target, *ended)))

    def trim(self) -> None:
        """Free the sessions' admission scratch caches (``Landing``: one per power-of-two count of rows, grown
        to the longest prompt each held; allocated again on need), so that a stage sizing a cache of its own
        beside this one counts that memory (``rows_fitting`` hands the freed blocks back before it reads the
        free memory). The sessions' caches, which their captured steps read, stay."""
        for session in self.sessions.values():
            session.landing.scratch.clear()

    def _session(self, batch: int) -> Session:
        if batch not in self.sessions:
            self.sessions[batch] = self.gen.session(batch, self.params, own_draws=True)
        return self.sessions[batch]


def _admit(session: Session, queue: deque, owner: dict[int, Job], params: SamplingParams) -> None:
    """Prefill waiting jobs into every free row, in one forward (split while the padded prefill exceeds
    PREFILL_TOKENS)."""
    free = session.free_rows()
    while free and queue:
        n = admission_size([len(queue[i].prompt) for i in range(min(len(free), len(queue)))], PREFILL_TOKENS)
        take, rows, free = [queue.popleft() for _ in range(n)], free[:n], free[n:]
        session.admit(rows, [j.prompt for j in take], params, [Draws(j.seed, j.temperature) for j in take])
        owner.update(zip(rows, take))


def _answers(target: Target, jobs: list[Job], outs: list) -> list[Answer]:
    # One batched decode: a thousand answers a second finish at 2,048 rows, each decoded on the host
    # while the GPU waits for the next step.
    texts = decode_many(target.tokenizer, [o.tokens for o in outs])
    return [Answer(j, text, o.finish_reason, len(j.prompt), len(o.tokens), o.tokens)
            for j, text, o in zip(jobs, texts, outs)]
