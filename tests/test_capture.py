"""CaptureSpec: validation, EAGLE-3 default, and the explicit conversions between conventions."""

from __future__ import annotations

import json

import pytest

from eaglet.capture import CONVENTIONS, CaptureSpec
from eaglet.errors import EagletError


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


@pytest.mark.parametrize("points", [(31,), (2, 15, 31), (-1, 2)])
def test_out_of_range(points):
    with pytest.raises(EagletError) as e:
        CaptureSpec(points, 30)
    msg = _one_line(e)
    assert "0..30" in msg and "30-layer" in msg


def test_point_n_is_allowed():
    assert CaptureSpec((0, 30), 30).points == (0, 30)


def test_duplicates():
    with pytest.raises(EagletError) as e:
        CaptureSpec((2, 15, 2), 30)
    assert "repeat" in _one_line(e)


def test_empty():
    with pytest.raises(EagletError) as e:
        CaptureSpec((), 30)
    assert "at least one point" in _one_line(e)


def test_eagle3_default():
    spec = CaptureSpec.eagle3_default(30)
    assert spec.points == (2, 15, 27) and spec.num_layers == 30 and spec.k == 3
    assert CaptureSpec.eagle3_default(32).points == (2, 16, 29)


@pytest.mark.parametrize("convention", ["sglang", "specforge"])
def test_output_of_layer_conventions(convention):
    spec = CaptureSpec((2, 15, 27), 30)
    assert spec.to_ids(convention) == [1, 14, 26]  # "output of layer i" = point i + 1
    assert CaptureSpec.from_ids([1, 14, 26], convention, 30) == spec
    # SpecForge's default ids [1, N//2-1, N-4] are EAGLE-3's default points.
    assert CaptureSpec.from_ids([1, 30 // 2 - 1, 30 - 4], convention, 30) == CaptureSpec.eagle3_default(30)
    # Point N (the last layer's output) is layer id N-1.
    assert CaptureSpec((30,), 30).to_ids(convention) == [29]
    assert CaptureSpec.from_ids([29], convention, 30).points == (30,)


@pytest.mark.parametrize("convention", ["eaglet", "vllm"])
def test_point_conventions(convention):
    spec = CaptureSpec((0, 15, 27), 30)
    assert spec.to_ids(convention) == [0, 15, 27]
    assert CaptureSpec.from_ids([0, 15, 27], convention, 30) == spec


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_round_trip_every_convention(convention):
    spec = CaptureSpec((27, 2, 15), 30)  # order is meaningful and must survive
    assert CaptureSpec.from_ids(spec.to_ids(convention), convention, 30) == spec


@pytest.mark.parametrize("convention", ["sglang", "specforge"])
def test_point_0_has_no_layer_id(convention):
    with pytest.raises(EagletError) as e:
        CaptureSpec((0, 15), 30).to_ids(convention)
    msg = _one_line(e)
    assert "point 0" in msg and convention in msg


@pytest.mark.parametrize("convention", ["sglang", "specforge"])
def test_out_of_range_after_conversion(convention):
    with pytest.raises(EagletError) as e:
        CaptureSpec.from_ids([30], convention, 30)  # "output of layer 30" does not exist in 30 layers
    msg = _one_line(e)
    assert "[30] are outside 0..29" in msg and "31" not in msg  # named as typed, not as converted
    # A negative id must not silently become point 0 (the embedding output): -1 is not "the last layer".
    with pytest.raises(EagletError) as e:
        CaptureSpec.from_ids([1, -1], convention, 30)
    assert "-1" in _one_line(e)


def test_unknown_convention():
    spec = CaptureSpec((2,), 30)
    for call in (lambda: spec.to_ids("hf"), lambda: CaptureSpec.from_ids([2], "hf", 30)):
        with pytest.raises(EagletError) as e:
            call()
        msg = _one_line(e)
        assert "'hf'" in msg and all(c in msg for c in CONVENTIONS)


def test_json_round_trip():
    spec = CaptureSpec((2, 15, 27), 30)
    d = json.loads(json.dumps(spec.to_json()))
    assert d == {"points": [2, 15, 27], "num_layers": 30, "convention": "eaglet"}
    assert CaptureSpec.from_json(d) == spec


def test_from_json_other_convention_and_errors():
    assert CaptureSpec.from_json({"points": [1, 14, 26], "num_layers": 30, "convention": "sglang"}).points == (
        2, 15, 27,
    )
    assert CaptureSpec.from_json({"points": [2], "num_layers": 30}).points == (2,)  # eaglet by default
    with pytest.raises(EagletError) as e:
        CaptureSpec.from_json({"points": [2]})
    assert "num_layers" in _one_line(e)
    with pytest.raises(EagletError) as e:
        CaptureSpec.from_json({"num_layers": 30})
    assert "points" in _one_line(e)
    with pytest.raises(EagletError):
        CaptureSpec.from_json({"points": [2], "num_layers": 30, "convention": "nope"})

