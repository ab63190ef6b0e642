"""Bad input to every command: exit status 2, one line naming the option, no traceback, nothing changed.

Every case is refused before a model loads (loading is made to fail loudly here), so the
whole table runs in seconds. ``docs/errors.md`` lists the cases and what each says.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from eaglet.cli import main
from eaglet.data.regenerate import meta_path, regen_settings
from eaglet.sampling import SamplingParams
from tests.conftest import save_random_draft
from tests.train.helpers import make_tiny_target_dir, prompts, write_jsonl

M, DR, P, A = "{model}", "{draft}", "{prompts}", "{answers}"
GEN = ["generate", "--target", M, "--draft", "none", "--prompt", "hi"]
BENCH = ["bench", "--target", M, "--draft", DR, "--out", "{ws}/bench"]
REGEN = ["data", "regenerate", "--target", M, "--data", P, "--out", "{ws}/r.jsonl"]
CAPTURE = ["data", "capture", "--target", M, "--data", A, "--out", "{ws}/features"]
TRAIN = ["train", "--target", M, "--data", A, "--out", "{ws}/run"]
IMPORT = ["draft", "import", DR, "{ws}/imported", "--target", M]
DOCTOR = ["doctor", "--target", M, "--draft", DR]

CASES = [  # (id, argv, words the message must hold)
    ("gen-max-new-tokens-0", [*GEN, "--max-new-tokens", "0"], ["--max-new-tokens", "integer >= 1", "'0'"]),
    ("gen-temperature-negative", [*GEN, "--temperature", "-1"], ["--temperature", ">= 0", "'-1'"]),
    ("gen-top-p-0", [*GEN, "--top-p", "0"], ["--top-p", "(0, 1]", "'0'"]),
    ("gen-top-p-1.5", [*GEN, "--top-p", "1.5"], ["--top-p", "'1.5'"]),
    ("gen-top-p-nan", [*GEN, "--top-p", "nan"], ["--top-p", "'nan'"]),
    ("gen-top-k-negative", [*GEN, "--top-k", "-2"], ["--top-k", "'-2'"]),
    ("gen-max-context-1", [*GEN, "--max-context", "1"], ["--max-context", ">= 2"]),
    ("gen-max-context-text", [*GEN, "--max-context", "lots"], ["--max-context", "'lots'"]),
    ("gen-empty-prompt", [*GEN[:-1], ""], ["--prompt", "empty"]),
    ("gen-blank-prompt", [*GEN[:-1], "   "], ["--prompt", "empty"]),
    ("gen-device-tpu", [*GEN, "--device", "tpu"], ["--device", "cpu, cuda or cuda:N", "'tpu'"]),
    ("gen-device-cuda-9", [*GEN, "--device", "cuda:9"], ["--device", "'cuda:9'", "--device cpu"]),
    ("gen-dtype", [*GEN, "--dtype", "float8"], ["--dtype", "'float8'"]),
    ("gen-tp-0", [*GEN, "--tp", "0"], ["--tp", "'0'"]),
    ("gen-target-missing", ["generate", "--target", "{ws}/nope", "--prompt", "hi"], ["--target", "neither"]),
    ("gen-target-not-gguf", ["generate", "--target", "{file}", "--prompt", "hi"], ["--target", "not a .gguf"]),
    ("gen-target-no-config", ["generate", "--target", "{empty}", "--prompt", "hi"], ["--target", "no config.json"]),
    ("gen-draft-missing", [*GEN[:3], "--draft", "{ws}/nope", "--prompt", "hi"], ["--draft", "not a draft"]),
    ("gen-draft-truncated", [*GEN[:3], "--draft", "{draft_truncated}", "--prompt", "hi"], ["--draft", "truncated"]),
    ("gen-draft-shard-missing", [*GEN[:3], "--draft", "{draft_no_shard}", "--prompt", "hi"], ["--draft", "missing"]),
    ("gen-draft-vocab-id-ordered", [*GEN[:3], "--draft", DR, "--prompt", "hi", "--draft-vocab", "8"],
     ["--draft-vocab 8", "by token id, not by frequency", "leave --draft-vocab out"]),
    ("gen-draft-vocab-0", [*GEN, "--draft-vocab", "0"], ["--draft-vocab", "integer >= 1", "'0'"]),
    ("gen-tree-partial", [*GEN, "--num-steps", "3"], ["--tree-topk", "--num-draft-tokens", "missing"]),
    ("gen-tree-topk-0", [*GEN, "--tree-topk", "0"], ["--tree-topk", "'0'"]),
    ("gen-tree-inconsistent", [*GEN, "--num-steps", "2", "--topk", "1", "--num-draft-tokens", "5"],
     ["num_draft_tokens must be 3"]),
    ("gen-num-draft-tokens-1", [*GEN, "--num-draft-tokens", "1"], ["--num-draft-tokens", ">= 2"]),
    ("gen-no-prompt", GEN[:5], ["required", "--prompt"]),
    ("gen-unknown-option", [*GEN, "--frobnicate"], ["unrecognized", "--frobnicate"]),
    ("bench-limit-0", [*BENCH, "--limit", "0"], ["--limit", ">= 1"]),
    ("bench-concurrency-0", [*BENCH, "--endpoint", "http://127.0.0.1:9", "--concurrency", "0"],
     ["--concurrency", ">= 1"]),
    ("bench-request-rate-0", [*BENCH, "--endpoint", "http://127.0.0.1:9", "--request-rate", "0"],
     ["--request-rate", "> 0"]),
    ("serve-port-0", ["serve", "--target", M, "--port", "0"], ["--port", ">= 1", "'0'"]),
    ("serve-max-batch-0", ["serve", "--target", M, "--max-batch", "0"], ["--max-batch", ">= 1"]),
    ("serve-max-queue-0", ["serve", "--target", M, "--max-queue", "0"], ["--max-queue", ">= 1"]),
    ("serve-grace-negative", ["serve", "--target", M, "--grace", "-5"], ["--grace", ">= 0"]),
    ("serve-draft-missing", ["serve", "--target", M, "--draft", "{ws}/nope"], ["--draft", "not a draft"]),
    ("serve-batch-sizes-0", ["serve", "--target", M, "--batch-sizes", "0,4"], ["--batch-sizes", "'0,4'"]),
    ("serve-batch-sizes-disagree", ["serve", "--target", M, "--max-batch", "8", "--batch-sizes", "1,16"],
     ["--max-batch 8", "--batch-sizes 1,16", "disagree"]),
    ("serve-tp-not-dividing", ["serve", "--target", M, "--draft", "none", "--tp", "3"], ["tp=3", "divide"]),
    ("bench-batch-size-0", [*BENCH, "--batch-size", "0"], ["--batch-size", ">= 1"]),
    ("bench-prompts-missing", [*BENCH, "--prompts", "{ws}/nope.jsonl"], ["--prompts", "does not exist"]),
    ("bench-prompts-dir", [*BENCH, "--prompts", "{empty}"], ["--prompts", "is a directory"]),
    ("bench-out-file", [*BENCH[:-1], "{file}"], ["--out", "is a file"]),
    ("bench-out-foreign", [*BENCH[:-1], "{foreign}"], ["--out", "eaglet did not write"]),
    ("bench-out-unwritable", [*BENCH[:-1], "/proc/eaglet-test/bench"], ["--out", "cannot write"]),
    ("bench-out-under-file", [*BENCH[:-1], "{file}/bench"], ["--out", "is a file, not a directory"]),
    ("bench-methods", [*BENCH, "--methods", "plain,fast"], ["--methods", "choose from"]),
    ("bench-draft-missing", ["bench", "--target", M, "--draft", "{ws}/nope", "--out", "{ws}/b"], ["--draft"]),
    ("bench-no-out", BENCH[:5], ["required", "--out"]),
    ("regen-batch-size-0", [*REGEN, "--batch-size", "0"], ["--batch-size", ">= 1"]),
    ("regen-max-new-tokens-0", [*REGEN, "--max-new-tokens", "0"], ["--max-new-tokens", ">= 1"]),
    ("regen-max-prompt-tokens-0", [*REGEN, "--max-prompt-tokens", "0"], ["--max-prompt-tokens"]),
    ("regen-max-samples-0", [*REGEN, "--max-samples", "0"], ["--max-samples", ">= 1"]),
    ("regen-max-val-samples-negative", [*REGEN, "--max-val-samples", "-1"], ["--max-val-samples", ">= 0"]),
    ("regen-time-budget-0", [*REGEN, "--time-budget-min", "0"], ["--time-budget-min", "> 0"]),
    ("regen-top-p-0", [*REGEN, "--top-p", "0"], ["--top-p"]),
    ("regen-split", [*REGEN, "--split", "test"], ["--split", "'test'"]),
    ("regen-answers-text", [*REGEN, "--answers", "greedy,hot"], ["--answers", "greedy,0.7,1.0", "'greedy,hot'"]),
    ("regen-answers-repeated", [*REGEN, "--answers", "0.7,0.7"], ["--answers", "distinct", "'0.7,0.7'"]),
    ("regen-answers-negative", [*REGEN, "--answers", "greedy,-1"], ["--answers", "'greedy,-1'"]),
    ("regen-self-prompts-negative", [*REGEN, "--self-prompts", "-5"], ["--self-prompts", ">= 0"]),
    ("regen-follow-ups-2", [*REGEN, "--follow-ups", "2"], ["--follow-ups", "[0, 1]", "'2'"]),
    ("regen-follow-ups-without-greedy", [*REGEN, "--follow-ups", "0.5", "--answers", "0.7"],
     ["--follow-ups", "no greedy", "--answers 0.7"]),
    ("regen-openers-without-self-prompts", [*REGEN, "--self-prompt-openers", "0.5"],
     ["--self-prompt-openers", "--self-prompts N"]),
    ("regen-data-missing", [*REGEN[:5], "{ws}/nope.jsonl", *REGEN[6:]], ["--data", "does not exist"]),
    ("regen-data-one-missing", [*REGEN[:5], P + ",{ws}/nope.jsonl", *REGEN[6:]], ["--data", "nope.jsonl"]),
    ("regen-out-is-data", [*REGEN[:-1], P], ["--out", "input of --data"]),
    ("regen-out-dir", [*REGEN[:-1], "{empty}"], ["--out", "is a directory"]),
    ("regen-out-foreign-file", [*REGEN[:-1], "{foreign_jsonl}"], ["did not write it", "--restart"]),
    ("regen-other-settings", [*REGEN[:-1], "{regen_done}", "--max-new-tokens", "16"],
     ["other settings", "max_new_tokens 8 then, 16 now", "--restart"]),
    ("regen-out-unwritable", [*REGEN[:-1], "/proc/eaglet-test/r.jsonl"], ["--out", "cannot write"]),
    ("regen-endpoint-no-scheme", [*REGEN, "--endpoint", "localhost:8000"],
     ["--endpoint", "http://127.0.0.1:8000", "'localhost:8000'"]),
    ("regen-endpoint-ftp", [*REGEN, "--endpoint", "ftp://host/v1"], ["--endpoint", "'ftp://host/v1'"]),
    ("regen-endpoint-bad-port", [*REGEN, "--endpoint", "http://host:99999"], ["--endpoint", "'http://host:99999'"]),
    ("regen-endpoint-no-host", [*REGEN, "--endpoint", "http://:8000"], ["--endpoint", "'http://:8000'"]),
    ("regen-model-without-endpoint", [*REGEN, "--model", "m"], ["--model applies only with --endpoint"]),
    ("regen-concurrency-without-endpoint", [*REGEN, "--concurrency", "4"], ["--concurrency", "--endpoint"]),
    ("regen-concurrency-0", [*REGEN, "--endpoint", "http://127.0.0.1:9", "--concurrency", "0"],
     ["--concurrency", ">= 1"]),
    ("regen-endpoint-self-prompts", [*REGEN, "--endpoint", "http://127.0.0.1:9", "--self-prompts", "4"],
     ["--self-prompts", "local target", "--endpoint"]),
    ("bench-endpoint-url", [*BENCH, "--endpoint", "127.0.0.1:8000", "--concurrency", "1"],
     ["--endpoint", "'127.0.0.1:8000'"]),
    ("capture-shard-samples-0", [*CAPTURE, "--shard-samples", "0"], ["--shard-samples", ">= 1"]),
    ("capture-batch-tokens-0", [*CAPTURE, "--batch-tokens", "0"], ["--batch-tokens", ">= 1"]),
    ("capture-max-len-4", [*CAPTURE, "--max-len", "4"], ["--max-len", ">= 8"]),
    ("capture-points-text", [*CAPTURE, "--capture", "1,x"], ["--capture", "'1,x'"]),
    ("capture-points-negative", [*CAPTURE, "--capture", "-1"], ["--capture", "'-1'"]),
    ("capture-points-empty", [*CAPTURE, "--capture", ","], ["--capture"]),
    ("capture-feature-dtype", [*CAPTURE, "--feature-dtype", "float16"], ["--feature-dtype"]),
    ("capture-data-missing", [*CAPTURE[:5], "{ws}/nope.jsonl", *CAPTURE[6:]], ["--data", "does not exist"]),
    ("capture-data-builtin", [*CAPTURE[:5], "builtin", *CAPTURE[6:]], ["--data builtin", "does not exist"]),
    ("capture-out-file", [*CAPTURE[:-1], "{file}"], ["--out", "is a file"]),
    ("capture-out-foreign", [*CAPTURE[:-1], "{foreign}"], ["--out", "eaglet did not write"]),
    ("train-lr-0", [*TRAIN, "--lr", "0"], ["--lr", "> 0"]),
    ("train-decay-0", [*TRAIN, "--decay", "0"], ["--decay", "(0, 1]"]),
    ("train-decay-1.5", [*TRAIN, "--decay", "1.5"], ["--decay"]),
    ("train-grad-clip-0", [*TRAIN, "--grad-clip", "0"], ["--grad-clip"]),
    ("train-batch-tokens-8", [*TRAIN, "--batch-tokens", "8"], ["--batch-tokens", ">= 16"]),
    ("train-recipe-without-regenerate", [*TRAIN, "--recipe", "chat"], ["--recipe chat", "add --regenerate"]),
    ("train-recipe-unknown", [*TRAIN, "--regenerate", "--recipe", "best"], ["--recipe", "'best'", "chat"]),
    ("train-val-fraction-1", [*TRAIN, "--val-fraction", "1"], ["--val-fraction", "[0, 1)"]),
    ("train-min-lr-ratio-2", [*TRAIN, "--min-lr-ratio", "2"], ["--min-lr-ratio"]),
    ("train-epochs-0", [*TRAIN, "--epochs", "0"], ["--epochs"]),
    ("train-max-steps-0", [*TRAIN, "--max-steps", "0"], ["--max-steps"]),
    ("train-save-every-0", [*TRAIN, "--save-every", "0"], ["--save-every"]),
    ("train-ttt-steps-0", [*TRAIN, "--ttt-steps", "0"], ["--ttt-steps"]),
    ("train-warmup-negative", [*TRAIN, "--warmup-steps", "-1"], ["--warmup-steps"]),
    ("train-draft-vocab-0", [*TRAIN, "--draft-vocab-size", "0"], ["--draft-vocab-size"]),
    ("train-aux-noise-negative", [*TRAIN, "--aux-noise", "-0.1"], ["--aux-noise", ">= 0", "'-0.1'"]),
    ("train-label-temperature-0", [*TRAIN, "--label-temperature", "0"], ["--label-temperature", "> 0", "'0'"]),
    ("train-ttt-reach-negative", [*TRAIN, "--ttt-reach", "-1"], ["--ttt-reach", "'-1'"]),
    ("train-answers-without-regenerate", [*TRAIN, "--answers", "greedy,0.7"], ["--answers", "--regenerate"]),
    ("train-self-prompts-without-regenerate", [*TRAIN, "--self-prompts", "100"], ["--self-prompts", "--regenerate"]),
    ("train-tokens-per-s-without-budget", [*TRAIN[:3], "--data", "builtin", "--regenerate", "--out", "{ws}/run",
                                           "--train-tokens-per-s", "1000"], ["--train-tokens-per-s",
                                                                              "--time-budget-min"]),
    ("train-tokens-per-s-0", [*TRAIN, "--train-tokens-per-s", "0"], ["--train-tokens-per-s", "> 0"]),
    ("train-regen-batch-size-0", [*TRAIN, "--regenerate", "--regen-batch-size", "0"], ["--regen-batch-size"]),
    ("train-builtin-without-regenerate", [*TRAIN[:3], "--data", "builtin", "--out", "{ws}/run"],
     ["--data builtin", "--regenerate"]),
    ("train-data-missing", [*TRAIN[:3], "--data", "{ws}/nope.jsonl", "--out", "{ws}/run"], ["--data"]),
    ("train-regenerate-into-its-data", ["train", "--target", M, "--regenerate", "--data", "{ws}/run/regenerated.jsonl",
                                        "--out", "{ws}/run"], ["--data", "where --regenerate writes"]),
    ("train-out-file", [*TRAIN[:-1], "{file}"], ["--out", "is a file"]),
    ("train-out-foreign", [*TRAIN[:-1], "{foreign}"], ["--out", "eaglet did not write"]),
    ("train-features-missing", [*TRAIN, "--features", "{ws}/nope"], ["--features", "not a feature directory"]),
    ("train-features-unfinished", [*TRAIN, "--features", "{features_unfinished}"], ["--features", "lacks 1 shards"]),
    ("train-features-truncated", [*TRAIN, "--features", "{features_truncated}"], ["--features", "truncated"]),
    ("train-val-features-missing", [*TRAIN, "--val-features", "{empty}"], ["--val-features"]),
    ("import-src-missing", ["draft", "import", "{ws}/nope", "{ws}/imported", "--target", M], ["SRC", "not a draft"]),
    ("import-src-truncated", ["draft", "import", "{draft_truncated}", "{ws}/imported", "--target", M],
     ["SRC", "truncated"]),
    ("import-out-not-empty", [*IMPORT[:3], "{foreign}", *IMPORT[4:]], ["OUT", "not empty", "--overwrite"]),
    ("import-out-cwd", [*IMPORT[:3], ".", *IMPORT[4:], "--overwrite"], ["OUT", "current directory"]),
    ("import-out-holds-src", [*IMPORT[:3], "{draft_parent}", *IMPORT[4:], "--overwrite"], ["OUT", "holds SRC"]),
    ("import-out-is-src", [*IMPORT[:3], DR, *IMPORT[4:], "--overwrite"], ["OUT", "holds SRC"]),
    ("import-out-file", [*IMPORT[:3], "{file}", *IMPORT[4:]], ["OUT", "is a file"]),
    ("import-ids-without-convention", [*IMPORT, "--capture-ids", "0,1"], ["--capture-ids", "--convention"]),
    ("import-convention", [*IMPORT, "--capture-ids", "0,1", "--convention", "hf"], ["--convention", "'hf'"]),
    ("import-ids-text", [*IMPORT, "--capture-ids", "a,b"], ["--capture-ids", "'a,b'"]),
    ("import-no-out", IMPORT[:3], ["required", "OUT"]),
    ("doctor-json-dir", [*DOCTOR, "--json", "{empty}"], ["--json", "is a directory"]),
    ("doctor-json-unwritable", [*DOCTOR, "--json", "/proc/eaglet-test/d.json"], ["--json", "cannot write"]),
    ("doctor-json-under-file", [*DOCTOR, "--json", "{file}/d.json"], ["--json", "is a file"]),
    ("doctor-num-prompts-0", [*DOCTOR, "--num-prompts", "0"], ["--num-prompts", ">= 1"]),
    ("doctor-max-new-tokens-2", [*DOCTOR, "--max-new-tokens", "2"], ["--max-new-tokens", ">= 4"]),
    ("doctor-features-missing", [*DOCTOR, "--features", "{ws}/nope"], ["--features"]),
    ("doctor-prompts-missing", [*DOCTOR, "--prompts", "{ws}/nope.jsonl"], ["--prompts", "does not exist"]),
    ("doctor-draft-missing", ["doctor", "--target", M, "--draft", "{ws}/nope"], ["--draft", "not a draft"]),
    ("doctor-tree-partial", [*DOCTOR, "--tree-topk", "4"], ["--num-steps", "missing"]),
    ("no-command", [], ["required", "COMMAND"]),
    ("unknown-command", ["server"], ["'server'"]),
    ("data-no-subcommand", ["data"], ["required", "SUBCOMMAND"]),
]


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[:-64])


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> dict[str, str]:
    """Every input the cases name: good ones (model, draft, prompts, answers) and bad ones."""
    ws = tmp_path_factory.mktemp("bad-inputs")
    model = make_tiny_target_dir(ws / "model")
    draft = save_random_draft(model, ws / "drafts" / "draft", 64)
    shards = sorted(draft.glob("*.safetensors"))
    truncated = ws / "draft-truncated"
    truncated.mkdir()
    for f in draft.iterdir():
        (truncated / f.name).write_bytes(f.read_bytes())
    _truncate(truncated / shards[-1].name)
    no_shard = ws / "draft-no-shard"
    no_shard.mkdir()
    (no_shard / "config.json").write_bytes((draft / "config.json").read_bytes())
    index = {"weight_map": {"fc.weight": "gone.safetensors"}}
    (no_shard / "model.safetensors.index.json").write_text(json.dumps(index))
    ps = prompts(4, seed=5)
    good = write_jsonl(ws / "prompts.jsonl", [{"messages": list(p.messages)} for p in ps])
    answered = [{"messages": [*p.messages, {"role": "assistant", "content": "ok"}]} for p in ps]
    answers = write_jsonl(ws / "answers.jsonl", answered)
    foreign = ws / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    (ws / "empty").mkdir()
    (ws / "file.txt").write_text("a file")
    foreign_jsonl = write_jsonl(ws / "mine.jsonl", [{"messages": list(ps[0].messages)}])
    regen_done = write_jsonl(ws / "done.jsonl", answered[2:3])
    (ws / "run").mkdir()
    write_jsonl(ws / "run" / "regenerated.jsonl", [{"messages": list(ps[1].messages)}])
    meta_path(regen_done).write_text(json.dumps(regen_settings(str(model), SamplingParams(max_new_tokens=8))))
    return {"ws": str(ws), "model": str(model), "draft": str(draft), "draft_parent": str(draft.parent),
            "draft_truncated": str(truncated), "draft_no_shard": str(no_shard), "prompts": str(good),
            "answers": str(answers), "foreign": str(foreign), "empty": str(ws / "empty"), "file": str(ws / "file.txt"),
            "foreign_jsonl": str(foreign_jsonl), "regen_done": str(regen_done),
            "features_unfinished": str(_features(ws / "features-unfinished", truncate=False)),
            "features_truncated": str(_features(ws / "features-truncated", truncate=True))}


def _features(path: Path, truncate: bool) -> Path:
    """A two-shard feature directory whose second shard is missing or truncated."""
    from safetensors.torch import save_file

    from eaglet.data.features import FORMAT

    path.mkdir()
    (path / "manifest.json").write_text(json.dumps({"format": FORMAT, "num_samples": 2, "shard_samples": 1}))
    save_file({"ids": torch.zeros(8, dtype=torch.int32)}, str(path / "shard-00000.safetensors"))
    if truncate:
        save_file({"ids": torch.zeros(8, dtype=torch.int32)}, str(path / "shard-00001.safetensors"))
        _truncate(path / "shard-00001.safetensors")
    return path


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def no_loading(monkeypatch):
    """Loading or converting a model fails loudly: every case must be refused before that."""
    import eaglet.loading.target as target

    def refuse(*_a, **_k):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(target, "load_model", refuse)
    monkeypatch.setattr(target, "_convert_gguf", refuse)


@pytest.mark.parametrize("argv,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(places, no_loading, monkeypatch, capsys, argv, words):
    if "{ws}/imported" in argv or "." in argv:
        monkeypatch.chdir(places["ws"])
    argv = [a.format(**places) for a in argv]
    words = [w.format(**places) for w in words]
    before = _snapshot(Path(places["ws"]))
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1 and lines[0].startswith("eaglet: error: "), captured.err
    assert "Traceback" not in captured.err and not captured.out
    for w in words:
        assert w in lines[0], f"{w!r} not in {lines[0]!r}"
    assert _snapshot(Path(places["ws"])) == before, "a pre-existing file changed"


def test_at_least_sixty_cases_cover_every_command():
    assert len(CASES) >= 60
    firsts = {tuple(c[1][:2]) if c[1][:1] in (["data"], ["draft"]) else tuple(c[1][:1]) for c in CASES}
    for command in [("generate",), ("bench",), ("data", "regenerate"), ("data", "capture"), ("train",),
                    ("draft", "import"), ("doctor",), ("serve",)]:
        assert command in firsts, command


def test_docs_errors_lists_every_case():
    text = (Path(__file__).resolve().parents[1] / "docs" / "errors.md").read_text()
    assert not [c[0] for c in CASES if f"`{c[0]}`" not in text], "docs/errors.md is missing cases"
