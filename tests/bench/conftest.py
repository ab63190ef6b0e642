"""A tiny chat model directory (random Llama + byte-level BPE tokenizer with a chat template), a draft, prompts."""

from __future__ import annotations

import json

import pytest

from tests.conftest import make_hf_model, save_random_draft

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["the quick brown fox jumps over the lazy dog", "def f(x):\n    return x + 1", "2 + 2 = 4, 3 * 3 = 9"]


def chat_tokenizer(vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>",
                                   chat_template=TEMPLATE)


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory):
    """An HF directory that both eaglet's loader and transformers' AutoModelForCausalLM read."""
    path = tmp_path_factory.mktemp("tiny-chat")
    tok = chat_tokenizer(300)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    hf = make_hf_model("llama", seed=3, vocab_size=320, eos_token_id=eos, pad_token_id=eos)
    hf.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def draft_dir(chat_model_dir, tmp_path_factory):
    return save_random_draft(chat_model_dir, tmp_path_factory.mktemp("drafts") / "tiny-draft", 160)


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [
        {"messages": [{"role": "user", "content": "the quick brown fox"}], "category": "chat", "id": "a"},
        {"prompt": "def f(x):", "category": "code", "id": "b"},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2 + 2"}],
         "category": "math", "id": "c"},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path
