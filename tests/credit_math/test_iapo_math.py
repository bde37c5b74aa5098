"""IAPO routing (docs/design.md section 3): hand-worked cases and the five guarantees as properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import trajectories_with_graphs

from verl_credit.batch_credit import compute_batch_credit, pad_influence_graphs
from verl_credit.config import CreditConfig, IAPOConfig
from verl_credit.credit_math.iapo import compute_bounded_weights, compute_iapo_weights, compute_iapo_weights_reference
from verl_credit.graph import InfluenceGraph, validate_graph


def route_one(graph: InfluenceGraph, lengths: list[int], advantage: float, **iapo) -> list[float]:
    """Weights of one trajectory through the batched path."""
    padded = pad_influence_graphs([graph], len(lengths))
    out = compute_iapo_weights(
        torch.tensor([advantage], dtype=torch.float64),
        padded["d_plus"],
        padded["d_minus"],
        padded["d_in"],
        padded["errors"],
        torch.tensor([lengths], dtype=torch.float64),
        **iapo,
    )
    return out["weight"][0].tolist()


def test_hand_worked_support_edge_positive_advantage() -> None:
    # 3 actions, L = [1, 1, 2], one support edge 0 ->+ 2, no errors, A > 0.
    # d+ = [1, 0, 0], din = [0, 0, 1]  ->  phi+ = [ln2, 0, ln2]
    # mean = (ln2 + 0 + 2 ln2) / 4 = 0.75 ln2 ; centred = [0.25, -0.75, 0.25] ln2
    # var = (1*0.0625 + 1*0.5625 + 2*0.0625) ln2^2 / 4 = 0.1875 ln2^2 ; std = (sqrt(3)/4) ln2
    # z = [1/sqrt3, -sqrt3, 1/sqrt3] -> clip(0.25) -> [0.25, -0.25, 0.25]
    # m+ = 4 e^{z} / (3 e^{.25} + e^{-.25}) = [1.109099, 0.672703, 1.109099]
    # no errors -> phi- = 0, psi- = 0 -> w+ = m+
    graph, _ = validate_graph({"num_actions": 3, "edges": [{"src": 0, "dst": 2, "sign": "+", "type": "input"}]}, 3)
    weights = route_one(graph, [1, 1, 2], advantage=0.8)
    assert weights == pytest.approx([1.1090991, 0.6727026, 1.1090991], abs=2e-6)
    assert 1 * weights[0] + 1 * weights[1] + 2 * weights[2] == pytest.approx(4.0, rel=1e-12)


def test_hand_worked_error_both_signs() -> None:
    # 3 actions, L = [1, 1, 1]; action 0 errs and its output is reused by action 1 (0 ->- 1).
    # d- = [1, 0, 0], e = [1, 0, 0], din = 0  ->  phi- = [ln(1 + 1*(1+1+0)), 0, 0] = [ln3, 0, 0]
    # Negative branch (A < 0, neg_route=error): w- = m-.
    #   mean = ln3/3, centred = [2/3, -1/3, -1/3] ln3, var = (4/9 + 1/9 + 1/9)/3 ln3^2 = 2/9 ln3^2
    #   z = [sqrt2, -1/sqrt2, -1/sqrt2] -> clip -> [.25, -.25, -.25]
    #   m- = 3 e^{z} / (e^{.25} + 2 e^{-.25}) = [1.355588, 0.822206, 0.822206]
    # Positive branch (A > 0): phi+ = 0 -> m+ = 1; psi- = centred phi- = [2/3, -1/3, -1/3] ln3
    #   w+ = 3 e^{-0.05 psi} / sum e^{-0.05 psi} = [0.963721, 1.018140, 1.018140]
    graph, report = validate_graph(
        {
            "num_actions": 3,
            "errors": [{"action": 0, "kind": "tool_error"}],
            "edges": [{"src": 0, "dst": 1, "sign": "-", "type": "failed_utilization"}],
        },
        3,
    )
    assert report.errors_added == 0
    assert route_one(graph, [1, 1, 1], advantage=-1.2) == pytest.approx([1.3555883, 0.8222059, 0.8222059], abs=2e-6)
    assert route_one(graph, [1, 1, 1], advantage=0.5) == pytest.approx([0.9637209, 1.0181396, 1.0181396], abs=1e-6)
    # support route: w- = m+ = 1 (no support edges); A = 0: weight 1, advantage 0
    assert route_one(graph, [1, 1, 1], advantage=-1.0, neg_route="support") == [1.0, 1.0, 1.0]
    assert route_one(graph, [1, 1, 1], advantage=0.0) == [1.0, 1.0, 1.0]
    # projected: w- = 3 e^{+0.05 psi} / sum  -> the error-bearing action gets more blame
    projected = route_one(graph, [1, 1, 1], advantage=-1.0, neg_route="projected", beta_minus=0.05)
    tilt = [math.exp(0.05 * p * math.log(3)) for p in (2 / 3, -1 / 3, -1 / 3)]
    assert projected == pytest.approx([3 * t / sum(tilt) for t in tilt], abs=1e-9)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    sample=trajectories_with_graphs(),
    advantage=st.floats(-5, 5, allow_nan=False).filter(lambda a: abs(a) > 1e-3),
    beta_plus=st.sampled_from([0.0, 0.05, 0.3]),
    clip_c=st.sampled_from([0.0, 0.125, 0.25, 0.5, 2.0]),
    neg_route=st.sampled_from(["error", "support", "projected"]),
)
def test_guarantees(sample, advantage: float, beta_plus: float, clip_c: float, neg_route: str) -> None:
    graph, lengths = sample
    weights = route_one(graph, lengths, advantage, beta_plus=beta_plus, clip_c=clip_c, neg_route=neg_route)
    total = sum(lengths)
    # positivity
    assert all(w > 0 and math.isfinite(w) for w in weights)
    # mass conservation: sum L_i w_i = L
    assert sum(length * w for length, w in zip(lengths, weights, strict=True)) == pytest.approx(total, rel=1e-5)
    # sign preservation of A * w on every token
    assert all((advantage * w > 0) == (advantage > 0) for w in weights)
    # batched == literal reference
    d_plus, d_minus, d_in = graph.degrees()
    reference = compute_iapo_weights_reference(
        advantage,
        list(d_plus),
        list(d_minus),
        list(d_in),
        list(graph.error_indicator()),
        lengths,
        beta_plus=beta_plus,
        clip_c=clip_c,
        neg_route=neg_route,
    )
    assert weights == pytest.approx(reference, rel=1e-9, abs=1e-12)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(sample=trajectories_with_graphs(), clip_c=st.floats(0.0, 3.0))
def test_boundedness(sample, clip_c: float) -> None:
    graph, lengths = sample
    padded = pad_influence_graphs([graph], len(lengths))
    d_plus, d_in = padded["d_plus"], padded["d_in"]
    m = compute_bounded_weights(torch.log1p(d_plus + d_in), torch.tensor([lengths], dtype=torch.float64), clip_c)[0]
    present = [m[i].item() for i in range(len(lengths)) if lengths[i] > 0]
    assert max(present) / min(present) <= math.exp(2 * clip_c) * (1 + 1e-12)


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=10).filter(lambda values: sum(values) > 0),
    advantage=st.floats(-3, 3).filter(lambda a: a != 0),
)
def test_uniform_fallback_is_exactly_one(lengths: list[int], advantage: float) -> None:
    assert route_one(InfluenceGraph.uniform(len(lengths)), lengths, advantage) == [1.0] * len(lengths)


@settings(max_examples=100, deadline=None)
@given(sample=trajectories_with_graphs(), advantage=st.floats(-3, -0.01))
def test_no_errors_means_uniform_negative_branch(sample, advantage: float) -> None:
    graph, lengths = sample
    no_errors = InfluenceGraph(
        graph.num_actions, tuple(e for e in graph.edges if e.sign == "+"), (), graph.direct_user_inputs
    )
    assert route_one(no_errors, lengths, advantage) == [1.0] * len(lengths)


def test_zero_length_actions_carry_no_mass_and_stay_finite() -> None:
    graph, _ = validate_graph({"num_actions": 3, "edges": [{"src": 0, "dst": 1, "sign": "+", "type": "input"}]}, 3)
    weights = route_one(graph, [0, 5, 5], advantage=1.0)
    assert all(math.isfinite(w) and w > 0 for w in weights)
    assert 5 * weights[1] + 5 * weights[2] == pytest.approx(10.0)
    assert route_one(graph, [0, 0, 0], advantage=1.0) == [1.0, 1.0, 1.0]


def test_single_action_and_group_of_one() -> None:
    credit = compute_batch_credit(
        torch.tensor([1.0, 0.0, 1.0]),
        ["a", "b", "b"],
        [[4], [2, 3], [1]],
        CreditConfig(estimator="iapo"),
        graphs=[InfluenceGraph.uniform(1), InfluenceGraph.uniform(2), InfluenceGraph.uniform(1)],
    )
    # group of one: mean 0, std 1 -> A = 1 / (1 + 1e-6)
    assert credit.trajectory_advantage[0].item() == pytest.approx(1.0 / (1.0 + 1e-6))
    assert credit.weights_of(0) == [1.0]
    # all-equal rewards in a group give A = 0 and zero advantages
    same = compute_batch_credit(
        torch.tensor([1.0, 1.0]),
        ["g", "g"],
        [[2], [3]],
        CreditConfig(estimator="iapo"),
        graphs=[InfluenceGraph.uniform(1)] * 2,
    )
    assert same.action_advantage.abs().sum().item() == 0.0


def test_config_reaches_the_math() -> None:
    graph, _ = validate_graph({"num_actions": 3, "edges": [{"src": 0, "dst": 2, "sign": "+", "type": "input"}]}, 3)
    scores, uid, lengths = torch.tensor([1.0, 0.0]), ["g", "g"], [[1, 1, 2], [1, 1, 2]]
    narrow = compute_batch_credit(scores, uid, lengths, CreditConfig(iapo=IAPOConfig(clip_c=0.25)), graphs=[graph] * 2)
    wide = compute_batch_credit(scores, uid, lengths, CreditConfig(iapo=IAPOConfig(clip_c=0.5)), graphs=[graph] * 2)
    assert narrow.weights_of(0)[0] < wide.weights_of(0)[0]


@pytest.mark.parametrize(("key", "value"), [("clip_c", -1.0), ("neg_route", "sideways"), ("beta_plus", -0.1)])
def test_bad_config_values_name_the_key(key: str, value) -> None:
    with pytest.raises(ValueError, match=f"credit\\.iapo\\.{key}"):
        IAPOConfig(**{key: value})
    with pytest.raises(ValueError, match=r"credit\.iapo\.bogus"):
        CreditConfig.from_mapping({"iapo": {"bogus": 1}})
    with pytest.raises(ValueError, match=r"credit\.bogus"):
        CreditConfig.from_mapping({"bogus": 1})
    assert CreditConfig.from_mapping({"bogus": 1}, ignore=["bogus"]) == CreditConfig()
