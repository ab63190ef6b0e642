"""eaglet doctor on a tiny target: a correct setup passes; each planted fault is caught, named and located."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import eaglet.speculative.engine as engine
import eaglet.speculative.session as spec_session
from eaglet.capture import CaptureSpec
from eaglet.cli import main
from eaglet.data.features import capture_features
from eaglet.doctor import tp as doctor_tp
from eaglet.doctor.config import DoctorConfig
from eaglet.doctor.contract import check_contract
from eaglet.doctor.run import run_doctor
from eaglet.doctor.samples import answer_data
from eaglet.doctor.tp import TPReport, check_tp, judge
from eaglet.draft.checkpoint import load_draft, save_draft
from eaglet.draft.compat import target_identity
from eaglet.errors import EagletError
from eaglet.loading.target import tokenizer_hash
from eaglet.models.int8_linear import int8_gemm_available
from eaglet.speculative import verify as spec_verify
from tests.doctor.conftest import LAYERS, POINTS, copy_draft
from tests.train.helpers import load_tiny, tiny_tokenizer

SETTINGS = dict(num_steps=3, topk=2, num_draft_tokens=6)  # within the 3 steps the draft was trained for
CLI = ["--num-prompts", "16", "--max-new-tokens", "48", "--num-steps", "3", "--topk", "2", "--num-draft-tokens", "6"]


def doctor(target_dir, draft, prompts, **kw):
    cfg = DoctorConfig(target=str(target_dir), draft=str(draft), prompts=str(prompts), num_prompts=16,
                       max_new_tokens=48, **{**SETTINGS, **kw})
    return run_doctor(cfg, log=lambda _m: None)


def status(report) -> dict[int, str]:
    return {c.number: c.status for c in report.checks}


def problems(report, number: int) -> str:
    return " | ".join(report.checks[number - 1].problems)


@pytest.fixture(scope="module")
def target(doctor_target_dir):
    return load_tiny(doctor_target_dir)


@pytest.fixture(scope="module")
def good_features(target, doctor_target_dir, trained_draft, tmp_path_factory):
    """Offline features of a few conversations, captured at the draft's points (bf16 shards)."""
    from eaglet.chat import encode_chat
    from eaglet.generate import PlainGenerator
    from eaglet.sampling import SamplingParams
    from tests.train.helpers import prompts

    ids = [encode_chat(target.tokenizer, list(p.messages)) for p in prompts(6, seed=11)]
    answers = [c.tokens for c in PlainGenerator(target, 256).generate(ids, SamplingParams(max_new_tokens=24))]
    out = tmp_path_factory.mktemp("features")
    capture_features(target, answer_data(ids, answers), out, CaptureSpec(POINTS, LAYERS), shard_samples=4,
                     progress=False)
    return out


def test_a_correct_setup_passes_every_check(doctor_target_dir, trained_draft, doctor_prompts, good_features,
                                            tmp_path, capsys):
    out = tmp_path / "report.json"
    code = main(["doctor", "--target", str(doctor_target_dir), "--draft", str(trained_draft), "--prompts",
                 str(doctor_prompts), *CLI, "--features", str(good_features), "--json", str(out)])
    text = capsys.readouterr().out
    rep = json.loads(out.read_text())
    assert code == 0, text
    assert rep["ok"] and [c["status"] for c in rep["checks"]] == ["pass"] * 5 + ["skip"], text
    assert "verdict: PASS" in text and "recorded at training (val, all answer tokens): acc_0" in text
    lines = text.splitlines()
    assert len(lines) <= 50 and max(len(x) for x in lines[3:]) <= 120, text  # one screen (lines 1-2 hold paths)
    parity = {r["name"]: r for r in rep["checks"][1]["evidence"]["rows"]}
    assert {"point 1", "point 3", "offline point 2", "next-token embedding", "rotary positions"} <= set(parity)
    assert parity["point 2"]["positions"] > 500 and parity["point 2"]["max_abs_diff"] < 1e-4
    search = rep["checks"][2]["evidence"]["sets"]
    assert search[0]["points"] == list(POINTS) and search[0]["acc_0"] == max(s["acc_0"] for s in search)
    online = rep["checks"][3]["evidence"]
    assert online["tau_pred"] > 1.5 and online["identical_to_plain"] == online["prompts"] == 16
    head = rep["checks"][4]["evidence"]["head"]  # served as a CPU serves it: int8 where fbgemm's GEMM exists
    if int8_gemm_available():
        assert head["served"].startswith("int8, the whole vocabulary") and not head["same_as_trained"], head
        assert head["served"].endswith("; the layer in int8"), head  # its own unroll compared, not the trained one's
        assert head["same_top1"][0] > 0.9 and abs(head["tau_served"] - head["tau_trained"]) <= 0.1, head
        assert "served head: int8" in text


