"""User errors reach the terminal as one sentence and exit status 2, never a traceback."""

import json

import pytest

from eaglet import __version__
from eaglet.cli import main
from eaglet.errors import EXIT_INTERNAL
from tests.bench.conftest import chat_tokenizer
from tests.conftest import make_hf_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli-model")
    tok = chat_tokenizer(300)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    make_hf_model("llama", seed=1, vocab_size=320, eos_token_id=eos).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert err[-1].startswith("eaglet: error: ")
    return err[-1]


def test_missing_model_path(capsys, tmp_path):
    msg = _error(capsys, ["generate", "--target", str(tmp_path / "nope"), "--prompt", "hi", "--draft", "none"])
    assert "neither a known model" in msg


def test_unsupported_architecture_is_named(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    msg = _error(capsys, ["generate", "--target", str(tmp_path), "--prompt", "hi", "--draft", "none"])
    assert "'gpt2'" in msg


def test_prompt_longer_than_context(capsys, model_dir):
    msg = _error(capsys, ["generate", "--target", str(model_dir), "--prompt", "the quick brown fox " * 20,
                          "--max-context", "16", "--draft", "none"])
    assert "context" in msg


@pytest.mark.parametrize("flag,value", [("--temperature", "-1"), ("--top-p", "0"), ("--top-k", "-2"),
                                        ("--max-new-tokens", "0")])
def test_invalid_sampling_values(capsys, model_dir, flag, value):
    msg = _error(capsys, ["generate", "--target", str(model_dir), "--prompt", "hi", "--draft", "none", flag, value])
    assert flag in msg


def test_generate_json_last_line(capsys, model_dir):
    assert main(["generate", "--target", str(model_dir), "--prompt", "the quick", "--draft", "none",
                 "--max-new-tokens", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"text", "completion_tokens", "tokens_per_s"} <= set(out)
    assert 0 < out["completion_tokens"] <= 5


def _subparsers(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from ((f"{name} {n}", s) for n, s in _subparsers(sub))


def test_help_documents_every_option_with_its_default(capsys):
    import argparse

    from eaglet.cli import build_parser

    parser = build_parser()
    for name, sub in _subparsers(parser):
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue  # its commands carry the help
            assert action.help, f"eaglet {name} {action.option_strings or action.dest} has no help"
        text = sub.format_help()
        if name == "train":
            assert "--lr LR" in text and "(default: 0.0005)" in text and "(default: 0)" in text  # falsy too
    top = parser.format_help()
    assert "examples:" in top and "eaglet train --regenerate" in top and "exit status" in top
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"eaglet {__version__}"


def test_tree_and_sampling_top_k_have_distinct_names_and_old_aliases():
    from eaglet.cli import build_parser

    parser = build_parser()
    base = ["generate", "--prompt", "hi"]
    for flags in (["--tree-topk", "4", "--sample-top-k", "7"], ["--topk", "4", "--top-k", "7"]):
        args = parser.parse_args([*base, *flags])
        assert (args.topk, args.top_k) == (4, 7)
    assert "not sampling's --sample-top-k" in parser._subparsers._group_actions[0].choices["generate"].format_help()


def test_an_internal_error_is_one_sentence_and_the_traceback_goes_to_a_log(capsys, monkeypatch, tmp_path):
    import eaglet.commands as commands

    def broken(_args):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setenv("EAGLET_CACHE", str(tmp_path))
    monkeypatch.setitem(commands.COMMANDS, "generate", broken)
    assert main(["generate", "--prompt", "hi", "--draft", "none", "--device", "cpu"]) == EXIT_INTERNAL
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("eaglet: internal error (ZeroDivisionError: division by zero)") and "report" in line
    [log] = (tmp_path / "logs").glob("error-*.log")
    assert str(log) in line and "Traceback" in log.read_text() and "broken" in log.read_text()


def test_an_answer_cut_by_max_context_says_so(capsys, model_dir):
    assert main(["generate", "--target", str(model_dir), "--prompt", "the quick", "--draft", "none",
                 "--max-context", "24", "--max-new-tokens", "100", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out.strip().splitlines()[-1])
    assert out["finish_reason"] == "length" and out["prompt_tokens"] + out["completion_tokens"] <= 24
    assert "filled the 24-token context; raise --max-context" in captured.err


def test_serve_without_its_http_stack_says_so_before_loading(capsys, model_dir, monkeypatch):
    import importlib.util

    import eaglet.serve.server as server

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    monkeypatch.setattr(server, "load_engine", lambda *a, **k: pytest.fail("loaded before checking the packages"))
    msg = _error(capsys, ["serve", "--target", str(model_dir), "--draft", "none"])
    assert "eaglet serve needs uvicorn" in msg
