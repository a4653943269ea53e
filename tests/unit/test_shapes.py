"""The shape comparison the simulator's fidelity tests rely on (tests/shapes.py)."""

from __future__ import annotations

from tests.shapes import diff, shape_of


def test_same_keys_and_types_is_no_difference() -> None:
    shape = shape_of({"id": "a", "n": 1, "list": [{"x": None}]})
    assert diff(shape, {"id": "b", "n": 2.5, "list": [{"x": None}, {"x": None}]}) == []


def test_extra_missing_and_retyped_keys_are_each_reported() -> None:
    shape = shape_of({"id": "a", "logs": "", "metrics": {"t": 1}})
    found = diff(shape, {"id": 3, "source": "api", "metrics": {"t": "1"}})
    assert found == ["$.source: extra key (not in any recording)",
                     "$.logs: missing (in every recording)",
                     "$.id: type number, recorded ['string']",
                     "$.metrics.t: type string, recorded ['number']"]


def test_variants_widen_what_is_allowed() -> None:
    shape = shape_of({"id": "a", "logs": None}, {"id": "b", "logs": "x", "model": "m"})
    assert diff(shape, {"id": "c", "logs": "y"}) == []  # model: in some recordings only
    assert diff(shape, {"id": "c"}) == ["$.logs: missing (in every recording)"]


def test_opaque_paths_are_only_type_checked() -> None:
    shape = shape_of({"input": {"prompt": "x"}})
    assert diff(shape, {"input": {"anything": [1]}}, opaque=["$.input"]) == []
    assert diff(shape, {"input": "str"}, opaque=["$.input"]) != []
