"""Offline feature shards: equal to the online features, resumable per shard, tied to their target and capture."""

from __future__ import annotations

import json

import pytest
import torch

from eaglet.capture import CaptureSpec
from eaglet.data.dataset import TokenData, length_batches
from eaglet.data.features import FeatureSet, capture_features
from eaglet.data.prompts import parse_record
from eaglet.data.template import tokenize_conversations
from eaglet.errors import EagletError
from eaglet.train.inputs import Featurizer
from tests.train.helpers import WORDS, load_tiny, make_tiny_target_dir


@pytest.fixture(scope="module")
def data(tiny_target) -> TokenData:
    convs = [parse_record({"messages": [{"role": "user", "content": " ".join(WORDS[i: i + 4])},
                                        {"role": "assistant", "content": " ".join(WORDS[i::2])}]})
             for i in range(11)]
    items = tokenize_conversations(tiny_target.tokenizer, convs, {tiny_target.tokenizer.eos_token_id})
    return TokenData.from_tokenized(items)


def test_offline_equals_online(tiny_target, data, tmp_path):
    spec = CaptureSpec.eagle3_default(tiny_target.config.num_layers)
    assert capture_features(tiny_target, data, tmp_path, spec, shard_samples=4, batch_tokens=200,
                            dtype=torch.float32, progress=False) == 3
    fs = FeatureSet(tmp_path)
    fs.check(tiny_target, spec)
    assert len(fs) == len(data) and fs.lengths == data.lengths
    assert torch.equal(fs.ids, data.ids) and torch.equal(fs.mask, data.mask)
    vocab = torch.arange(0, tiny_target.config.vocab_size, 2)  # any draft vocabulary
    online = Featurizer(tiny_target, spec, vocab, data, torch.device("cpu"))
    offline = Featurizer(tiny_target, spec, vocab, fs, torch.device("cpu"))
    for rows in length_batches(data.lengths, 300, seed=1):  # other groupings than at capture time
        a, b = online(rows), offline(rows)
        real = torch.arange(a.ids.shape[1]) < torch.tensor([data.lengths[r] for r in rows]).unsqueeze(1)  # [B, T]
        for name in ("ids", "mask", "target_top"):
            assert torch.equal(getattr(a, name)[real], getattr(b, name)[real]), name
        for name in ("aux", "emb", "target_logp"):  # padding differs (zeros offline) and is never a label
            torch.testing.assert_close(getattr(a, name)[real], getattr(b, name)[real], atol=1e-5, rtol=1e-5)


def test_resume_per_shard_and_refuse_other_runs(tiny_target, data, tmp_path):
    spec = CaptureSpec.eagle3_default(tiny_target.config.num_layers)
    capture_features(tiny_target, data, tmp_path, spec, shard_samples=4, progress=False)
    meta = json.loads((tmp_path / "manifest.json").read_text())
    assert meta["capture"] == spec.to_json() and meta["target"]["tokenizer_hash"] == tiny_target.tokenizer_hash
    (tmp_path / "shard-00001.safetensors").unlink()
    with pytest.raises(EagletError, match="lacks 1 shards"):
        FeatureSet(tmp_path)
    assert capture_features(tiny_target, data, tmp_path, spec, shard_samples=4, progress=False) == 1
    assert len(FeatureSet(tmp_path)) == len(data)
    with pytest.raises(EagletError, match="other data, target or capture"):
        capture_features(tiny_target, data, tmp_path, CaptureSpec((1, 2), 3), shard_samples=4, progress=False)
    with pytest.raises(EagletError, match="hold points"):
        FeatureSet(tmp_path).check(tiny_target, CaptureSpec((1, 2), 3))


def test_features_of_another_target_are_refused(tiny_target, data, tmp_path):
    spec = CaptureSpec.eagle3_default(3)
    capture_features(tiny_target, data, tmp_path / "f", spec, shard_samples=8, progress=False)
    other = load_tiny(make_tiny_target_dir(tmp_path / "other", hidden_size=32, num_attention_heads=2,
                                           num_key_value_heads=1))
    with pytest.raises(EagletError, match="another target: hidden size 64 vs 32"):
        FeatureSet(tmp_path / "f").check(other)
