"""User errors reach the terminal as one sentence and exit status 2, never a traceback."""

import json

import pytest

from eaglet.cli import main
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
