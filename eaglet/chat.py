"""Prompts as chat messages, encoded through the tokenizer's own chat template."""

from __future__ import annotations

from eaglet.errors import EagletError

_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "system": "system", "chatgpt": "assistant", "bard": "assistant"}


def as_messages(record: dict) -> list[dict]:
    """OpenAI ``messages``, ShareGPT ``conversations`` (from/value) or ``{"prompt": str}``."""
    if isinstance(record.get("messages"), list):
        msgs = record["messages"]
    elif isinstance(record.get("conversations"), list):
        msgs = []
        for turn in record["conversations"]:
            role = _SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
            if role is None:
                raise ValueError(f"unknown ShareGPT speaker {turn.get('from')!r}")
            msgs.append({"role": role, "content": turn.get("value", "")})
    elif isinstance(record.get("prompt"), str):
        msgs = [{"role": "user", "content": record["prompt"]}]
    else:
        raise ValueError("expected a 'messages', 'conversations' or 'prompt' field")
    for m in msgs:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            raise ValueError("each message needs a role (system/user/assistant) and string content")
    if not msgs:
        raise ValueError("the conversation is empty")
    return msgs


def encode_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise EagletError("the target's tokenizer has no chat template; eaglet needs one to build prompts")
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    return encode_text(tokenizer, text)


def encode_text(tokenizer, text: str) -> list[int]:
    """``tokenizer(text, add_special_tokens=False)["input_ids"]``, through the Rust tokenizer directly where there
    is one: the same ids without transformers' wrapper around a single text (~0.1 ms of a served request's path,
    where every request pays it; docs/performance.md, session 36), and without the character offsets nobody reads
    (``encode_batch_fast``: 110 against 150-186 us a chat-templated prompt on the 2-core CPU, session 40)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "split_special_tokens", False):
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return backend.encode_batch_fast([text], add_special_tokens=False)[0].ids  # tokenizers >= 0.21 (transformers 5)
