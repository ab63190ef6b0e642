"""``eaglet doctor``: every link between training and serving checked, with evidence.

Order of work: the contract (files only); the target's greedy answers to a few prompts;
one speculative run of the engine on them (a chain, features recorded); the trainer's
features for the same tokens. Checks 2-4 compare those; 5 judges the serving settings;
6 runs the tensor-parallel comparison when asked. A draft that cannot run on the target
(check 1 says why) skips 2-4.
"""

from __future__ import annotations

import sys
import time

from eaglet.capture import CaptureSpec
from eaglet.doctor import contract as contract_check
from eaglet.doctor.config import DoctorConfig
from eaglet.doctor.head import HeadComparison, compare_heads
from eaglet.doctor.online import TITLE as ONLINE
from eaglet.doctor.online import check_online
from eaglet.doctor.parity import TITLE as PARITY
from eaglet.doctor.parity import check_parity
from eaglet.doctor.report import FAIL, Check, Report, skipped
from eaglet.doctor.samples import answer_data, make_samples, select_points, training_features
from eaglet.doctor.search import TITLE as SEARCH
from eaglet.doctor.search import candidates, check_search, needed_points
from eaglet.doctor.serving import serve_chain
from eaglet.doctor.settings import chain_steps, check_settings, sampled_acceptance
from eaglet.doctor.tp import check_tp
from eaglet.errors import EagletError
from eaglet.generate import context_size
from eaglet.loading.target import load_target
from eaglet.speculative.load import load_engine_draft, resolve_draft


def note(msg: str) -> None:
    print(f"eaglet: doctor: {msg}", file=sys.stderr, flush=True)


def serve_tokens(cfg: DoctorConfig) -> int:
    return min(cfg.max_new_tokens, cfg.serve_tokens)


def _failed(number: int, title: str, err: EagletError) -> Check:
    chk = Check(number, title)
    chk.flag(FAIL, str(err))
    chk.summary = "could not run"
    return chk


def _draft_checks(target, draft, draft_path, spec: CaptureSpec, con, cfg: DoctorConfig, samples, steps: int,
                  capacity: int, log) -> tuple[list[Check], tuple[float, float] | None, HeadComparison | EagletError]:
    """Checks 2-4 (and check 5's sampling estimate and served head), which run the draft."""
    tc, checks = target.config, []
    training = (con.config.get("eaglet") or {}).get("training") or {}
    try:
        log(f"speculative run: a chain of {steps} draft tokens, draft inputs recorded")
        run = serve_chain(target, draft, samples.prompts, steps, serve_tokens(cfg), capacity)
    except EagletError as e:
        run = None
        checks.append(_failed(2, PARITY, e))
    if run is not None:
        log("capture parity")
        run_inp = training_features(target, spec, draft, answer_data(run.prompts, run.completions))
        checks.append(check_parity(target, draft, spec, run, run_inp, con.features, cfg.num_prompts))
    cands = candidates(spec, "declared" if con.declared is not None else "assumed", con.alternatives)
    captured = needed_points(cands)
    log(f"scoring {len(cands)} capture-point sets")
    inp = training_features(target, CaptureSpec(captured, tc.num_layers), draft, samples.token_data())
    checks.append(check_search(draft, inp, captured, tc.hidden_size, samples.prompt_lens, cands))
    if run is None:
        checks.append(skipped(4, ONLINE, "the speculative run failed (see check 2)"))
    else:
        plain = [a[: serve_tokens(cfg)] for a in samples.answers]
        checks.append(check_online(draft, run_inp.aux, run_inp, run, steps, plain, training.get("val")))
    aux = select_points(inp.aux, captured, spec.points, tc.hidden_size)
    sampled = None
    if not cfg.sampling.greedy:
        sampled = sampled_acceptance(draft, aux, inp, samples.prompt_lens, cfg.sampling)
    try:  # the head as the engine serves it (check 5)
        served = load_engine_draft(draft_path, target, cfg.draft_vocab, cfg.int8_head, cfg.extend_vocab,
                                   cfg.int8_layer)
        head = compare_heads(draft, served, aux, inp, samples.prompt_lens, steps)
    except EagletError as e:
        head = e
    return checks, sampled, head


def run_doctor(cfg: DoctorConfig, log=note) -> Report:
    start = time.perf_counter()
    log(f"loading {cfg.target}")
    target = load_target(cfg.target, dtype=cfg.torch_dtype, device=cfg.device)
    draft_path = resolve_draft(cfg.draft, target)
    if draft_path is None:
        why = "the doctor checks a draft" if cfg.draft == "none" else f"no default draft ships for {cfg.target}"
        raise EagletError(f"{why}; pass --draft DIR")
    tc = target.config
    con = contract_check.check_contract(target, draft_path, cfg.features, cfg.torch_dtype, cfg.device)
    draft, spec = con.draft, con.assumed
    checks = [con.check]
    try:
        capacity = context_size(target, cfg.max_context)
    except EagletError:  # check 5 reports it; the doctor's own runs use the default context
        capacity = context_size(target, None)
    samples = None
    if draft is not None or (cfg.tp or 1) > 1:
        log(f"the target answers {cfg.num_prompts} prompts ({cfg.max_new_tokens} new tokens, greedy)")
        samples = make_samples(target, cfg.prompts, cfg.num_prompts, cfg.max_new_tokens, capacity)
    steps = chain_steps(cfg, target.model.embed.weight.device.type)
    sampled = head = None
    if draft is None:
        why = "the draft cannot run on this target (see check 1)"
        checks += [skipped(2, PARITY, why), skipped(3, SEARCH, why), skipped(4, ONLINE, why)]
    else:
        more, sampled, head = _draft_checks(target, draft, draft_path, spec, con, cfg, samples, steps, capacity, log)
        checks += more
    trained_steps = ((con.config.get("eaglet") or {}).get("training") or {}).get("ttt_steps")
    shortest = min(map(len, samples.prompts)) if samples else None
    checks.append(check_settings(target, draft, cfg, shortest, sampled, trained_steps, head))
    if cfg.tp and cfg.tp > 1:
        log(f"tensor parallelism: tp={cfg.tp} against tp=1")
    checks.append(check_tp(cfg.target, cfg.tp, samples.prompts if samples else [], spec.points if spec else None,
                           cfg.torch_dtype, cfg.device, cfg.tp_timeout_s))
    header = {"target": str(cfg.target), "target_layers": tc.num_layers, "target_hidden": tc.hidden_size,
              "draft": str(draft_path), "prompts": len(samples.prompts) if samples else 0,
              "prompt_sources": samples.labels if samples else [],
              "max_new_tokens": cfg.max_new_tokens, "serve_tokens": serve_tokens(cfg), "device": cfg.device,
              "dtype": cfg.dtype, "chain_steps": steps}
    return Report(header, checks, time.perf_counter() - start)
