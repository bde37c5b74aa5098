"""Hypothesis strategies for trajectories, graphs and batches (shared by the property tests)."""

from __future__ import annotations

from hypothesis import strategies as st

from verl_credit.graph import EDGE_TYPES, validate_graph


@st.composite
def graph_dicts(draw: st.DrawFn, num_actions: int) -> dict:
    """A *valid* serialized graph over ``num_actions`` actions (``num_actions >= 1``).

    Edges satisfy ``src < dst`` and sign/type agreement; errors and direct inputs are in range.
    """
    edges = []
    if num_actions >= 2:
        pairs = draw(
            st.lists(
                st.tuples(st.integers(0, num_actions - 2), st.integers(1, num_actions - 1)).filter(
                    lambda p: p[0] < p[1]
                ),
                max_size=3 * num_actions,
            )
        )
        for src, dst in pairs:
            edge_type = draw(st.sampled_from(sorted(EDGE_TYPES)))
            edges.append({"src": src, "dst": dst, "sign": EDGE_TYPES[edge_type], "type": edge_type, "unit": "u"})
    error_actions = draw(st.sets(st.integers(0, num_actions - 1), max_size=num_actions))
    direct = draw(st.dictionaries(st.integers(0, num_actions - 1).map(str), st.integers(0, 3), max_size=num_actions))
    return {
        "num_actions": num_actions,
        "errors": [{"action": a, "kind": "tool_error", "evidence": "x"} for a in sorted(error_actions)],
        "direct_user_inputs": direct,
        "edges": edges,
    }


@st.composite
def trajectories_with_graphs(draw: st.DrawFn, max_actions: int = 8, allow_zero_length: bool = True) -> tuple:
    """``(graph, lengths)``: a validated graph and per-action token lengths (>= 1 action).

    With ``allow_zero_length`` some actions may have 0 tokens, but at least one has tokens.
    """
    num_actions = draw(st.integers(1, max_actions))
    raw = draw(graph_dicts(num_actions))
    graph, _ = validate_graph(raw, num_actions)
    low = 0 if allow_zero_length else 1
    lengths = draw(st.lists(st.integers(low, 50), min_size=num_actions, max_size=num_actions))
    if sum(lengths) == 0:
        lengths[draw(st.integers(0, num_actions - 1))] = draw(st.integers(1, 50))
    return graph, lengths
