from types import SimpleNamespace

import pytest

from eaglet.errors import EagletError
from eaglet.generate import context_size
from eaglet.models.config import ModelConfig

BASE = {"model_type": "mistral", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 8192}


def test_sliding_window_caps_the_context():
    cfg = ModelConfig.from_hf({**BASE, "sliding_window": 1024})
    assert cfg.context_window == 1024
    target = SimpleNamespace(config=cfg)
    assert context_size(target, None) == 1024
    with pytest.raises(EagletError, match="window 1024"):
        context_size(target, 2048)


def test_disabled_sliding_window_is_ignored():
    cfg = ModelConfig.from_hf({**BASE, "model_type": "qwen2", "sliding_window": 1024, "use_sliding_window": False})
    assert cfg.context_window == 8192
    assert context_size(SimpleNamespace(config=cfg), None) == 4096
