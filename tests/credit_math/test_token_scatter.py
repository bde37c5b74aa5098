"""Token scatter: spans -> (rows, R) tensors; per-request vs merged layouts agree."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_credit.batch_credit import compute_batch_credit, route_token_advantages
from verl_credit.config import CreditConfig
from verl_credit.credit_math.tokens import scatter_action_values_to_tokens, spans_from_response_mask
from verl_credit.graph import validate_graph


def test_spans_tile_the_response_hand_example() -> None:
    # R = 10; spans [1,3) [3,3) (empty) [5,9) of actions 0, 1, 2 and one padding span (action -1)
    values = torch.tensor([[1.0, 2.0, 3.0]])
    action = torch.tensor([[0, 1, 2, -1]])
    start = torch.tensor([[1, 3, 5, 0]])
    end = torch.tensor([[3, 3, 9, 0]])
    tokens = scatter_action_values_to_tokens(values, action, start, end, 10)
    assert tokens.tolist() == [[0.0, 1.0, 1.0, 0.0, 0.0, 3.0, 3.0, 3.0, 3.0, 0.0]]


def test_adjacent_spans() -> None:
    values = torch.tensor([[1.0, 2.0]])
    tokens = scatter_action_values_to_tokens(
        values, torch.tensor([[0, 1]]), torch.tensor([[0, 2]]), torch.tensor([[2, 4]]), 5
    )
    assert tokens.tolist() == [[1.0, 1.0, 2.0, 2.0, 0.0]]


def test_scatter_values() -> None:
    values = torch.tensor([[10.0, 20.0, 30.0]])
    # spans name their action: the row holds actions 2 and 0, in that order
    out = scatter_action_values_to_tokens(
        values, torch.tensor([[2, 0]]), torch.tensor([[0, 3]]), torch.tensor([[2, 4]]), 5
    )
    assert out.tolist() == [[30.0, 30.0, 0.0, 10.0, 0.0]]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.booleans(), min_size=1, max_size=40), min_size=1, max_size=6).map(
        lambda rows: [r + [False] * (40 - len(r)) for r in rows]
    )
)
def test_spans_from_mask_cover_the_mask_exactly(rows: list[list[bool]]) -> None:
    mask = torch.tensor(rows, dtype=torch.float32)
    spans = spans_from_response_mask(mask)
    for row, row_spans in enumerate(spans):
        covered = torch.zeros(mask.shape[1])
        for start, end in row_spans:
            covered[start:end] += 1
        assert torch.equal(covered, mask[row])
        assert sum(end - start for start, end in row_spans) == int(mask[row].sum())


def test_per_request_and_merged_layouts_give_identical_action_advantages() -> None:
    # one trajectory of 3 actions with lengths 3, 2, 4; merged row: obs tokens between actions
    graph, _ = validate_graph({"num_actions": 3, "edges": [{"src": 0, "dst": 2, "sign": "+", "type": "input"}]}, 3)
    credit = compute_batch_credit(
        torch.tensor([1.0, 0.0]), ["g", "g"], [[3, 2, 4], [3, 2, 4]], CreditConfig(), graphs=[graph, graph]
    )
    merged = route_token_advantages(
        credit, torch.tensor([0]), torch.tensor([[0, 1, 2]]), torch.tensor([[0, 5, 9]]), torch.tensor([[3, 7, 13]]), 16
    )
    per_request = route_token_advantages(
        credit,
        torch.tensor([0, 0, 0]),
        torch.tensor([[0], [1], [2]]),
        torch.tensor([[0], [0], [0]]),
        torch.tensor([[3], [2], [4]]),
        16,
    )
    for action, (start, end) in enumerate([(0, 3), (5, 7), (9, 13)]):
        length = end - start
        assert torch.equal(merged[0, start:end], per_request[action, :length])
    assert merged.sum().item() == pytest_approx(per_request.sum().item())


def pytest_approx(value: float):
    import pytest

    return pytest.approx(value, rel=1e-6)