def test_a_draft_of_the_new_recipe_passes(doctor_target_dir, recipe_draft, doctor_prompts, tmp_path, capsys):
    """Sampled answers beside greedy ones, aux_norm and feature noise: the doctor still passes it, and
    it names the norm; a norm the config does not declare (or declares without weights) fails."""
    code = main(["doctor", "--target", str(doctor_target_dir), "--draft", str(recipe_draft), "--prompts",
                 str(doctor_prompts), *CLI])
    text = capsys.readouterr().out
    assert code == 0 and "verdict: PASS" in text and "RMS-normalised first (aux_norm)" in text, text
    target = load_tiny(doctor_target_dir)
    undeclared = copy_draft(recipe_draft, tmp_path / "undeclared", lambda cfg: cfg["eaglet"].pop("aux_norm"))
    assert "does not declare eaglet.aux_norm" in " ".join(
        check_contract(target, undeclared, None, torch.float32, "cpu").check.problems)
    with pytest.raises(EagletError, match="does not declare eaglet.aux_norm"):
        load_draft(undeclared, LAYERS)
    no_weights = _without_norm_weights(recipe_draft, tmp_path)
    assert "weights hold no aux_norm.weight" in " ".join(
        check_contract(target, no_weights, None, torch.float32, "cpu").check.problems)


