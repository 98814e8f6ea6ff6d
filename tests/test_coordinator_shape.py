"""The coordinator's shape holds (scripts/coordinator_shape.py measures it): no import cycle, no
import running back up the layers (core, then store and backends, then the runtime, then HTTP),
no file over 400 lines, and one ingested batch's walk returns to a module it has left at most
3 times."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _shape() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "coordinator_shape", ROOT / "scripts" / "coordinator_shape.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_no_cycle_no_back_edge_and_no_file_over_the_limit() -> None:
    shape = _shape().import_shape()
    assert shape["cycles"] == []
    assert shape["back_edges"] == []
    assert shape["over_limit"] == [], shape["largest_file"]


def test_one_batch_returns_to_a_module_it_left_at_most_three_times() -> None:
    walk = _shape().batch_walk()
    assert walk["returns"] <= 3, walk["walk"]


def test_the_measure_sees_a_cycle_and_a_back_edge() -> None:
    shape = _shape()
    graph = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert shape.cycles(graph) == [["a", "b"]]
    assert shape.layer("sentinel.coordinator.core.engine") < shape.layer(
        "sentinel.coordinator.http.app"
    )
