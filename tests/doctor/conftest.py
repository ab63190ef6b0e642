"""A tiny target and an EAGLE-3 draft trained on it (CPU, ~30 s, once per session), plus copies to break.

The target is tests/train's 4-layer variant of the byte-level tiny Llama with its query and
key projections scaled down: smooth attention makes its greedy continuations a learnable
function of the context, so a few hundred TTT steps give a draft (step-0 accuracy ~0.5) whose
accuracy depends on being fed the points it was trained on, which the capture-point search needs.
The draft is trained on the target's own greedy answers, token ids as generated.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglet.chat import encode_chat
from eaglet.doctor.samples import answer_data
from eaglet.generate import PlainGenerator
from eaglet.sampling import SamplingParams
from eaglet.train.trainer import Trainer
from eaglet.train_options import TrainConfig
from tests.train.helpers import load_tiny, make_tiny_target_dir, one_thread, prompts, write_jsonl  # noqa: F401

LAYERS = 4
POINTS = (1, 2, 3)  # the points the draft is trained on (SGLang ids [0, 1, 2])
QK_SCALE = 0.3


@pytest.fixture(scope="session")
def doctor_target_dir(tmp_path_factory) -> Path:
    path = make_tiny_target_dir(tmp_path_factory.mktemp("doctor-target"), num_hidden_layers=LAYERS)
    weights = path / "model.safetensors"
    t = load_file(str(weights))
    t = {k: v * QK_SCALE if ("q_proj" in k or "k_proj" in k) else v for k, v in t.items()}
    save_file(t, str(weights), metadata={"format": "pt"})
    return path


def _train_draft(target_dir: Path, out: Path, sampled: tuple[float, ...] = (), **options) -> Path:
    """A draft trained for 250 steps on 400 greedy answers of the target (plus, per temperature in
    ``sampled``, 350 sampled ones: several answers per prompt), reading POINTS."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = load_tiny(target_dir)
        ids = [encode_chat(target.tokenizer, list(p.messages)) for p in prompts(400, seed=5)]
        gen = PlainGenerator(target, 256)
        answers = {}
        for temp in (0.0, *sampled):
            params = SamplingParams(temperature=temp, max_new_tokens=48, seed=1)
            answers[temp] = [c.tokens for i in range(0, len(ids), 200) for c in gen.generate(ids[i: i + 200], params)]
        train_ids = [p for _ in answers for p in ids[50:]]
        train = answer_data(train_ids, [a for temp in answers for a in answers[temp][50:]])
        cfg = TrainConfig(max_steps=250, ttt_steps=3, lr=3e-3, warmup_steps=10, batch_tokens=1024, epochs=100,
                          val_every=250, save_every=250, capture_points=POINTS, progress=False, **options)
        res = Trainer(cfg, target, train, answer_data(ids[:50], answers[0.0][:50]), out).run()
        assert res["val"]["acc_0"] > 0.35, res["val"]
    finally:
        torch.set_num_threads(n)
    return out / "draft"


@pytest.fixture(scope="session")
def trained_draft(doctor_target_dir, tmp_path_factory) -> Path:
    return _train_draft(doctor_target_dir, tmp_path_factory.mktemp("doctor-run"))


@pytest.fixture(scope="session")
def recipe_draft(doctor_target_dir, tmp_path_factory) -> Path:
    """A draft of the new recipe: greedy and sampled answers, captured points RMS-normalised, feature noise."""
    return _train_draft(doctor_target_dir, tmp_path_factory.mktemp("recipe-run"), sampled=(1.0,), aux_norm=True,
                        aux_noise=0.05)


@pytest.fixture(scope="session")
def doctor_prompts(tmp_path_factory) -> Path:
    """Prompts the draft never saw (another seed)."""
    path = tmp_path_factory.mktemp("doctor-prompts") / "prompts.jsonl"
    return write_jsonl(path, [{"messages": list(p.messages)} for p in prompts(16, seed=9)])


def copy_draft(src: Path, dst: Path, edit=None) -> Path:
    """A copy of a draft directory, its config.json passed through ``edit(cfg)`` (in place)."""
    shutil.copytree(src, dst)
    if edit is not None:
        cfg = json.loads((dst / "config.json").read_text())
        edit(cfg)
        (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst
