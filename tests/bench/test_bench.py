"""``eaglet bench`` and ``eaglet generate --draft`` end to end on a tiny chat model (CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from eaglet.bench.prompts import load_prompt_sets, load_prompts
from eaglet.bench.report import acceptance_by_position
from eaglet.cli import main
from eaglet.errors import EagletError
from tests.conftest import save_random_draft


def test_bench_all_methods(chat_model_dir, draft_dir, prompts_file, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["bench", "--target", str(chat_model_dir), "--draft", str(draft_dir), "--prompts", str(prompts_file),
               "--max-new-tokens", "12", "--batch-size", "2", "--out", str(out),
               "--num-steps", "3", "--topk", "2", "--num-draft-tokens", "6"])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert (out / "report.png").stat().st_size > 10_000
    assert set(report["methods"]) == {"plain", "spec", "hf", "hf-lookup"}
    for m, s in report["methods"].items():
        assert s["tokens"] > 0 and s["tokens_per_s"] > 0 and s["median_prompt_tokens_per_s"] > 0, m
    spec = report["methods"]["spec"]
    assert spec["accept_length"] >= 1 and spec["verifies"] > 0
    assert report["identical_to_plain"]["spec"]["all"]
    assert {"spec_over_plain", "spec_over_hf", "plain_over_hf"} <= set(report["speedup"])
    assert set(report["by_category"]) == {"chat", "code", "math"}
    assert report["prompts"][1]["id"] == "b" and report["prompts"][1]["category"] == "code"
    assert report["config"]["hf_lookup_batch_size"] == 1
    warm = report["config"]["warm_up_s"]  # the untimed first use, per method, so a reader sees what it cost
    assert set(warm) == set(report["methods"]) and all(w["first_batch"] > 0 <= w["shape_pass"] for w in warm.values())
    assert report["config"]["compiles_s"] == []  # eager on the CPU: nothing compiles (CUDA lists each step's seconds)
    printed = capsys.readouterr()
    assert "spec over plain" in printed.out and "method" in printed.out and "spec: warm-up took" in printed.err


def test_prompt_sets_are_batched_and_reported_each_on_its_own(chat_model_dir, draft_dir, prompts_file, tmp_path,
                                                              capsys):
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"prompt": f"count to {n}", "category": "math"}) + "\n" for n in (3, 5)))
    out = tmp_path / "out"
    # Batch 2 over sets of 3 and 2 prompts: one set alone would batch (0,1), (2,3), (4); per set it is
    # (0,1), (2) and (3,4), so no batch mixes the sets.
    assert main(["bench", "--target", str(chat_model_dir), "--draft", str(draft_dir), "--methods", "plain,spec",
                 "--prompts", f"{prompts_file},{other}", "--max-new-tokens", "6", "--batch-size", "2",
                 "--num-steps", "2", "--topk", "2", "--num-draft-tokens", "4", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["prompt_sets"] == {"prompts": 3, "other": 2}
    assert [p["set"] for p in report["prompts"]] == ["prompts"] * 3 + ["other"] * 2
    by_set = report["by_set"]
    for m in ("plain", "spec"):
        seconds = [p["methods"][m]["seconds"] for p in report["prompts"]]  # each prompt carries its batch's
        assert seconds[0] == seconds[1] and seconds[3] == seconds[4]
        assert by_set["prompts"]["methods"][m]["seconds"] == pytest.approx(seconds[0] + seconds[2], abs=1e-3)
        assert by_set["other"]["methods"][m]["seconds"] == pytest.approx(seconds[3], abs=1e-3)
        assert sum(s["methods"][m]["tokens"] for s in by_set.values()) == report["methods"][m]["tokens"]
    assert by_set["other"]["identical_to_plain"]["spec"] == 2  # float32 greedy
    for name, s in by_set.items():  # a prompt's verifies add up to its set's (pick.py pools them per prompt)
        rows = [p["methods"]["spec"] for p in report["prompts"] if p["set"] == name]
        assert sum(r["verifies"] for r in rows) == s["methods"]["spec"]["verifies"] > 0
        for r in rows:  # each verify's tokens, which the prompt's accept length averages
            assert len(r["accept_lengths"]) == r["verifies"] and all(n >= 1 for n in r["accept_lengths"])
            assert sum(r["accept_lengths"]) / r["verifies"] == pytest.approx(r["accept_length"], abs=1e-4)
    assert all("accept_lengths" not in p["methods"]["plain"] for p in report["prompts"])
    assert "spec_over_plain" in by_set["prompts"]["speedup"]
    printed = capsys.readouterr().out
    assert "set prompts (3 prompts): spec over plain" in printed and "spec identical 2/2" in printed
    # --limit counts per set; a set named twice is refused.
    assert len(load_prompt_sets(f"{prompts_file},{other}", limit=1)) == 2
    with pytest.raises(EagletError, match="named twice"):
        load_prompt_sets(f"{other},{other}")



def test_a_limit_spreads_over_the_categories_in_file_order(tmp_path):
    """The built-in set opens with 23 code prompts: its first 20 measured code alone."""
    f = tmp_path / "p.jsonl"
    cats = ["code", "code", "code", "math", "code", "chat", "math"]
    f.write_text("".join(json.dumps({"prompt": f"p{i}", "category": c}) + "\n" for i, c in enumerate(cats)))
    picked = load_prompt_sets(str(f), limit=4)
    assert [p.messages[-1]["content"] for p in picked] == ["p0", "p1", "p3", "p5"]  # code, math, chat, then code
    assert len(load_prompt_sets(str(f), limit=50)) == 7
    builtin = load_prompt_sets("builtin", limit=20)
    assert len({p.category for p in builtin}) > 5

def test_bench_plain_and_hf_only(chat_model_dir, prompts_file, tmp_path):
    out = tmp_path / "out"
    assert main(["bench", "--target", str(chat_model_dir), "--prompts", str(prompts_file), "--max-new-tokens", "8",
                 "--methods", "plain,hf", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["methods"]) == {"plain", "hf"} and report["config"]["draft"] is None
    assert report["identical_to_plain"]["hf"]["all"], "float32 transformers greedy = ours at batch 1"


def test_bench_spec_without_draft_is_an_error(chat_model_dir, prompts_file, tmp_path, capsys):
    rc = main(["bench", "--target", str(chat_model_dir), "--prompts", str(prompts_file), "--methods", "spec",
               "--out", str(tmp_path / "bench")])
    assert rc == 2 and "no draft ships" in capsys.readouterr().err


def test_bad_prompt_lines(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"nothing": 1}\n')
    with pytest.raises(EagletError, match=r"bad.jsonl:2: expected a 'messages'"):
        load_prompts(str(bad))
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(EagletError, match=r"bad.jsonl:2:"):
        load_prompts(str(bad))
    assert len(load_prompts("builtin", limit=5)) == 5
    odd = tmp_path / "odd.jsonl"  # JSON leaves U+2028 unescaped when written with ensure_ascii=False
    odd.write_text(json.dumps({"prompt": "a\u2028b"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert [p.messages[-1]["content"] for p in load_prompts(str(odd))] == ["a\u2028b"]


def test_acceptance_by_position():
    assert acceptance_by_position([1, 2, 3, 3]) == [0.75, 0.5]
    assert acceptance_by_position([]) == []


def test_generate_with_draft_json(chat_model_dir, draft_dir, capsys):
    rc = main(["generate", "--target", str(chat_model_dir), "--draft", str(draft_dir), "--prompt", "the fox",
               "--max-new-tokens", "10", "--json", "--num-steps", "2", "--topk", "2", "--num-draft-tokens", "4"])
    assert rc == 0
    cap = capsys.readouterr()
    result = json.loads(cap.out.strip().splitlines()[-1])
    assert result["draft"] == str(draft_dir) and result["accept_length"] >= 1
    assert result["completion_tokens"] > 0 and "tokens_per_s" in result
    assert "tree num_steps=2 topk=2 num_draft_tokens=4 (as given)" in cap.err
    rc = main(["generate", "--target", str(chat_model_dir), "--draft", "none", "--prompt", "the fox",
               "--max-new-tokens", "10", "--json"])
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert plain["text"] == result["text"] and plain["accept_length"] is None


def test_generate_default_draft_missing_falls_back(chat_model_dir, capsys):
    rc = main(["generate", "--target", str(chat_model_dir), "--prompt", "hi", "--max-new-tokens", "4", "--json"])
    assert rc == 0 and "no default draft ships" in capsys.readouterr().err


def test_generate_partial_tree_flags(chat_model_dir, draft_dir, capsys):
    rc = main(["generate", "--target", str(chat_model_dir), "--draft", str(draft_dir), "--prompt", "hi",
               "--num-steps", "4"])
    assert rc == 2 and "missing --tree-topk, --num-draft-tokens" in capsys.readouterr().err


def test_compile_and_policy_flags_reach_the_engine(chat_model_dir, draft_dir, tmp_path, monkeypatch, capsys):
    import eaglet.speculative
    from eaglet.speculative import SpecEngine

    asked = []

    class Recording(SpecEngine):  # records the flags, runs eagerly (compiling on CPU would take minutes)
        def __init__(self, *a, compile=None, adaptive=True, compile_prefill=False, **kw):
            asked.append((compile, adaptive) + (("prefill",) if compile_prefill else ()))
            super().__init__(*a, compile=False, adaptive=adaptive, **kw)

    monkeypatch.setattr(eaglet.speculative, "SpecEngine", Recording)
    common = ["--target", str(chat_model_dir), "--draft", str(draft_dir), "--max-new-tokens", "4"]
    assert main(["generate", *common, "--prompt", "the fox", "--compile"]) == 0
    assert main(["generate", *common, "--prompt", "the fox", "--no-compile", "--policy", "off"]) == 0
    assert main(["generate", *common, "--prompt", "the fox"]) == 0
    assert main(["bench", *common, "--methods", "spec", "--limit", "1", "--out", str(tmp_path), "--compile",
                 "--policy", "off"]) == 0
    assert main(["generate", *common, "--prompt", "the fox", "--compile-prefill"]) == 0
    assert asked == [(True, True), (False, False), (None, True), (True, False),  # None: automatic (on with graphs)
                     (None, True, "prefill")]
    assert json.loads((tmp_path / "report.json").read_text())["config"]["policy"] is False
    assert json.loads((tmp_path / "report.json").read_text())["config"]["compile_engine"] is True


def test_the_prefill_is_fused_by_default_where_captured_except_in_generate(chat_model_dir, draft_dir, tmp_path,
                                                                           monkeypatch):
    """--compile-prefill unset: the engines fuse their prefill buckets where they are captured (CUDA), in bench and
    serve; generate does not (one prompt: the compile costs far more than the ms it saves); either form of the
    flag decides where given."""
    import torch

    import eaglet.speculative
    from eaglet.options import EngineOptions
    from eaglet.speculative import SpecEngine

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert EngineOptions().fused_prefill(cuda) and not EngineOptions().fused_prefill(cpu)
    assert not EngineOptions(compile_prefill=False).fused_prefill(cuda)
    assert EngineOptions(compile_prefill=True).fused_prefill(cpu)

    asked = []

    class Recording(SpecEngine):
        def __init__(self, *a, compile_prefill=False, **kw):
            asked.append(compile_prefill)
            super().__init__(*a, **kw)

    monkeypatch.setattr(eaglet.speculative, "SpecEngine", Recording)
    monkeypatch.setattr(EngineOptions, "fused_prefill", lambda self, device: self.compile_prefill is not False)  # CUDA
    common = ["--target", str(chat_model_dir), "--draft", str(draft_dir), "--max-new-tokens", "2"]
    bench = ["bench", *common, "--methods", "spec", "--limit", "1", "--out", str(tmp_path)]
    assert main(["generate", *common, "--prompt", "the fox"]) == 0
    assert main(["generate", *common, "--prompt", "the fox", "--compile-prefill"]) == 0
    assert main(bench) == 0
    assert json.loads((tmp_path / "report.json").read_text())["config"]["compile_prefill"] is True
    assert main([*bench, "--no-compile-prefill"]) == 0
    assert asked == [False, True, True, False]


def test_a_frequency_ordered_draft_serves_the_vocabulary_asked_or_the_devices_default(chat_model_dir, draft_dir,
                                                                                     tmp_path, monkeypatch):
    """--draft-vocab cuts a frequency-ordered draft's vocabulary to its first N tokens; without it a CPU serves
    all of them with its LM head in int8, or SERVE_VOCAB of them (patched here below the tiny draft's 160) with
    the head left float32, and report.json says what was served."""
    import dataclasses

    from eaglet.draft.checkpoint import load_draft, save_draft

    draft, cfg = load_draft(draft_dir, 3)
    draft.config = dataclasses.replace(draft.config, vocab_by_frequency=True)
    save_draft(draft, tmp_path / "freq", target=cfg["eaglet"]["target"])
    monkeypatch.setattr("eaglet.speculative.load.SERVE_VOCAB", {"cpu": 96})
    common = ["bench", "--target", str(chat_model_dir), "--max-new-tokens", "4", "--methods", "spec", "--limit", "1"]
    served = []
    for extra in (["--no-int8-draft-head"], ["--draft-vocab", "40"], []):
        out = tmp_path / f"run{len(served)}"
        assert main([*common, "--draft", str(tmp_path / "freq"), "--out", str(out), *extra]) == 0
        config = json.loads((out / "report.json").read_text())["config"]
        served.append(config["draft_vocab"])
        assert config["int8_draft_head"] == ("--no-int8-draft-head" not in extra)
        assert config["int8_draft_layer"] == config["int8_draft_head"]  # a CPU's layer follows its head
    assert main([*common, "--draft", str(draft_dir), "--out", str(tmp_path / "by-id")]) == 0  # served whole
    served.append(json.loads((tmp_path / "by-id" / "report.json").read_text())["config"]["draft_vocab"])
    assert served == [96, 40, 160, 160]



def test_a_cpu_serves_a_related_draft_head_over_the_whole_vocabulary(chat_model_dir, tmp_path, capsys):
    """A draft whose head follows the target's (here: the target's own rows) is served over the target's whole
    vocabulary on a CPU by default (``extend_vocab``), as trained with --no-extend-draft-vocab; the flag asked of a
    draft it cannot map, or beside --draft-vocab, is one sentence and exit status 2."""
    import dataclasses

    from eaglet.draft.checkpoint import load_draft, save_draft
    from eaglet.loading import load_target

    head = load_target(str(chat_model_dir)).model.lm_head.weight
    random_dir = save_random_draft(chat_model_dir, tmp_path / "random", 288)
    draft, cfg = load_draft(random_dir, 3)
    draft.config = dataclasses.replace(draft.config, vocab_by_frequency=True)  # so that --draft-vocab may cut it
    with torch.no_grad():
        draft.lm_head.weight.copy_(head[draft.vocab_ids()])
    save_draft(draft, tmp_path / "related", target=cfg["eaglet"]["target"])
    common = ["bench", "--target", str(chat_model_dir), "--max-new-tokens", "4", "--methods", "spec", "--limit", "1"]
    served = []
    for name, extra in (("related", []), ("related", ["--no-extend-draft-vocab"]), ("random", [])):
        out = tmp_path / f"run{len(served)}"
        assert main([*common, "--draft", str(tmp_path / name), "--out", str(out), *extra]) == 0
        served.append(json.loads((out / "report.json").read_text())["config"]["draft_vocab"])
    assert served == [320, 288, 288]  # the random draft's head fits the target's at R^2 ~0.2: served as trained
    gen = ["generate", "--target", str(chat_model_dir), "--prompt", "hi", "--max-new-tokens", "2",
           "--extend-draft-vocab"]
    assert main([*gen, "--draft", str(random_dir)]) == 2
    assert "--extend-draft-vocab: the draft's head is unrelated to the target's" in capsys.readouterr().err
    assert main([*gen, "--draft", str(tmp_path / "related"), "--draft-vocab", "40"]) == 2
    assert "give one of them" in capsys.readouterr().err

def test_an_int8_draft_head_is_refused_where_it_cannot_run(chat_model_dir, draft_dir, capsys):
    """--int8-draft-head or --int8-draft-layer with --compile, or with a target in bfloat16: one sentence and exit
    status 2."""
    common = ["generate", "--target", str(chat_model_dir), "--draft", str(draft_dir), "--prompt", "hi",
              "--max-new-tokens", "2", "--int8-draft-head"]
    assert main([*common, "--compile"]) == 2
    assert "does not go with --compile" in capsys.readouterr().err
    assert main([*common, "--dtype", "bfloat16"]) == 2
    assert "needs a float32 target on an x86 CPU" in capsys.readouterr().err
    layer = [*common[:-1], "--int8-draft-layer"]  # the layer alone, the head as the device serves it
    assert main([*layer, "--compile"]) == 2
    assert "--int8-draft-layer does not go with --compile" in capsys.readouterr().err
    assert main([*layer, "--dtype", "bfloat16"]) == 2
    assert "an int8 draft layer needs a float32 target" in capsys.readouterr().err


def test_every_prompt_shape_is_warm_before_timing(chat_model_dir, draft_dir, prompts_file, tmp_path, monkeypatch):
    """Each of eaglet's methods runs every batch for two tokens before the timed runs (a first use of a prefill
    shape cost 0.5-1 s on an H200, paid by whichever method ran first), with the policy booking nothing."""
    import eaglet.bench.run as bench_run

    calls = []

    def recording(generator, prompts, params, batch_size, start=0):
        policy = getattr(generator, "policy", None)
        calls.append((type(generator).__name__, len(prompts), params.max_new_tokens,
                      None if policy is None else policy.adaptive))
        return run_ours(generator, prompts, params, batch_size, start)

    run_ours = bench_run.run_ours
    monkeypatch.setattr(bench_run, "run_ours", recording)
    assert main(["bench", "--target", str(chat_model_dir), "--draft", str(draft_dir), "--prompts", str(prompts_file),
                 "--methods", "plain,spec", "--max-new-tokens", "12", "--batch-size", "2",
                 "--out", str(tmp_path / "out")]) == 0
    # Warm-up and shape pass per method, then the timed batches with the methods in turn, who goes first
    # rotating (a machine whose speed drifts slows both alike).
    assert calls == [("PlainGenerator", 2, 12, None), ("PlainGenerator", 3, 2, None),
                     ("SpecEngine", 2, 12, True), ("SpecEngine", 3, 2, False),
                     ("PlainGenerator", 2, 12, None), ("SpecEngine", 2, 12, True),
                     ("SpecEngine", 1, 12, True), ("PlainGenerator", 1, 12, None)]


def test_batch_one_seconds_split_into_a_fixed_cost_and_a_cost_per_token():
    from eaglet.bench.methods import Run
    from eaglet.bench.report import seconds_fit

    runs = [Run([0] * n, 0.025 + 0.001 * n, "stop", batch=i) for i, n in enumerate((10, 50, 200, 7))]
    assert seconds_fit(runs) == {"fixed_ms": 25.0, "per_token_ms": 1.0}
    assert seconds_fit([Run([0] * 5, 0.1, "stop", batch=0), Run([0] * 9, 0.1, "stop", batch=0)]) is None  # one batch
    assert seconds_fit([Run([0] * 5, 0.1, "stop", batch=i) for i in range(3)]) is None  # no spread in tokens
