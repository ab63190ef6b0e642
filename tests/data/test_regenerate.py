"""Regeneration: the target answers its prompts; an interrupted run resumes without losing or repeating work."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from eaglet.chat import encode_chat
from eaglet.cli import main
from eaglet.data import refill
from eaglet.data.prompts import read_jsonl
from eaglet.data.regenerate import claim_output, meta_path, regen_settings, regenerate
from eaglet.data.template import tokenize_conversations
from eaglet.errors import EagletError
from eaglet.generate import PlainGenerator
from eaglet.sampling import SamplingParams
from eaglet.session import Session
from tests.train.helpers import prompts, write_jsonl

PARAMS = SamplingParams(max_new_tokens=12)


def test_answers_are_the_targets_greedy_output(tiny_target, tmp_path):
    ps = prompts(10, seed=1, split="train")
    out = tmp_path / "r.jsonl"
    stats = regenerate(tiny_target, ps, out, PARAMS, batch_size=4, progress=False)
    assert stats.written == 10 and stats.done_before == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in recs) == sorted(p.id for p in ps)
    by_id = {r["id"]: r for r in recs}
    p = ps[3]
    ids = encode_chat(tiny_target.tokenizer, p.prompt())
    [alone] = PlainGenerator(tiny_target, 128).generate([ids], PARAMS)
    rec = by_id[p.id]
    assert rec["messages"][:-1] == p.prompt() and rec["messages"][-1]["role"] == "assistant"
    assert rec["messages"][-1]["content"] == tiny_target.tokenizer.decode(alone.tokens, skip_special_tokens=True)
    assert rec["split"] == "train" and rec["finish_reason"] == alone.finish_reason
    assert rec["answer_ids"] == alone.tokens  # the target's own ids, not a re-encoding of the text
    convs, bad = read_jsonl(out)  # the output is valid training data
    assert bad == 0 and all(c.has_answer for c in convs)
    # ... and training reads exactly the sequence the target produced: prompt ids, then the answer ids.
    eos = {tiny_target.tokenizer.eos_token_id}
    [t] = tokenize_conversations(tiny_target.tokenizer, [c for c in convs if c.id == p.id], eos)
    assert t.ids[: len(ids) + len(alone.tokens)] == ids + alone.tokens


def test_resume_skips_finished_and_repairs_a_torn_line(tiny_target, tmp_path):
    ps = prompts(12, seed=2)
    out = tmp_path / "r.jsonl"
    first = regenerate(tiny_target, ps[:5], out, PARAMS, batch_size=4, progress=False)
    assert first.written == 5
    with open(out, "a") as fh:  # a crash in the middle of a write
        fh.write('{"id": "p2-7", "messages": [{"role": "us')
    again = regenerate(tiny_target, ps, out, PARAMS, batch_size=4, progress=False)
    assert again.done_before == 5 and again.written == 7
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(p.id for p in ps)  # every prompt exactly once
    assert regenerate(tiny_target, ps, out, PARAMS, progress=False).written == 0


def test_deadline_stops_between_batches_and_too_long_prompts_are_counted(tiny_target, tmp_path):
    ps = prompts(6, seed=3)
    out = tmp_path / "r.jsonl"
    stats = regenerate(tiny_target, ps, out, PARAMS, batch_size=2, stop_when=lambda _: True, progress=False)
    assert stats.stopped_early and stats.written == 0
    stats = regenerate(tiny_target, ps, out, PARAMS, batch_size=2, max_prompt_tokens=20, progress=False)
    assert stats.too_long > 0 and stats.written == 6 - stats.too_long


def test_a_whole_last_line_without_newline_is_kept_and_a_prompt_alone_is_not_done(tiny_target, tmp_path):
    ps = prompts(6, seed=4)
    out = tmp_path / "r.jsonl"
    regenerate(tiny_target, ps[:3], out, PARAMS, batch_size=4, progress=False)
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines))  # the last record lost only its newline
    with open(out, "a") as fh:  # and a line holding a prompt without its answer
        fh.write("\n" + json.dumps({"id": ps[3].id, "messages": list(ps[3].messages)}) + "\n")
    again = regenerate(tiny_target, ps, out, PARAMS, batch_size=4, progress=False)
    assert again.done_before == 3 and again.written == 3  # ps[3] is answered, not counted as done
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    answered = [r["id"] for r in recs if r["messages"][-1]["role"] == "assistant"]
    assert sorted(answered) == sorted(p.id for p in ps) and len(set(answered)) == len(answered)


def test_an_answer_holding_unicode_line_separators_counts_as_done(tiny_target, tmp_path):
    # Records are written with ensure_ascii=False, which leaves U+2028 and U+0085 unescaped; a reader that
    # split at them (str.splitlines) lost those records and answered their prompts again on every resume.
    ps = prompts(3, seed=5)
    out = tmp_path / "r.jsonl"
    regenerate(tiny_target, ps, out, PARAMS, batch_size=4, progress=False)
    recs = [json.loads(line) for line in out.read_text(encoding="utf-8").split("\n") if line]
    recs[1]["messages"][-1]["content"] = "one\u2028two\x85three"
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    again = regenerate(tiny_target, ps, out, PARAMS, batch_size=4, progress=False)
    assert again.done_before == 3 and again.written == 0


def test_other_settings_are_refused_and_restart_starts_over(tiny_target, tmp_path):
    ps = prompts(3, seed=6)
    out = tmp_path / "r.jsonl"
    regenerate(tiny_target, ps, out, PARAMS, progress=False)
    before = out.read_bytes()
    with pytest.raises(EagletError, match=r"other settings \(max_new_tokens 12 then, 5 now\)"):
        regenerate(tiny_target, ps, out, SamplingParams(max_new_tokens=5), progress=False)
    assert out.read_bytes() == before
    claim_output(out, regen_settings(tiny_target.name, SamplingParams(max_new_tokens=5)), restart=True)
    assert not out.exists()
    assert regenerate(tiny_target, ps, out, SamplingParams(max_new_tokens=5), progress=False).written == 3
    assert json.loads(meta_path(out).read_text())["max_new_tokens"] == 5


def test_cli_caps_validation_prompts_and_restarts_only_when_asked(tiny_target_dir, tmp_path, capsys):
    src = write_jsonl(tmp_path / "p.jsonl", [{"messages": list(p.messages), "split": "val" if i < 4 else "train"}
                                             for i, p in enumerate(prompts(10, seed=7))])
    out = tmp_path / "r.jsonl"
    argv = ["data", "regenerate", "--target", str(tiny_target_dir), "--device", "cpu", "--data", str(src),
            "--out", str(out), "--max-samples", "3", "--max-val-samples", "1"]
    assert main([*argv, "--max-new-tokens", "4"]) == 0
    splits = [json.loads(line)["split"] for line in out.read_text().splitlines()]
    assert sorted(splits) == ["train"] * 3 + ["val"]
    before = out.read_bytes()
    assert main([*argv, "--max-new-tokens", "5"]) == 2 and out.read_bytes() == before  # other settings
    assert "--restart" in capsys.readouterr().err
    assert main([*argv, "--max-new-tokens", "5", "--restart"]) == 0
    assert json.loads(meta_path(out).read_text())["max_new_tokens"] == 5 and len(out.read_text().splitlines()) == 4


def _ends_by_first_token(monkeypatch) -> None:
    """Each answer ends after 2..10 tokens, by its first token: rows finish at different steps, so
    finished rows are refilled while the others run (the tiny target seldom writes its end token)."""
    from eaglet.generate import StopChecker

    original = StopChecker.check

    def check(self, tokens, n_new=1):
        keep = original(self, tokens, n_new)
        return keep if keep is not None or len(tokens) < 2 + tokens[0] % 9 else len(tokens)

    monkeypatch.setattr(StopChecker, "check", check)


@pytest.mark.parametrize("wait", [16, 2])
def test_refilled_rows_give_the_targets_greedy_answers(tiny_target, tmp_path, monkeypatch, wait):
    """``wait`` 2: admissions wait for two free rows of four, which often lie apart (one prefill for both)."""
    _ends_by_first_token(monkeypatch)
    monkeypatch.setattr(refill, "ADMIT_WAIT", wait)
    admitted = []
    admit = Session.admit
    monkeypatch.setattr(Session, "admit", lambda self, rows, *a: admitted.append(rows) or admit(self, rows, *a))
    ps = prompts(14, seed=8, split="train")
    out = tmp_path / "r.jsonl"
    assert regenerate(tiny_target, ps, out, PARAMS, batch_size=4, progress=False).written == 14
    assert len(admitted) < 14 and (wait == 16 or any(len(r) >= 2 and r != list(range(r[0], r[-1] + 1))
                                                     for r in admitted))
    recs = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    gen = PlainGenerator(tiny_target, 128)
    lengths = set()
    for p in ps:
        [alone] = gen.generate([encode_chat(tiny_target.tokenizer, p.prompt())], PARAMS)
        assert recs[p.id]["answer_ids"] == alone.tokens, p.id
        lengths.add(len(alone.tokens))
    assert len(lengths) > 3  # the rows did finish at different steps


def test_answers_do_not_depend_on_the_batch(tiny_target, tmp_path, monkeypatch):
    """Sampled answers too: each draws from its own generator, whatever row and company it gets."""
    _ends_by_first_token(monkeypatch)
    ps = prompts(9, seed=9, split="train")
    runs = {}
    for rows, wait in ((1, 16), (4, 16), (16, 16), (4, 1)):  # (4, 1): admit only once all four rows are free
        monkeypatch.setattr(refill, "ADMIT_WAIT", wait)
        out = tmp_path / f"r{rows}-{wait}.jsonl"
        regenerate(tiny_target, ps, out, SamplingParams(max_new_tokens=12, seed=5), batch_size=rows,
                   temperatures=(0.0, 1.0), progress=False)
        runs[rows, wait] = sorted(out.read_text().splitlines())
    assert len(runs[1, 16]) == 18 and runs[1, 16] == runs[4, 16] == runs[16, 16] == runs[4, 1]
    sampled = [json.loads(line) for line in runs[1, 16] if "~t1" in line]
    greedy = {r["id"]: r for r in map(json.loads, runs[1, 16]) if "~t" not in r["id"]}
    assert any(r["answer_ids"] != greedy[r["id"].split("~")[0]]["answer_ids"] for r in sampled)  # they do sample


def test_ctrl_c_while_a_step_runs_keeps_whole_answers_and_the_run_resumes(tiny_target, tmp_path, monkeypatch):
    """Finished answers are written while the next step runs (its ``launched`` hook): a Ctrl-C noticed there
    ends the run with whole records, and the same command then writes exactly what one run writes."""
    import os
    import signal

    from eaglet.errors import Interrupted

    _ends_by_first_token(monkeypatch)
    ps = prompts(12, seed=12, split="train")
    whole = tmp_path / "whole.jsonl"
    regenerate(tiny_target, ps, whole, PARAMS, batch_size=4, progress=False)
    out = tmp_path / "r.jsonl"
    hooked, step = [], Session.step

    def interrupting(self, launched=None):
        def hook():
            if len(hooked) == 5:
                os.kill(os.getpid(), signal.SIGINT)  # the handler sets the stop flag; writing answers honours it
            before = out.stat().st_size
            try:
                launched()
            finally:
                hooked.append(out.stat().st_size > before)  # answers written inside the step
        return step(self, hook)

    monkeypatch.setattr(Session, "step", interrupting)
    with pytest.raises(Interrupted, match="run the same command again"):
        regenerate(tiny_target, ps, out, PARAMS, batch_size=4, progress=False)
    kept = out.read_text().splitlines()
    assert 0 < len(kept) < 12 and all(json.loads(line)["id"] for line in kept) and any(hooked)
    monkeypatch.setattr(Session, "step", step)
    assert regenerate(tiny_target, ps, out, PARAMS, batch_size=4, progress=False).written == 12 - len(kept)
    assert sorted(out.read_text().splitlines()) == sorted(whole.read_text().splitlines())


def test_a_budget_stops_admitting_and_the_rows_in_flight_finish(tiny_target, tmp_path):
    ps = prompts(6, seed=10)
    asked = []
    out = tmp_path / "r.jsonl"
    stats = regenerate(tiny_target, ps, out, PARAMS, batch_size=2, progress=False,
                       stop_when=lambda tokens: asked.append(tokens) or len(asked) > 1)
    assert stats.stopped_early and stats.written == 2 and asked[0] == 0  # the first two rows, run to their end
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["finish_reason"] == "stop" or r["completion_tokens"] == 12 for r in recs)  # ended, not cut


def test_under_cuda_graphs_every_stage_runs_the_runs_batch():
    """A batch size is a compile and a capture under graphs: a short stage leaves rows idle instead. Eagerly a
    short stage runs its own rows (nothing to compile)."""
    assert refill.stage_batch(512, 37, graphs=True) == 512 and refill.stage_batch(300, 5, graphs=True) == 512
    assert refill.stage_batch(512, 37, graphs=False) == 37 and refill.stage_batch(4, 9, graphs=False) == 4


def test_admissions_prefill_eagerly_unless_graphs_are_asked_for(tiny_target, monkeypatch):
    """Regeneration admits tens of rows at once, where one eager forward beat the prefill graphs' buckets."""
    assert refill.Refill(tiny_target, 4, 64, PARAMS).gen.prefills is None
    monkeypatch.setattr(refill, "GRAPHED_PREFILL", True)
    assert refill.Refill(tiny_target, 4, 64, PARAMS).gen.prefills is not None