def test_a_draft_stored_in_row_blocks_passes_the_contract(doctor_target_dir, recipe_draft, tmp_path):
    """An aux-norm draft's tensors over the shard limit are stored in row blocks (an 8B target's fc is ~100 MB):
    the contract reads fc's width from its blocks instead of failing for a missing fc.weight."""
    target = load_tiny(doctor_target_dir)
    draft, _ = load_draft(recipe_draft, LAYERS)
    fc = draft.fc.weight
    save_draft(draft, tmp_path / "blocks", target=target_identity(target), split_rows=True,
               max_shard_bytes=fc.numel() * 2 // 3)
    names = json.loads((tmp_path / "blocks" / "model.safetensors.index.json").read_text())["weight_map"]
    assert "fc.weight" not in names and "fc.weight@rows0" in names
    res = check_contract(target, tmp_path / "blocks", None, torch.float32, "cpu")
    assert res.check.status == "pass" and res.draft is not None, res.check.problems
    assert res.check.evidence["fc_shape"] == list(fc.shape)


def _without_norm_weights(recipe_draft, tmp_path):
    """A copy of the recipe draft (its config still declaring aux_norm) without the aux_norm.weight tensor."""
    out = copy_draft(recipe_draft, tmp_path / "no-norm-weights")
    for f in out.glob("model-*.safetensors"):
        t = load_file(str(f))
        t.pop("aux_norm.weight", None)
        save_file(t, str(f), metadata={"format": "pt"})
    index = json.loads((out / "model.safetensors.index.json").read_text())
    index["weight_map"].pop("aux_norm.weight", None)
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return out


def _declare(points):
    def edit(cfg):
        cfg["eaglet"]["capture"]["points"] = list(points)
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = None if 0 in points else [p - 1 for p in points]
    return edit


def test_shifted_points_fail_and_the_cli_names_the_true_ones(doctor_target_dir, trained_draft, doctor_prompts,
                                                             tmp_path, capsys):
    # SGLang's ids [0, 1, 2] copied into the eaglet block as if they were points: off by one.
    bad = copy_draft(trained_draft, tmp_path / "shifted", _declare((0, 1, 2)))
    out = tmp_path / "report.json"
    code = main(["doctor", "--target", str(doctor_target_dir), "--draft", str(bad), "--prompts", str(doctor_prompts),
                 *CLI, "--json", str(out)])
    text = capsys.readouterr().out
    rep = json.loads(out.read_text())
    assert code == 1 and not rep["ok"]
    st = {c["number"]: c["status"] for c in rep["checks"]}
    assert st[1] == "pass" and st[2] == "pass" and st[3] == "fail", text  # self-consistent, and wrong
    assert "reads points [1, 2, 3] (SGLang ids [0, 1, 2]; declared +1)" in text
    assert "verdict: FAIL (3 capture points)" in text


def test_points_shifted_up_are_named(doctor_target_dir, trained_draft, doctor_prompts, tmp_path):
    bad = copy_draft(trained_draft, tmp_path / "shifted-up", _declare((2, 3, 4)))
    rep = doctor(doctor_target_dir, bad, doctor_prompts)
    assert status(rep)[3] == "fail"
    assert "reads points [1, 2, 3] (SGLang ids [0, 1, 2]; declared -1)" in problems(rep, 3)


def _serving_fault(monkeypatch, fault=None, shift: int = 0):
    """The engine's prefill and verify capture ``points + shift`` and return ``fault(model, ids, aux)``:
    what a broken serving capture feeds the draft."""
    real_prefill, real_verify = spec_verify.prefill, spec_verify.verify
    fault = fault or (lambda _model, _ids, aux: aux)

    def prefill(model, cache, prompts, capture):
        logits, aux = real_prefill(model, cache, prompts, tuple(p + shift for p in capture))
        return logits, fault(model, spec_verify.pad_batch(prompts, aux.device)[0], aux)

    def verify(model, cache, tree, capture, n_slots=None):
        logits, aux = real_verify(model, cache, tree, tuple(p + shift for p in capture), n_slots)
        return logits, fault(model, tree.tokens, aux)

    monkeypatch.setattr(spec_session, "prefill", prefill)
    monkeypatch.setattr(engine, "verify", verify)


def test_embedding_output_swapped_in_by_serving(doctor_target_dir, trained_draft, doctor_prompts, monkeypatch):
    def embedding_for_point_2(model, ids, aux):
        h = model.cfg.hidden_size
        return torch.cat([aux[..., :h], model.embed(ids), aux[..., 2 * h:]], dim=-1)  # [B, T, 3H]

    _serving_fault(monkeypatch, embedding_for_point_2)
    rep = doctor(doctor_target_dir, trained_draft, doctor_prompts)
    st = status(rep)
    assert st[1] == "pass" and st[2] == "fail" and st[3] == "pass", rep.format()
    assert "point 2: max |training - serving|" in problems(rep, 2) and "point 1" not in problems(rep, 2)
    assert "serving feeds point 0 (the embedding output) where training reads point 2" in problems(rep, 2)
    # Acceptance drops by as much as the draft leans on point 2 (a matter of its training): below the prediction
    # overall, or verify by verify unlike what teacher forcing predicts; either way a warning.
    assert st[4] == "warn" and ("serving accepts less than the draft's accuracy predicts" in problems(rep, 4)
                                or "of verifies accept the length teacher forcing predicts" in problems(rep, 4))


def test_serving_capture_off_by_one(doctor_target_dir, trained_draft, doctor_prompts, monkeypatch):
    _serving_fault(monkeypatch, shift=-1)  # the engine reads "layer ids" where the draft declares points
    rep = doctor(doctor_target_dir, trained_draft, doctor_prompts)
    st = status(rep)
    assert st[2] == "fail" and st[3] == "pass" and st[4] == "fail", rep.format()
    for j in POINTS:
        assert f"serving feeds point {j - 1}" in problems(rep, 2) and f"where training reads point {j}" \
            in problems(rep, 2)
    assert "serving accepts far less than the draft's accuracy predicts" in problems(rep, 4)
    assert "lost at draft step 0 (" in problems(rep, 4)


def test_per_rank_partial_sum_in_serving(doctor_target_dir, trained_draft, doctor_prompts, monkeypatch):
    def half_of_point_3(model, ids, aux):
        h = model.cfg.hidden_size
        return torch.cat([aux[..., :2 * h], aux[..., 2 * h:] / 2], dim=-1)  # rank 0's share at tp=2

    _serving_fault(monkeypatch, half_of_point_3)
    rep = doctor(doctor_target_dir, trained_draft, doctor_prompts)
    assert status(rep)[2] == "fail", rep.format()
    assert "point 3" in problems(rep, 2) and "point 1" not in problems(rep, 2)
    assert "serving feeds 0.500 x point 3: a partial sum, not the full residual stream, as one rank's share at tp=2" \
        in problems(rep, 2)


def test_wrong_d2t_mapping(target, trained_draft, tmp_path):
    bad = copy_draft(trained_draft, tmp_path / "d2t")
    shard = next(bad.glob("model-*.safetensors"))
    t = load_file(str(shard))
    ids = torch.arange(t["d2t"].numel()) + t["d2t"]  # the target id of each draft id
    ids[10:20] = ids[20:30].clone()  # draft ids 10..19 reach 20..29's targets: ten collisions, ten never reached
    t["d2t"] = ids - torch.arange(ids.numel())
    save_file(t, str(shard), metadata={"format": "pt"})
    chk = check_contract(target, bad, None, torch.float32, "cpu").check
    assert chk.status == "fail"
    text = " | ".join(chk.problems)
    first = int(ids[20:30].min())
    j = 20 + int(ids[20:30].argmin())
    assert f"d2t is not injective: 10 target ids are reached by several draft ids (first: draft ids {[j - 10, j]} " \
           f"-> target id {first})" in text
    assert "d2t and t2d disagree: t2d marks 260 target ids, d2t reaches 250" in text


def test_draft_trained_with_another_tokenizer(target, trained_draft, tmp_path):
    other = tiny_tokenizer()
    other.chat_template = other.chat_template.replace("<|end|>\n", "<|end|>\n\n")  # another chat template
    bad = copy_draft(trained_draft, tmp_path / "tok",
                     lambda cfg: cfg["eaglet"]["target"].update(tokenizer_hash=tokenizer_hash(other)))
    chk = check_contract(target, bad, None, torch.float32, "cpu").check
    assert chk.status == "fail"
    assert f"tokenizer {tokenizer_hash(other)} vs {target.tokenizer_hash}" in " | ".join(chk.problems)


def test_missing_and_disagreeing_capture_declarations(target, trained_draft, tmp_path):
    def strip(cfg):
        del cfg["eaglet"]["capture"]
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = None

    res = check_contract(target, copy_draft(trained_draft, tmp_path / "none", strip), None, torch.float32, "cpu")
    assert res.check.status == "fail" and res.draft is None  # a 4-layer target has no EAGLE-3 default to assume
    assert "declares no capture points" in " | ".join(res.check.problems)

    def disagree(cfg):
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(POINTS)  # SGLang ids: points 2, 3, 4

    res = check_contract(target, copy_draft(trained_draft, tmp_path / "two", disagree), None, torch.float32, "cpu")
    assert res.check.status == "fail" and res.draft is not None and res.assumed.points == POINTS
    assert "declares points [1, 2, 3] but eagle_config's SGLang ids [1, 2, 3] mean points [2, 3, 4]" \
        in " | ".join(res.check.problems)
    assert res.alternatives[0][1].points == (2, 3, 4)  # scored by the search as well


def test_features_of_other_points_are_refused(target, trained_draft, tmp_path):
    data = answer_data([[257, 198, 83, 256, 198, 258, 198]], [[70, 71, 72, 73]])
    capture_features(target, data, tmp_path / "f", CaptureSpec((0, 1, 2), LAYERS), progress=False)
    chk = check_contract(target, trained_draft, str(tmp_path / "f"), torch.float32, "cpu").check
    assert chk.status == "fail"
    assert "hold points [0, 1, 2]; the draft reads [1, 2, 3]" in " | ".join(chk.problems)


def test_a_draft_for_another_target_skips_the_runs(doctor_target_dir, trained_draft, doctor_prompts, tmp_path):
    bad = copy_draft(trained_draft, tmp_path / "wide", lambda cfg: cfg.update(target_hidden_size=128))
    rep = doctor(doctor_target_dir, bad, doctor_prompts)
    assert [c.status for c in rep.checks] == ["fail", "skip", "skip", "skip", "pass", "skip"]
    assert "hidden size 128; this target's is 64" in problems(rep, 1)


def test_a_served_head_that_loses_acceptance_warns_and_one_the_engine_refuses_fails(
        doctor_target_dir, trained_draft, doctor_prompts, tmp_path):
    """Check 5 compares the draft's head as served with the trained one: cut to its 4 most frequent tokens it
    proposes the target's token far less often (a warning naming both accept lengths); a cut of a draft listed
    by token id is refused by the engine's loader, and the check fails with its sentence."""
    rep = doctor(doctor_target_dir, trained_draft, doctor_prompts, draft_vocab=4, int8_head=False)
    head = rep.checks[4].evidence["head"]
    assert head["served"].startswith("float32, 4 of its") and head["tau_served"] < head["tau_trained"] - 0.1, head
    assert status(rep)[5] == "warn" and "proposes the target's token less often" in problems(rep, 5)
    whole = doctor(doctor_target_dir, trained_draft, doctor_prompts, int8_head=False)
    assert status(whole)[5] == "pass" and whole.checks[4].evidence["head"] == {
        "served": f"float32, the whole vocabulary ({load_draft(trained_draft, LAYERS)[0].config.draft_vocab_size:,} "
                  "tokens)", "same_as_trained": True}
    by_id = copy_draft(trained_draft, tmp_path / "by-id", lambda cfg: cfg["eaglet"].pop("vocab_order", None))
    rep = doctor(doctor_target_dir, by_id, doctor_prompts, draft_vocab=4)
    assert status(rep)[5] == "fail" and "listed by token id" in problems(rep, 5)


@pytest.fixture(scope="module")
def loaded(target, trained_draft):
    return load_draft(trained_draft, LAYERS)[0]


@pytest.mark.parametrize("kw, verdict, words", [
    (dict(num_steps=3, topk=1, num_draft_tokens=8), "fail", "topk=1 drafts a chain of num_steps=3 tokens, so "
                                                            "num_draft_tokens must be 4"),
    (dict(num_steps=3), "fail", "missing: --tree-topk, --num-draft-tokens"),
    (dict(num_steps=2, topk=4, num_draft_tokens=40), "fail", "exceeds the 21 nodes"),
    (dict(num_steps=3, topk=300, num_draft_tokens=40), "fail", "topk=300 exceeds the draft vocabulary"),
    (dict(num_steps=3, topk=2, num_draft_tokens=6, max_context=24), "fail", "needs 26 positions; the context holds 24"),
    (dict(num_steps=3, topk=8, num_draft_tokens=40), "warn", "num_draft_tokens=40 is more than a cpu verify can take"),
    (dict(num_steps=5, topk=2, num_draft_tokens=8), "warn", "exceeds the 3 steps the draft was trained to unroll"),
    (dict(temperature=2.0), "warn", "temperature 2.0 flattens"),
    (dict(num_steps=3, topk=2, num_draft_tokens=6), "pass", ""),
])
def test_engine_settings(target, loaded, kw, verdict, words):
    from eaglet.doctor.settings import check_settings

    chk = check_settings(target, loaded, DoctorConfig(**kw), 20, None, 3)
    assert chk.status == verdict, chk.problems
    assert words in " | ".join(chk.problems)


def test_tensor_parallel_check_runs_the_ranks(doctor_target_dir):
    chk = check_tp(str(doctor_target_dir), 2, [[257, 198, 83, 71, 68, 256, 198, 258, 198]], POINTS,
                   torch.float32, "cpu", 120)
    assert chk.status == "pass", chk.problems
    assert [d["name"] for d in chk.evidence["diffs"]] == ["point 1", "point 2", "point 3", "logits"]


def test_tensor_parallel_partial_sum_is_named(monkeypatch):
    ref = torch.randn(20, 64)
    diffs = (judge("point 1", ref, ref), judge("point 2", ref / 2, ref), judge("logits", ref, ref))
    monkeypatch.setattr(doctor_tp, "compare_tp", lambda *a, **k: TPReport("tiny", 2, "float32", 20, diffs))
    chk = check_tp("tiny", 2, [[1, 2, 3]], POINTS, torch.float32, "cpu", 120)
    assert chk.status == "fail" and len(chk.problems) == 1
    assert chk.problems[0].startswith("point 2 differs at tp=2") and "per-rank partial sum (1 - 1/2)" in chk.problems[0]
