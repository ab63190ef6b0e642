"""Regeneration under CUDA graphs (skipped without CUDA): one running batch serves every stage of a run and
writes what a generator per stage writes. On the CPU the same is tested eagerly (test_sources.py); here the
compiled, captured step is reused across stages (validation, training, sampled answers).

The target's head_dim is 64, as SmolLM2's, so decode attention is the Triton kernel the H200 runs. (With the
tiny targets' head_dim of 16 it is the grouped fallback, which torch 2.11's dynamo fails to compile inside
the layers' nested compile region: "lift_tracked_freevar_to_input should not be called on root
SubgraphTracer", seen on the H200 on 2026-12-01.)"""

from __future__ import annotations

import pytest
import torch

import eaglet.data.sources as sources
from eaglet.loading import load_target
from eaglet.train_options import RegenConfig
from tests.train.helpers import answers_end_after, count_generators, make_tiny_target_dir, prompts, stages_apart

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_one_graphed_batch_serves_every_stage_and_writes_what_stages_apart_write(tmp_path, monkeypatch):
    path = make_tiny_target_dir(tmp_path / "target", head_dim=64)
    target = load_target(str(path), dtype=torch.float32, device="cuda")
    answers_end_after(monkeypatch, 6)
    built, _ = count_generators(monkeypatch)
    ps = [p.__class__(p.id, p.messages, "val" if i < 3 else "train", "src") for i, p in enumerate(prompts(11, seed=7))]
    rc = RegenConfig(batch_size=8, max_new_tokens=10, answers=(0.0, 1.0))
    stats = sources.answer_sources(target, ps, tmp_path / "one.jsonl", rc, progress=False)
    assert sum(s.written > 0 for s in stats) == 3  # validation, training, sampled
    assert len(built) == 1 and built[0].use_graphs
    stages_apart(monkeypatch)
    sources.answer_sources(target, ps, tmp_path / "apart.jsonl", rc, progress=False)
    assert len(built) > 1  # each stage built its own
    assert (tmp_path / "one.jsonl").read_bytes() == (tmp_path / "apart.jsonl").read_bytes()
