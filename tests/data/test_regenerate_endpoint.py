"""`data regenerate --endpoint URL`: our own `eaglet serve` (tiny target, 127.0.0.1) answers the prompts.

The records are those of local regeneration (greedy: the same answers) and training reads them;
the run resumes after an interrupt; a refused request and an unreachable server end in one sentence.
"""

from __future__ import annotations

import json

import pytest

from eaglet.cli import main
from eaglet.data.prompts import read_jsonl
from eaglet.data.regenerate import meta_path
from eaglet.data.template import tokenize_conversations
from tests.serve.conftest import Served, free_port, new_engine
from tests.train.helpers import interrupt_on_call, load_tiny, make_tiny_target_dir, prompts, write_jsonl


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.conftest import save_random_draft

    root = tmp_path_factory.mktemp("regen-serve")
    target = make_tiny_target_dir(root / "target")
    # The policy off: under it the tree may change between two runs, and with it the draws a seed fixes
    # (docs/serving.md); these tests compare runs.
    s = Served(new_engine((target, save_random_draft(target, root / "draft", 64)), adaptive=False))
    s.target_dir = target
    yield s
    s.stop()


def _argv(server, tmp_path, out: str, n: int = 6, *extra: str) -> list[str]:
    src = tmp_path / "p.jsonl"
    if not src.exists():
        write_jsonl(src, [{"messages": list(p.messages), "split": "train"} for p in prompts(n, seed=41)])
    return ["data", "regenerate", "--target", str(server.target_dir), "--data", str(src), "--out",
            str(tmp_path / out), "--max-new-tokens", "8", *extra]


def _records(path) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_greedy_answers_through_a_server_are_local_regenerations(server, tmp_path, capsys):
    assert main([*_argv(server, tmp_path, "remote.jsonl"), "--endpoint", server.url, "--concurrency", "3"]) == 0
    assert main([*_argv(server, tmp_path, "local.jsonl"), "--device", "cpu"]) == 0
    remote, local = _records(tmp_path / "remote.jsonl"), _records(tmp_path / "local.jsonl")
    assert sorted(remote) == sorted(local) and len(remote) == 6
    for i, r in remote.items():
        assert r["messages"] == local[i]["messages"], i  # the same prompt and the same greedy answer
        assert (r["finish_reason"], r["prompt_tokens"], r["completion_tokens"]) == (
            local[i]["finish_reason"], local[i]["prompt_tokens"], local[i]["completion_tokens"])
        assert "answer_ids" not in r and r["target_turns"] == 1  # the server's ids are unknown; the target wrote it
    meta = json.loads(meta_path(tmp_path / "remote.jsonl").read_text())
    assert meta["endpoint"] == f"{server.url}/v1" and meta["model"] == server.model and "target" not in meta
    # Training reads the records: the answer's text, re-encoded, is the target's greedy answer here.
    convs, bad = read_jsonl(tmp_path / "remote.jsonl")
    tok = load_tiny(server.target_dir).tokenizer
    items = tokenize_conversations(tok, convs, {tok.eos_token_id})
    assert bad == 0 and all(t is not None and any(t.mask) for t in items)
    # A rerun with the same settings has nothing left to do.
    capsys.readouterr()
    assert main([*_argv(server, tmp_path, "remote.jsonl"), "--endpoint", server.url]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["written"] == 0


def test_an_interrupted_endpoint_run_resumes(server, tmp_path, monkeypatch, capsys):
    import eaglet.data.regenerate as regen

    argv = [*_argv(server, tmp_path, "r.jsonl", 10), "--endpoint", server.url, "--concurrency", "2",
            "--answers", "greedy,1.0"]
    with monkeypatch.context() as m:
        interrupt_on_call(m, regen._Records, "add", call=2)
        assert main(argv) == 130
    out = tmp_path / "r.jsonl"
    kept = len(out.read_text().splitlines())
    assert f"{kept} answers were added" in capsys.readouterr().err and 0 < kept < 20
    assert main(argv) == 0
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert len(ids) == 20 and len(set(ids)) == 20  # none lost, none repeated
    # Each sampled answer carried its own seed: a second run writes the same sampled answers.
    again = [*_argv(server, tmp_path, "again.jsonl", 10), "--endpoint", server.url, "--answers", "greedy,1.0"]
    assert main(again) == 0
    assert sorted(out.read_text().splitlines()) == sorted((tmp_path / "again.jsonl").read_text().splitlines())


def _one_error(capsys) -> str:
    """The run's last word: one line of error (progress lines may come before it), no traceback."""
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("eaglet: error: ") and "Traceback" not in err, err
    return last


def test_a_refused_request_is_one_sentence_naming_the_status_and_the_servers_reason(server, tmp_path, capsys):
    # The test server's context holds 256 tokens: 1000 new tokens can never fit, retrying will not help.
    argv = [*_argv(server, tmp_path, "r.jsonl"), "--endpoint", server.url, "--max-new-tokens", "1000"]
    assert main(argv) == 2
    line = _one_error(capsys)
    assert "HTTP 400" in line and "max_tokens=1000 does not fit" in line
    assert main([*_argv(server, tmp_path, "r.jsonl"), "--endpoint", server.url, "--model", "other"]) == 2
    assert "not --model 'other'" in _one_error(capsys)


def test_an_unreachable_server_is_one_sentence(server, tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main([*_argv(server, tmp_path, "r.jsonl"), "--endpoint", url]) == 2
    line = _one_error(capsys)
    assert "cannot reach" in line and "127.0.0.1" in line
    assert not (tmp_path / "r.jsonl").exists()
