"""The target's features kept after their first pass: later batches read what the forward made, whatever
batch a conversation lands in; what does not fit is recomputed; training with the cache learns what it
learns without."""

from __future__ import annotations

import json

import pytest
import torch

from eaglet.capture import CaptureSpec
from eaglet.train.feature_cache import FeatureCache, caches_for
from eaglet.train.inputs import Featurizer
from eaglet.train.trainer import Trainer
from eaglet.train_options import TrainConfig
from tests.train.helpers import token_data

FAST = dict(ttt_steps=2, lr=3e-3, warmup_steps=2, batch_tokens=256, progress=False)


def _featurizer(target, data, cache=None):
    h, dev = target.config.hidden_size, target.model.embed.weight.device
    capture = CaptureSpec.eagle3_default(target.config.num_layers)
    return Featurizer(target, capture, torch.arange(64), data, dev, cache=cache), capture.k * h, h


def _valid(inp, lengths):
    """Each row's own positions of every input the draft reads (padding differs: zeros against the target's
    output for pad ids, and the loss masks it)."""
    fields = ("ids", "mask", "aux", "emb", "target_logp", "target_top")
    return [[getattr(inp, f)[r, :n] for f in fields] for r, n in enumerate(lengths)]


def _forwards(target, monkeypatch) -> list:
    calls, forward = [], type(target.model).forward
    monkeypatch.setattr(type(target.model), "forward", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k))
    return calls


@pytest.mark.parametrize("capacity", [10**6, 60])  # all kept; only the first conversations that fit
def test_kept_features_equal_the_forwards(tiny_target, monkeypatch, capacity):
    _kept_equal_forwards(tiny_target, monkeypatch, capacity)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_kept_bf16_features_equal_the_forwards_and_memory_is_measured(tiny_target_dir, monkeypatch):
    from eaglet.loading.target import load_target
    from eaglet.train.feature_cache import HEADROOM_BYTES, free_bytes

    target = load_target(str(tiny_target_dir), dtype=torch.bfloat16, device="cuda")
    # bf16 GEMMs of another batch shape round otherwise: close, and the argmax left out (a near tie may flip)
    _kept_equal_forwards(target, monkeypatch, 10**6, rtol=0.05, atol=0.05, fields=5)
    got, (free, _) = free_bytes(torch.device("cuda")), torch.cuda.mem_get_info()
    assert 0 <= got <= max(0, free + torch.cuda.memory_reserved() - HEADROOM_BYTES)


def _kept_equal_forwards(tiny_target, monkeypatch, capacity, fields=6, **close):
    data = token_data(tiny_target, 8, 41)
    plain, aux_w, h = _featurizer(tiny_target, data)
    cache = FeatureCache(aux_w, h, capacity)
    kept, _, _ = _featurizer(tiny_target, data, cache)
    calls = _forwards(tiny_target, monkeypatch)
    for rows in ([0, 1, 2], [3, 4], [2, 5, 6, 7], [7, 0, 3], [1, 4, 6]):  # later batches mix earlier ones
        before, all_kept = len(calls), all(i in cache for i in rows)
        got, want = kept(rows), plain(rows)
        lengths = [data.lengths[i] for i in rows]
        for g, w in zip(_valid(got, lengths), _valid(want, lengths)):
            for a, b in zip(g[:fields], w[:fields]):
                torch.testing.assert_close(a, b, **close)
        assert len(calls) - before == (1 if all_kept else 2)  # the kept batch skipped the target's forward
    assert cache.used == sum(data.lengths[i] for i in cache.spans) <= capacity
    assert len(cache.spans) == 8 if capacity > 10**5 else 0 < len(cache.spans) < 8


def test_caches_share_the_memory_allowed_in_order(monkeypatch):
    monkeypatch.setattr("eaglet.train.feature_cache.free_bytes", lambda device: 150 * (300 + 100) * 2)  # 150 tokens
    val, train = caches_for([40, 1000], 3 * 100, 100, torch.bfloat16, torch.device("cpu"))
    assert (val.capacity, train.capacity) == (40, 110)
    train.put(0, torch.ones(7, 300), torch.ones(7, 100))  # float32 features, kept in the buffer's bfloat16
    assert train.buf.dtype == torch.bfloat16 and train.buf.shape == (110, 400) and train.used == 7


def test_training_with_kept_features_learns_what_it_learns_without(tiny_target, tmp_path, monkeypatch):
    train, val = token_data(tiny_target, 16, 42), token_data(tiny_target, 4, 43)
    logs, forwards, calls = {}, {}, _forwards(tiny_target, monkeypatch)
    for keep in (False, True):
        calls.clear()
        out = tmp_path / str(keep)
        out.mkdir()
        res = Trainer(TrainConfig(epochs=3, val_every=3, feature_cache=keep, **FAST), tiny_target, train, val,
                      out).run()
        assert res["epochs_done"] == 3
        logs[keep] = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
        forwards[keep] = len(calls)
    assert forwards[True] < forwards[False] / 2  # three epochs and the validations: the first pass's forwards alone
    assert len(logs[True]) == len(logs[False]) > 6
    for a, b in zip(logs[True], logs[False]):
        assert a["split"] == b["split"] and a["step"] == b["step"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), a["step"]


def test_out_of_memory_beside_the_kept_features_drops_them_and_goes_on(tiny_target, tmp_path, monkeypatch, capsys):
    """A step that runs out of memory once the cache holds features: the cache is dropped, the step done again,
    and the run ends with every step, recomputing the features from there on."""
    train = token_data(tiny_target, 16, 42)
    trainer = Trainer(TrainConfig(epochs=2, feature_cache=True, **FAST), tiny_target, train, None, tmp_path)
    forward, failed = trainer._forward, []

    def fail_once(inp, model):
        if trainer.step == 3 and not failed:
            failed.append(trainer.train_feats.cache.used)
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return forward(inp, model)

    monkeypatch.setattr(trainer, "_forward", fail_once)
    res = trainer.run()
    assert failed and failed[0] > 0
    assert res["steps"] == trainer.total and res["epochs_done"] == 2
    assert trainer.train_feats.cache is None
    assert f"features of {failed[0]:,} training tokens" in capsys.readouterr().err
    steps = [json.loads(line)["step"] for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, trainer.total + 1))


def test_out_of_memory_without_kept_features_is_raised(tiny_target, tmp_path, monkeypatch):
    trainer = Trainer(TrainConfig(epochs=1, feature_cache=False, **FAST), tiny_target, token_data(tiny_target, 8, 42),
                      None, tmp_path)

    def fail(inp, model):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(trainer, "_forward", fail)
    with pytest.raises(torch.OutOfMemoryError):
        trainer.run()
