"""Graph schema: JSON round trip, degrees, validation with counted repair and fallback."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import graph_dicts

from verl_credit.graph import InfluenceGraph, graph_json_schema, validate_graph

DESIGN_GRAPH = {
    "num_actions": 5,
    "errors": [{"action": 2, "kind": "tool_error", "evidence": "order not found"}],
    "direct_user_inputs": {"0": 1},
    "edges": [
        {"src": 0, "dst": 3, "sign": "+", "type": "input", "unit": "payment=card"},
        {"src": 2, "dst": 3, "sign": "-", "type": "failed_utilization", "unit": "#W99"},
    ],
}


def test_design_graph_degrees() -> None:
    graph, report = validate_graph(DESIGN_GRAPH, 5)
    assert not report.fallback and report.repaired_edges == 0 and report.errors_added == 0
    d_plus, d_minus, d_in = graph.degrees()
    np.testing.assert_array_equal(d_plus, [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(d_minus, [0, 0, 1, 0, 0])
    np.testing.assert_array_equal(d_in, [1, 0, 0, 1, 0])  # u_0 = 1; edge 0 ->+ 3
    np.testing.assert_array_equal(graph.error_indicator(), [0, 0, 1, 0, 0])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8).flatmap(graph_dicts))
def test_json_round_trip(raw: dict) -> None:
    graph, report = validate_graph(raw, raw["num_actions"])
    assert not report.fallback
    again, second = validate_graph(json.loads(json.dumps(graph.to_json())), raw["num_actions"])
    assert again == graph
    assert second.repaired_edges == 0 and second.errors_added == 0


def test_invariant_failed_use_source_gets_error_mark() -> None:
    raw = {"num_actions": 3, "edges": [{"src": 0, "dst": 2, "sign": "-", "type": "failed_utilization", "unit": "x"}]}
    graph, report = validate_graph(raw, 3)
    assert report.errors_added == 1
    np.testing.assert_array_equal(graph.error_indicator(), [1, 0, 0])


@pytest.mark.parametrize(
    ("edge", "reason"),
    [
        ({"src": 0, "dst": 9, "sign": "+", "type": "input"}, "out of range"),
        ({"src": 2, "dst": 1, "sign": "+", "type": "input"}, "src >= dst"),
        ({"src": 1, "dst": 1, "sign": "+", "type": "input"}, "src >= dst"),
        ({"src": 0, "dst": 1, "sign": "+", "type": "helps"}, "unknown type"),
        ({"src": 0, "dst": 1, "sign": "-", "type": "input"}, "does not match"),
        ({"src": 0, "dst": 1, "sign": "+", "type": "failed_utilization"}, "does not match"),
        ({"src": "a", "dst": 1, "sign": "+", "type": "input"}, "not integers"),
        ("0->1", "not an object"),
    ],
)
def test_offending_edges_are_dropped_and_counted(edge, reason: str) -> None:
    good = {"src": 0, "dst": 2, "sign": "+", "type": "input", "unit": "x"}
    graph, report = validate_graph({"num_actions": 3, "edges": [good, edge]}, 3)
    assert not report.fallback
    assert report.repaired_edges == 1
    assert [(e.src, e.dst) for e in graph.edges] == [(0, 2)]
    assert any(reason in problem for problem in report.problems)


def test_duplicate_edges_are_dropped() -> None:
    edge = {"src": 0, "dst": 1, "sign": "+", "type": "input", "unit": "x"}
    graph, report = validate_graph({"num_actions": 2, "edges": [edge, dict(edge, type="success_utilization")]}, 2)
    assert len(graph.edges) == 1 and report.repaired_edges == 1


@pytest.mark.parametrize(
    "raw",
    ["{not json", "[1, 2]", 42, None, {"edges": []}, {"num_actions": 4, "edges": []}, {"num_actions": 3, "edges": {}}],
)
def test_unrepairable_graphs_fall_back_to_uniform(raw) -> None:
    graph, report = validate_graph(raw, 3)
    assert report.fallback
    assert graph == InfluenceGraph.uniform(3)
    assert graph.is_uniform


def test_bad_errors_and_direct_inputs_are_dropped() -> None:
    raw = {"num_actions": 2, "edges": [], "errors": [{"action": 7}, 1], "direct_user_inputs": {"0": 2, "5": 1, "1": -1}}
    graph, report = validate_graph(raw, 2)
    assert report.repaired_edges == 3
    assert [mark.action for mark in graph.errors] == [1]
    assert graph.direct_user_inputs == ((0, 2),)


def test_schema_bounds_indices() -> None:
    schema = graph_json_schema(4)
    edge_props = schema["properties"]["edges"]["items"]["properties"]
    assert edge_props["src"]["maximum"] == 3
    assert set(edge_props["type"]["enum"]) == {"input", "success_utilization", "failed_utilization"}
    assert schema["properties"]["num_actions"]["enum"] == [4]
