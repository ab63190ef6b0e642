"""Token ids and the assistant-only loss mask of a conversation, located through the chat template.

The template is rendered prefix by prefix: for assistant message ``i`` the text up to
``messages[:i]`` with the generation prompt marks where the answer starts, and the text
of ``messages[:i+1]`` where it ends. Both must be string prefixes of the whole
conversation's text (true of the Llama/ChatML/Qwen/SmolLM2 templates); the character
spans are then mapped onto the tokens of the whole text through the tokenizer's offsets,
so BPE merges across a boundary cannot shift the mask.

Inside an answer span the mask keeps tokens up to and including the first end-of-turn
(EOS) token: the draft must learn to predict it, but never the template's text after it
(a newline the target does not generate, since decoding stops at EOS). An answer cut
at the length limit keeps no EOS: the target would not have ended there.

Earlier assistant turns are trained on too unless ``earlier_turns`` is off: then only the
turns the target wrote itself (``Conversation.target_turns``, at least the last) carry loss,
and the turns a dataset author wrote are context only.

A conversation that carries the target's own ids for its last answer (``answer_ids``,
written by ``data regenerate``) is assembled as tokens(text before the answer) + those
ids + tokens(text after it), so training reads exactly the sequence the target produced:
re-encoding the decoded text gives other tokens for a few percent of answers (3.4% of
3,000 SmolLM2 answers changed their token count).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eaglet.data.prompts import Conversation
from eaglet.errors import EagletError


@dataclass(frozen=True)
class Tokenized:
    ids: list[int]
    mask: list[bool]  # True where the token belongs to an assistant answer (loss is taken there)


def _render(tokenizer, messages: Sequence[dict], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                         tokenize=False)


def answer_spans(tokenizer, messages: Sequence[dict]) -> tuple[str, list[tuple[int, int]]]:
    """(the conversation's text, the [start, end) character span of every assistant message)."""
    if not getattr(tokenizer, "chat_template", None):
        raise EagletError("the target's tokenizer has no chat template; eaglet needs one to build training data")
    full = _render(tokenizer, messages, False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = _render(tokenizer, messages[:i], True)
        end = _render(tokenizer, messages[: i + 1], False)
        if not (full.startswith(start) and full.startswith(end) and len(start) <= len(end)):
            raise EagletError("the chat template does not render a conversation prefix by prefix, so eaglet "
                              "cannot locate the assistant turns in it")
        spans.append((len(start), len(end)))
    return full, spans


def tokenize_conversations(tokenizer, convs: Sequence[Conversation], eos_ids: set[int],
                           max_len: int | None = None, chunk: int = 512,
                           earlier_turns: bool = True) -> list[Tokenized | None]:
    """Tokenized conversations (None where nothing of an answer fits in ``max_len`` tokens).

    Texts are tokenized in chunks of ``chunk`` through the fast tokenizer's batched call.
    """
    out: list[Tokenized | None] = []
    for lo in range(0, len(convs), chunk):
        part = convs[lo: lo + chunk]
        pieces = [_pieces(c, *answer_spans(tokenizer, c.messages)) for c in part]
        enc = tokenizer([t for p in pieces for t in p[0]], add_special_tokens=False, return_offsets_mapping=True)
        k = 0
        for c, (texts, spans) in zip(part, pieces):
            keep = len(spans) if earlier_turns else max(c.target_turns, 1)
            spans = [(0, 0)] * (len(spans) - keep) + spans[len(spans) - keep:]  # an empty span masks nothing
            if len(texts) == 1:  # re-encode the whole text
                ids, offsets = enc["input_ids"][k], enc["offset_mapping"][k]
                mask = _mask(ids, offsets, spans, eos_ids, c.truncated)
            else:  # text before the answer, the target's ids, text after it
                (pre, post), (pre_off, post_off) = enc["input_ids"][k: k + 2], enc["offset_mapping"][k: k + 2]
                ids = [*pre, *c.answer_ids, *post]
                mask = (_mask(pre, pre_off, spans[:-1], eos_ids, False) + [True] * len(c.answer_ids)
                        + _mask(post, post_off, spans[-1:], eos_ids, c.truncated))
            k += len(texts)
            if max_len is not None:
                ids, mask = ids[:max_len], mask[:max_len]
            out.append(Tokenized(list(ids), mask) if any(mask) else None)
    return out


def _pieces(c: Conversation, text: str, spans: list[tuple[int, int]]) -> tuple[list[str], list[tuple[int, int]]]:
    """The texts to tokenize for ``c`` and the answer spans in their coordinates.

    With ``answer_ids`` and the answer's text found verbatim where its span starts: the text
    before the answer and the text after it, the last span now covering, in the second
    text, what the template adds after the answer up to the span's end. Else the whole text.
    """
    if c.answer_ids is None:  # parse_record only gives answer_ids to a conversation ending in an answer
        return [text], spans
    content = c.messages[-1]["content"]
    if not text.startswith(content, spans[-1][0]):
        return [text], spans
    cut = spans[-1][0] + len(content)
    return [text[: spans[-1][0]], text[cut:]], [*spans[:-1], (0, spans[-1][1] - cut)]


def _mask(ids: list[int], offsets: list[tuple[int, int]], spans: list[tuple[int, int]],
          eos_ids: set[int], truncated: bool) -> list[bool]:
    mask = [False] * len(ids)
    k = 0
    for n, (s, e) in enumerate(spans):
        last = n == len(spans) - 1
        while k < len(ids) and offsets[k][0] < s:
            k += 1
        while k < len(ids) and offsets[k][0] < e:
            if ids[k] in eos_ids:
                mask[k] = not (truncated and last)
                k += 1
                break
            mask[k] = True
            k += 1
    return mask