def test_rows_count_the_memory_free_after_the_allocators_unused_blocks_go_back(monkeypatch):
    """A stage's freed cache stays with the caching allocator until ``empty_cache`` returns it; a live cache (the
    Refill's) is not free. Blocks the allocator keeps after ``empty_cache`` (parts of segments in use) were
    counted as free, though without expandable segments such fragments cannot hold one large allocation."""
    calls = []
    cache = SimpleNamespace(nbytes=lambda: 1000)  # bytes a slot of one row
    model = SimpleNamespace(embed=SimpleNamespace(weight=SimpleNamespace(device=torch.device("cuda"))),
                            new_cache=lambda batch, slots: cache)
    target = SimpleNamespace(model=model, config=SimpleNamespace(vocab_size=0, num_heads=1))
    monkeypatch.setattr(refill, "PREFILL_TOKENS", 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: calls.append("free") or (40_000_000, 200_000_000))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 80_000_000)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 50_000_000)  # 30 MB kept, unused
    # 60% of the 40 MB free holds 240 rows of 100 slots: 128, a power of two; the 30 MB kept do not count
    assert refill.rows_fitting(target, 100, 2048) == 128
    assert calls == ["empty_cache", "free"]  # the unused blocks go back before the free memory is read
    assert refill.rows_fitting(target, 100, 64) == 64
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10_000_000, 200_000_000))
    assert refill.rows_fitting(target, 100, 2048) == 32  # 60% of 10 MB: 60 rows
    # An admission's attention scores (PREFILL_TOKENS padded tokens over the slots, float32) are set aside.
    monkeypatch.setattr(refill, "PREFILL_TOKENS", 12_500)
    assert refill.prefill_reserve(target, 100) == 5_000_000
    assert refill.rows_fitting(target, 100, 2048) == 16  # 60% of 10 MB - 5 MB: 30 rows
    monkeypatch.setattr(refill, "PREFILL_TOKENS", 10**6)
    assert refill.rows_fitting(target, 100, 2048) == 1  # nothing left: one row, as before


