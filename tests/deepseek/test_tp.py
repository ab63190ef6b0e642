"""The DeepSeek-V3 target under tensor parallelism on CPU with gloo (tp=2 and 4).

Heads, experts (split inside each expert) and the vocabulary are sharded; every captured
point, the logits, greedy tokens and speculative output must equal tp=1 on every rank.
A deferred all-reduce planted in one MoE layer (its partial sum completed only inside the
next layer, after the capture point) leaves the logits right and the point wrong: the TP
check and the doctor must catch it and name the point and the layer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import eaglet.doctor.tp as tp_check
from eaglet.doctor.tp import check_tp, compare_tp
from eaglet.draft.checkpoint import save_draft
from eaglet.loading.target import load_model
from eaglet.parallel.launch import run_tp
from eaglet.parallel.state import SINGLE, TPGroup
from tests.deepseek.conftest import YARN, make_hf_deepseek
from tests.parallel.test_tp import _close, _run_model
from tests.parallel.test_tp_spec import GREEDY, _spec_rank, _target
from tests.speculative.conftest import echo_draft

POINTS = (0, 1, 2, 3)  # every point of the 3-layer target (1 dense + 2 MoE layers)
PROMPTS = [torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (7, 19)]
PLANTED_LAYER = 1  # its MoE output stays a per-rank partial sum until layer 2 starts: point 2 is partial


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> tuple[Path, Path]:
    """A repeat-prone tiny DeepSeek-V3 (vocabulary 64, YaRN, group-limited MoE) and its echo draft."""
    path = tmp_path_factory.mktemp("ds-tp-target")
    hf = make_hf_deepseek(seed=4, vocab_size=64, rope_parameters=YARN, max_position_embeddings=256)
    with torch.no_grad():  # tests/speculative's repeat_prone, saved so that every rank loads it
        hf.lm_head.weight.add_(1.5 * hf.model.embed_tokens.weight)
    hf.save_pretrained(str(path), safe_serialization=True)
    draft_dir = tmp_path_factory.mktemp("ds-tp-draft") / "draft"
    save_draft(echo_draft(_target(SINGLE, path)), draft_dir, dtype=torch.float32)
    return path, draft_dir


def _rank(tp: TPGroup, path: Path, draft_dir: Path) -> dict:
    return {"model": _run_model(tp, path, POINTS, PROMPTS, 16), "spec": _spec_rank(tp, path, draft_dir,
                                                                                     {"greedy": GREEDY})["greedy"]}


@pytest.fixture(scope="module")
def reference(dirs) -> dict:
    return _rank(SINGLE, *dirs)


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_equals_tp1_on_every_rank(tp, dirs, reference):
    got = run_tp(tp, _rank, *dirs)
    run, ref = got["model"], reference["model"]
    assert run["params"] < ref["params"] / 1.5, "a rank holds most of the model"
    for key, x in ref["outs"].items():  # point 0..3, logits, tokens
        assert run["across"][key] == 0.0, f"{key}: ranks differ"
        if key == "tokens":
            assert torch.equal(run["outs"][key], x), "greedy tokens differ from tp=1"
        else:
            assert _close(run["outs"][key], x), f"{key} differs from tp=1"
    spec, ref_spec = got["spec"], reference["spec"]
    assert spec["across"] == 0.0 and spec["tokens"] == ref_spec["tokens"] and spec["accept"] == ref_spec["accept"]
    assert max(a for row in spec["accept"] for a in row) >= 2, "some draft tokens should be accepted"


def _defer_reduce(model, layer: int) -> None:
    """Plant a deferred all-reduce: ``layer``'s MoE returns its per-rank partial sum, and the sum is
    completed only when the next layer starts (the reduce "moved into the next norm"), after the
    capture of the point between them. The output of the model is unchanged."""
    moe, pending = model.layers[layer].mlp, {}
    moe.tp = SINGLE  # no all-reduce at the end of the MoE
    moe.register_forward_hook(lambda _m, _args, out: pending.__setitem__("partial", out.clone()))

    def complete(_m, args):  # args: (h, delta = the MoE's output, ...): see DecoderLayer.forward
        part = pending.pop("partial")
        return (args[0], args[1] - part + model.tp.all_reduce(part.clone()), *args[2:])

    model.layers[layer + 1].register_forward_pre_hook(complete)


def _planted_load_model(*args, **kwargs):
    model = load_model(*args, **kwargs)
    _defer_reduce(model, PLANTED_LAYER)
    return model


def _planted_on_rank(tp: TPGroup, *args):
    """The TP check's rank function, over a model with the planted deferred reduce (in this rank only)."""
    tp_check.load_model = _planted_load_model
    return _on_rank(tp, *args)


_on_rank = tp_check._on_rank


def test_planted_deferred_partial_sum_is_caught_and_named(dirs, monkeypatch):
    path, _ = dirs
    monkeypatch.setattr(tp_check, "_on_rank", _planted_on_rank)  # the ranks plant; tp=1 runs here, unplanted
    rep = compare_tp(str(path), 2, PROMPTS, POINTS)
    bad = {d.name for d in rep.diffs if not d.ok}
    assert bad == {"point 2"}, rep.format()  # the logits and every other point are right
    chk = check_tp(str(path), 2, PROMPTS, POINTS, torch.float32, "cpu", 120)
    assert chk.status == "fail" and len(chk.problems) == 1, chk.problems
    assert chk.problems[0].startswith("point 2 differs at tp=2"), chk.problems
    assert "the output of layer 1" in chk.problems[0], chk.problems


def test_doctor_passes_the_unplanted_model(dirs):
    chk = check_tp(str(dirs[0]), 4, PROMPTS, POINTS, torch.float32, "cpu", 120)
    assert chk.status == "pass", chk.problems
    assert [d["name"] for d in chk.evidence["diffs"]] == ["point 0", "point 1", "point 2", "point 3", "logits"]
