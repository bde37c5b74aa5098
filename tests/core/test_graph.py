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


@pytest.mark.parametrize("index", ["--0", "²", "٣", "1.0", "0x1", ["0"], {"a": 0}, 1.0, True, 10**400])
def test_odd_indices_drop_the_edge_without_raising(index) -> None:
    raw = {"num_actions": 3, "edges": [{"src": index, "dst": 2, "sign": "+", "type": "input"}]}
    graph, report = validate_graph(raw, 3)
    assert graph.edges == () and report.repaired_edges == 1 and not report.fallback


@pytest.mark.parametrize("value", [["input"], {"t": 1}, None, 3])
def test_unhashable_or_odd_type_and_sign_are_dropped(value) -> None:
    for key in ("type", "sign"):
        edge = {"src": 0, "dst": 1, "sign": "+", "type": "input", key: value}
        graph, report = validate_graph({"num_actions": 2, "edges": [edge]}, 2)
        assert graph.edges == () and report.repaired_edges == 1


def test_numeric_string_indices_are_used_and_counted() -> None:
    raw = {
        "num_actions": 3,
        "edges": [{"src": "0", "dst": " 2", "sign": "+", "type": "input"}],
        "errors": [{"action": "1", "kind": "k"}],
        "direct_user_inputs": {"1": 1, "02": 1},
    }
    graph, report = validate_graph(raw, 3)
    assert [(e.src, e.dst) for e in graph.edges] == [(0, 2)]
    assert [m.action for m in graph.errors] == [1]
    assert graph.direct_user_inputs == ((1, 1), (2, 1))
    assert report.repaired_edges == 3  # the edge, the error mark, the key "02" ("1" is canonical)
    assert any("strings" in problem for problem in report.problems)


def test_missing_edges_duplicate_marks_and_bad_direct_entries_are_counted() -> None:
    raw = {
        "num_actions": 3,
        "errors": [{"action": 1}, {"action": 1, "kind": "again"}],
        "direct_user_inputs": [[0, 1], 7, [0, 2], ["x", 1], [1, 2, 3]],
    }
    graph, report = validate_graph(raw, 3)
    # edges missing (1) + duplicate mark (1) + 7 and [1, 2, 3] (2) + repeated action 0 (1) + "x" (1)
    assert report.repaired_edges == 6 and not report.fallback
    assert [m.kind for m in graph.errors] == ["error"]
    assert graph.direct_user_inputs == ((0, 2),)


def test_huge_direct_input_counts_are_dropped() -> None:
    graph, report = validate_graph({"num_actions": 2, "edges": [], "direct_user_inputs": {"0": 10**300}}, 2)
    assert graph.direct_user_inputs == () and report.repaired_edges == 1
    graph.degree_table  # noqa: B018 - must not overflow


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, '{"num_actions": ' + "9" * 5000 + "}"])
def test_graph_strings_too_deep_or_too_long_fall_back(text: str) -> None:
    graph, report = validate_graph(text, 2)
    assert report.fallback and graph.is_uniform