def test_without_a_batch_size_a_run_takes_the_rows_its_memory_holds(tiny_target, tmp_path, monkeypatch, capsys):
    smollm2_row = 1536 * 30 * 2 * 3 * 64 * 2 + 8 * 49152  # bf16 slots at capacity 1,536, float32 logits twice
    assert refill.fitting_rows(139 * 2**30, smollm2_row) == refill.MAX_ROWS == 2048  # an H200
    assert refill.fitting_rows(20 * 2**30, smollm2_row) == 256
    assert refill.fitting_rows(10**6, smollm2_row) == 1
    cfg = tiny_target.config
    assert tiny_target.model.new_cache(2, 256).nbytes() == 2 * 256 * cfg.num_layers * 2 * cfg.num_kv_heads * \
        cfg.head_dim * 4  # float32
    assert refill.auto_rows(tiny_target, 64, 12) == refill.CPU_ROWS  # no GPU: the CPU's default
    monkeypatch.setattr(refill, "CPU_ROWS", 3)
    rows = []
    init = refill.Refill.__init__
    monkeypatch.setattr(refill.Refill, "__init__",
                        lambda self, target, n, *a: rows.append(n) or init(self, target, n, *a))
    regenerate(tiny_target, prompts(4, seed=11, split="train"), tmp_path / "r.jsonl", PARAMS, progress=False)
    assert rows == [3] and "decoding up to 3 rows at a time (the CPU's default" in capsys.readouterr().err
