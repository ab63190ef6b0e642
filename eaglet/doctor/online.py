"""Check 4, offline against online: does serving accept what the draft's accuracy promises?

Offline: the draft unrolled ``num_steps`` steps exactly as in training (teacher-forced,
the trainer's Featurizer on the same tokens) gives acc_j over all answer positions, and
``tau_pred = 1 + sum_i prod_{j<=i} acc_j`` (``predicted_accept_length``), the number
training reports. Online: the engine decodes the prompts greedily with a chain of
``num_steps`` draft tokens (topk=1, no fallback to plain decoding); the mean of its
accept lengths is the measured tau.

The two count different anchors: verifies cluster where the draft fails (a miss leaves
the next verify one token on), so a correct pipeline can measure a few percent below
``tau_pred``. So the comparison that judges is made on the anchors serving verified:
for each verify at anchor ``t``, teacher forcing predicts a chain of
``1 + (leading hits of steps 0, 1, ... at t)`` tokens. With the same features, draft
weights and tokens, that *is* the engine's greedy accept length, verify by verify; the
per-verify agreement is reported.

Thresholds. The speculative gain is ``tau - 1``. The check fails when the measured gain
is below ``FAIL_GAIN`` (60%) of the gain predicted on the same anchors and the gap is at
least ``FAIL_GAP`` (0.25 tokens per verify); it warns below ``WARN_GAIN`` (80%) with a
gap of at least ``WARN_GAP`` (0.15), or when fewer than ``AGREE`` (95%) of the verifies
accept exactly the predicted length (float near-ties flip a few; a wrong feature flips
many). A draft step "loses" when, over the verifies whose chain reached it both offline
and online (at least ``MIN_REACHED``), online accepts its token ``STEP_DROP`` (0.15) less
often than teacher forcing predicts. A ``tau_pred`` below ``USELESS`` (1.1) is a warning
on its own: such a draft cannot make decoding faster. The accuracies training recorded
on its validation data are shown for context only: they come from other prompts.
"""

from __future__ import annotations

import torch

from eaglet.doctor.report import FAIL, WARN, Check
from eaglet.doctor.samples import anchors, hit_grids
from eaglet.doctor.serving import ServingRun
from eaglet.train.inputs import StepInputs
from eaglet.train.report import acc_keys
from eaglet.train.ttt import SERVE_WINDOW, predicted_accept_length

TITLE = "offline vs online"
FAIL_GAIN, FAIL_GAP = 0.6, 0.25
WARN_GAIN, WARN_GAP = 0.8, 0.15
AGREE = 0.95
STEP_DROP, MIN_REACHED = 0.15, 5
USELESS = 1.1


def replay(grids: list[torch.Tensor], run: ServingRun) -> list[tuple[int, int]]:
    """(measured, predicted) accept length of every verify whose whole chain lies within the known tokens."""
    steps = len(grids)
    out = []
    for b, lengths in enumerate(run.accept_lengths):
        t, n = len(run.prompts[b]) - 1, len(run.prompts[b]) + len(run.completions[b])
        for a in lengths:
            if t + steps < n:  # labels of every step known
                lead = 0
                while lead < steps and grids[lead][b, t]:
                    lead += 1
                out.append((a, 1 + lead))
            t += a
    return out


def _step_rates(pairs: list[tuple[int, int]], steps: int) -> list[dict]:
    """Per draft step, over verifies that reached it both ways: online and offline acceptance."""
    rows = []
    for j in range(steps):
        both = [(a > j + 1, p > j + 1) for a, p in pairs if a > j and p > j]
        n = len(both)
        rows.append({"reached": n, "online": sum(o for o, _ in both) / n if n else None,
                     "offline": sum(f for _, f in both) / n if n else None})
    return rows


