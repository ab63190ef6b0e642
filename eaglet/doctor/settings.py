"""Check 5, engine settings: would the engine run this tree, and can it pay off?

- The tree flags are validated by the engine itself (``SpecEngine``, i.e. ``TreeConfig``
  and the draft-vocabulary bound): all three or none, ``topk=1`` means a chain of
  ``num_steps + 1`` nodes, no more nodes than the growth reaches. An inconsistency fails
  with the engine's own sentence naming the values; nothing is silently overridden.
- The tree against what verification can take: a verify of ``num_draft_tokens`` nodes
  after the shortest prompt must fit in the context (``--max-context``) or the check
  fails. Above ``MAX_NODES`` nodes (CPU 16, CUDA 64) it warns: measured on the 2-core
  CPU, a 32-node verify of SmolLM2 costs 2.7 plain steps, and on an H200 a 64-node
  verify 1.4; beyond that the target is compute-bound, a verify costs about as many
  plain steps as it has nodes, and no accept length pays it back.
- ``num_steps`` beyond the steps the draft was trained to unroll (its config records
  them) is a warning: those steps never saw a training signal.
- The draft as the engine serves it (on a CPU its LM head, fc and layer in int8, or the head
  cut to the most frequent tokens; ``eaglet.doctor.head``) against the trained draft: a predicted accept length more
  than ``TAU_DROP`` (0.1) lower warns; a serving setting the engine refuses fails.
- Sampling: at temperature ``T > 0`` a draft token is accepted with probability
  ``sum_x min(p(x), q(x))`` (target ``p``, draft ``q``, both after temperature, top-k,
  top-p). This is measured for draft step 0 on the doctor's answers (over the draft
  vocabulary) and compared with greedy agreement: a warning when sampling keeps less
  than ``SAMPLED_KEEP`` (half) of it, or when ``T >= HOT`` (1.5), where the target's
  distribution is so flat that speculation rarely pays.
"""

from __future__ import annotations

import torch

from eaglet.doctor.config import DoctorConfig
from eaglet.doctor.head import TAU_DROP, HeadComparison
from eaglet.doctor.report import FAIL, WARN, Check
from eaglet.doctor.samples import anchors
from eaglet.errors import EagletError
from eaglet.generate import context_size
from eaglet.loading.target import Target
from eaglet.sampling import SamplingParams, probs
from eaglet.speculative.engine import SpecEngine
from eaglet.speculative.policy import default_ladder
from eaglet.speculative.tree import TreeConfig
from eaglet.train.inputs import StepInputs
from eaglet.train.ttt import TTTLoss

TITLE = "engine settings"
MAX_NODES = {"cpu": 16, "cuda": 64}
HOT = 1.5
SAMPLED_KEEP = 0.5


def chain_steps(cfg: DoctorConfig, device_type: str) -> int:
    """Draft steps of the chain checks 2 and 4 run: --num-steps, else the automatic tree's depth."""
    if isinstance(cfg.num_steps, int) and cfg.num_steps >= 1:
        return cfg.num_steps
    return default_ladder(device_type, 1)[0].num_steps


@torch.inference_mode()
def sampled_acceptance(draft, aux: torch.Tensor, inp: StepInputs, prompt_lens: torch.Tensor,
                       params: SamplingParams, chunk: int = 64) -> tuple[float, float]:
    """(mean sum_x min(p, q) at draft step 0 under ``params``, greedy agreement), over the draft vocabulary."""
    out = TTTLoss(draft, 1).unroll(aux, inp.emb)[0]
    rows, cols = anchors(inp, prompt_lens, 0).nonzero(as_tuple=True)
    vocab = draft.config.vocab_size
    draft_ids = draft.vocab_ids()  # [Vd] in the draft's order, as target_logp's columns (Featurizer)
    overlap, agree = 0.0, 0
    for i in range(0, rows.numel(), chunk):
        r, c = rows[i: i + chunk], cols[i: i + chunk]
        logits = draft.logits(out[r, c]).float()  # [n, Vd]
        q = torch.zeros(r.numel(), vocab, device=aux.device).index_add_(1, draft_ids, probs(logits, params))
        p = torch.zeros_like(q).index_add_(1, draft_ids, probs(inp.target_logp[r, c + 1], params))
        overlap += torch.minimum(p, q).sum().item()
        agree += int((draft_ids[logits.argmax(-1)] == inp.target_top[r, c + 1]).sum())
    n = max(rows.numel(), 1)
    return overlap / n, agree / n


