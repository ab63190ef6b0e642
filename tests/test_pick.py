"""scripts/h200/pick.py: the paired bootstrap's intervals and the verdict that follows them."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "pick", Path(__file__).resolve().parents[1] / "scripts" / "h200" / "pick.py")
pick = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pick)


def _report(accepts: dict[str, list[float]], tokens: int = 120) -> dict:
    """A bench report of spec alone: each set's prompts with the given accept lengths, ``tokens`` each."""
    prompts, by_set, i = [], {}, 0
    for name, xs in accepts.items():
        for a in xs:
            prompts.append({"index": i, "set": name, "methods": {"spec": {"tokens": tokens, "accept_length": a}}})
            i += 1
        verifies = sum(tokens / a for a in xs)
        by_set[name] = {"methods": {"spec": {"accept_length": tokens * len(xs) / verifies}}}
    return {"by_set": by_set, "prompts": prompts}


def _verdict(tmp_path, new: dict, old: dict, capsys, monkeypatch) -> str:
    a, b = tmp_path / "new.json", tmp_path / "old.json"
    a.write_text(json.dumps(new))
    b.write_text(json.dumps(old))
    monkeypatch.setattr(pick.sys, "argv", ["pick.py", str(a), str(b)])
    pick.main()
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_a_consistent_gain_is_new_and_noise_or_a_loss_is_kept(tmp_path, capsys, monkeypatch):
    rng = random.Random(1)
    base = {s: [rng.uniform(2.5, 5.0) for _ in range(20)] for s in ("builtin", "other")}
    gain = {s: [a + 0.3 for a in xs] for s, xs in base.items()}
    noise = {s: [a + rng.choice((-0.4, 0.4)) for a in xs] for s, xs in base.items()}
    loss = {"builtin": [a + 0.5 for a in base["builtin"]], "other": [a - 0.3 for a in base["other"]]}
    assert _verdict(tmp_path, _report(gain), _report(base), capsys, monkeypatch) == "verdict: NEW"
    assert _verdict(tmp_path, _report(noise), _report(base), capsys, monkeypatch) == "verdict: KEEP"
    assert _verdict(tmp_path, _report(loss), _report(base), capsys, monkeypatch) == "verdict: KEEP"  # one set worse


def test_the_interval_holds_the_difference_and_shrinks_to_it_without_spread():
    new = {i: (100, 25.0) for i in range(10)}  # accept 4.0 on every prompt
    old = {i: (100, 40.0) for i in range(10)}  # 2.5
    lo, hi = pick.interval(new, old, random.Random(0))
    assert abs(lo - 1.5) < 1e-9 and abs(hi - 1.5) < 1e-9
    new[0] = (100, 100.0)  # one prompt at 1.0
    lo, hi = pick.interval(new, old, random.Random(0))
    assert lo < 1.5 * 0.9 and hi <= 1.5 + 1e-9


def test_reports_without_prompts_fall_back_to_the_threshold_rule(tmp_path, capsys, monkeypatch):
    new, old = _report({"a": [4.2] * 5, "b": [3.2] * 5}), _report({"a": [4.0] * 5, "b": [3.0] * 5})
    del new["prompts"], old["prompts"]
    assert _verdict(tmp_path, new, old, capsys, monkeypatch) == "verdict: NEW"


def test_a_prompts_own_verifies_are_used_where_the_report_keeps_them():
    rows = [{"index": 0, "set": "a", "methods": {"spec": {"tokens": 100, "accept_length": 4.0, "verifies": 26}}},
            {"index": 1, "set": "a", "methods": {"spec": {"tokens": 100, "accept_length": 4.0}}}]
    got = pick.per_prompt({"prompts": rows}, "a")
    assert got[0] == (104.0, 26)  # the stop cut the last verify's tokens: 26 x 4.0 accepted, 100 emitted
    assert got[1] == (100.0, 25.0)  # an older report: tokens over the mean accept length