def check_online(draft, aux: torch.Tensor, inp: StepInputs, run: ServingRun, steps: int,
                 plain_answers: list[list[int]], recorded: dict | None) -> Check:
    """``inp``/``aux``: the trainer's features for the serving run's own tokens (prompt + completion)."""
    chk = Check(4, TITLE)
    prompt_lens = torch.tensor([len(p) for p in run.prompts])
    grids = hit_grids(draft, aux, inp, prompt_lens, steps)
    acc = [float(g[anchors(inp, prompt_lens, j).cpu()].float().mean()) if g.numel() else 0.0
           for j, g in enumerate(grids)]
    tau_pred = predicted_accept_length(acc)
    lengths = [a for row in run.accept_lengths for a in row]
    tau = sum(lengths) / len(lengths) if lengths else 1.0
    pairs = replay(grids, run)
    n = max(len(pairs), 1)
    tau_same = sum(p for _, p in pairs) / n if pairs else tau_pred
    tau_meas_same = sum(a for a, _ in pairs) / n if pairs else tau
    agree = sum(a == p for a, p in pairs) / n
    rates = _step_rates(pairs, steps)
    same = sum(a == b for a, b in zip(run.completions, plain_answers))
    chk.evidence = {"num_steps": steps, "acc": acc, "tau_pred": tau_pred, "tau_measured": tau,
                    "verifies": len(lengths), "replayed": len(pairs), "tau_pred_same_anchors": tau_same,
                    "tau_measured_same_anchors": tau_meas_same, "agreement": agree, "steps": rates,
                    "identical_to_plain": same, "prompts": len(plain_answers), "tree": run.tree}
    chk.lines.append(f"{'draft step':26}" + "".join(f"{j:>7}" for j in range(steps)))
    chk.lines.append(f"{'acc_j (all answer tokens)':26}" + "".join(f"{a:7.3f}" for a in acc))
    for key, label in (("offline", "offline, verified anchors"), ("online", "online, same verifies")):
        chk.lines.append(f"{label:26}" + "".join(f"{r[key]:7.3f}" if r[key] is not None else f"{'-':>7}"
                                                 for r in rates))
    chk.lines.append(f"{'verifies reaching it':26}" + "".join(f"{r['reached']:7d}" for r in rates))
    chk.lines.append(f"same accept length offline and online: {agree:.1%} of {len(pairs)} verifies")
    if recorded:
        keys = acc_keys(recorded)
        chk.lines.append(f"recorded at training (val, draft-vocabulary tokens only): acc "
                         f"{' '.join(f'{recorded[k]:.3f}' for k in keys)}, tau_pred "
                         f"{recorded.get('tau_pred', float('nan')):.2f}")
        if "tau_all" in recorded:  # drafts trained since tau_all exists
            chk.lines.append(f"recorded at training (val, all answer tokens): acc_0 {recorded['acc_all_0']:.3f}, "
                             f"tau {recorded['tau_all']:.2f}")
        if "tau_serve" in recorded:  # drafts trained since the serving window exists
            chk.lines.append(f"recorded at training (val, first {SERVE_WINDOW} tokens of each answer): acc_0 "
                             f"{recorded['acc_serve_0']:.3f}, tau {recorded['tau_serve']:.2f}")
        chk.evidence["recorded_val"] = recorded
    gain, gain_pred, gap = tau_meas_same - 1, tau_same - 1, tau_same - tau_meas_same
    losing = [j for j, r in enumerate(rates) if r["reached"] >= MIN_REACHED and r["online"] < r["offline"] - STEP_DROP]
    chk.evidence["losing_steps"] = losing
    where = ("; lost at draft step" + ("s " if len(losing) > 1 else " ") + ", ".join(
        f"{j} ({rates[j]['online']:.2f} online vs {rates[j]['offline']:.2f} offline)" for j in losing)) \
        if losing else ""
    said = f"tau {tau_meas_same:.2f} measured vs {tau_same:.2f} predicted on the same {len(pairs)} verifies"
    if gain < FAIL_GAIN * gain_pred and gap >= FAIL_GAP:
        chk.flag(FAIL, f"serving accepts far less than the draft's accuracy predicts: {said}{where}")
    elif gain < WARN_GAIN * gain_pred and gap >= WARN_GAP:
        chk.flag(WARN, f"serving accepts less than the draft's accuracy predicts: {said}{where}")
    elif pairs and agree < AGREE:
        chk.flag(WARN, f"only {agree:.1%} of verifies accept the length teacher forcing predicts{where}")
    if tau_pred < USELESS:
        chk.flag(WARN, f"tau_pred {tau_pred:.2f} with {steps} draft steps: this draft cannot make decoding faster "
                       "(untrained, or trained for another target or points)")
    if same < len(plain_answers):
        chk.flag(WARN, f"greedy speculative output differs from plain greedy decoding on "
                       f"{len(plain_answers) - same} of {len(plain_answers)} prompts (float near-ties, or a bug)")
    chk.summary = (f"tau {tau:.2f} measured, {tau_same:.2f} predicted ({tau_pred:.2f} from acc_j), chain of {steps}, "
                   f"{len(lengths)} verifies")
    return chk