def served_head(chk: Check, head: HeadComparison | EagletError | None, ev: dict) -> None:
    """Check 5's lines on the draft as the engine serves it, head and layer (``eaglet.doctor.head``)."""
    if isinstance(head, EagletError):
        chk.flag(FAIL, str(head))
        return
    if head is None:
        return
    if head.same_as_trained:
        chk.lines.append(f"served head: {head.served}, as trained")
        ev["head"] = {"served": head.served, "same_as_trained": True}
        return
    ev["head"] = {"served": head.served, "same_as_trained": False, "acc_trained": head.acc_trained,
                  "acc_served": head.acc_served, "same_top1": head.same_top1, "anchors": head.anchors,
                  "tau_trained": head.tau_trained, "tau_served": head.tau_served}
    chk.lines.append(f"served head: {head.served}")
    chk.lines.append(f"served head: step-0 proposal as trained at {head.same_top1[0]:.1%} of {head.anchors} anchors")
    chk.lines.append(f"served head: predicted accept length {head.tau_served:.2f}, {head.tau_trained:.2f} as trained "
                     f"(chain of {len(head.acc_served)}, check 3's answers)")
    if head.tau_trained - head.tau_served > TAU_DROP:
        chk.flag(WARN, f"served as {head.served}, the draft proposes the target's token less often than "
                       f"as trained: predicted accept length {head.tau_served:.2f} against {head.tau_trained:.2f}; "
                       "serve it otherwise (--draft-vocab, --int8-draft-head / --no-int8-draft-head, "
                       "--no-int8-draft-layer)")


def check_settings(target: Target, draft, cfg: DoctorConfig, shortest_prompt: int | None,
                   sampled: tuple[float, float] | None, trained_steps: int | None,
                   head: HeadComparison | EagletError | None = None) -> Check:
    chk = Check(5, TITLE)
    dev = target.model.embed.weight.device.type
    given = cfg.tree_flags
    trees: list[TreeConfig] = []
    how = "as given"
    if all(v is None for v in given.values()):
        trees, how = default_ladder(dev, 1), f"automatic for {dev} batch 1"
    elif any(v is None for v in given.values()):
        missing = ", ".join(k for k, v in given.items() if v is None)
        chk.flag(FAIL, f"set all of --num-steps, --tree-topk and --num-draft-tokens, or none of them (automatic); "
                       f"missing: {missing}")
    else:
        try:
            trees = [TreeConfig(cfg.num_steps, cfg.topk, cfg.num_draft_tokens)]
        except EagletError as e:
            chk.flag(FAIL, str(e))
    if draft is not None and trees:
        try:  # the engine's own checks on top of TreeConfig's (draft vocabulary, context)
            SpecEngine(target, draft, cfg.max_context, cfg.num_steps, cfg.topk, cfg.num_draft_tokens,
                       use_graphs=False, log=lambda _m: None)
        except EagletError as e:
            chk.flag(FAIL, str(e))
    try:
        capacity = context_size(target, cfg.max_context)
    except EagletError as e:
        chk.flag(FAIL, str(e))
        capacity = None
    ev: dict = {"trees": [t.describe() for t in trees], "how": how, "capacity": capacity,
                "trained_steps": trained_steps, "sampling": vars(cfg.sampling)}
    if trees:
        t = trees[0]
        chk.lines.append(f"tree {t.describe()} ({how}); context {capacity}")
        if capacity is not None and shortest_prompt is not None and shortest_prompt + t.num_draft_tokens > capacity:
            chk.flag(FAIL, f"a verify of num_draft_tokens={t.num_draft_tokens} nodes after the shortest prompt "
                           f"({shortest_prompt} tokens) needs {shortest_prompt + t.num_draft_tokens} positions; "
                           f"the context holds {capacity} (--max-context)")
        limit = MAX_NODES.get(dev, MAX_NODES["cuda"])
        if t.num_draft_tokens > limit:
            chk.flag(WARN, f"num_draft_tokens={t.num_draft_tokens} is more than a {dev} verify can take at the "
                           f"cost of a few plain steps (~{limit} nodes); such a tree cannot pay off")
        if trained_steps is not None and t.num_steps > trained_steps:
            chk.flag(WARN, f"num_steps={t.num_steps} exceeds the {trained_steps} steps the draft was trained to "
                           f"unroll: steps {trained_steps}..{t.num_steps - 1} never saw a training signal")
    served_head(chk, head, ev)
    p = cfg.sampling
    if p.greedy:
        chk.lines.append("sampling: greedy (acceptance is the draft's agreement with the target's argmax)")
    else:
        desc = f"temperature {p.temperature}, top_p {p.top_p}, top_k {p.top_k}"
        if sampled is not None:
            ev.update(sampled_acceptance=sampled[0], greedy_agreement=sampled[1])
            chk.lines.append(f"sampling: {desc}; draft step 0 accepted with probability {sampled[0]:.3f} "
                             f"(greedy agreement {sampled[1]:.3f})")
            if sampled[1] >= 0.1 and sampled[0] < SAMPLED_KEEP * sampled[1]:
                chk.flag(WARN, f"at {desc} a draft token is accepted with probability {sampled[0]:.3f}, against "
                               f"{sampled[1]:.3f} greedy: these settings spend most of the speculation")
        else:
            chk.lines.append(f"sampling: {desc}")
        if p.temperature >= HOT:
            chk.flag(WARN, f"temperature {p.temperature} flattens the target's distribution so far that draft "
                           "tokens are rarely accepted; speculation is unlikely to pay")
    chk.evidence = ev
    chk.summary = "the engine accepts these settings" if chk.status != FAIL else "the engine refuses these settings"
    return chk
