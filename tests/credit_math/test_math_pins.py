"""Tests that pin the math: every ``verl-credit route`` flag and every ``credit.*``
math key must visibly reach the numbers.

A structure audit mutated the code and the suite still passed (``beta_minus`` replaced by
``beta_plus``, ``--neg-route`` hard-wired to ``error``, ``--gamma`` dropped, GRPO's ``epsilon``
dropped, IAPO's ``eps`` dropped): the old cases used default values (``beta_minus == beta_plus``,
``epsilon = 1e-6``) or saturated the clip (where ``eps`` cannot matter). Here every knob is set to a
non-default value whose effect is visible, and each expected number comes from docs/design.md sections 3,
4 and 4b, computed in this file in plain Python floats (never with the project's functions):

* ``test_iapo_hand_case_*``: a hand-computed IAPO case where no z-score is clipped, with direct user
  inputs ``u_i`` and the ``e_i * din_i`` term of ``phi-``; the arithmetic is written out step by step.
* the ``expected_*`` helpers below: literal transcriptions of the docs/design.md formulas, checked against the
  hand case, used for the parametrized variants (one knob at a time, so a dropped or swapped knob
  changes the number and fails the test that names it);
* the public entry points: ``compute_iapo_weights``, ``compute_grpo_trajectory_advantage``,
  ``credit.call_credit``, ``batch_credit.compute_batch_credit`` with ``CreditConfig.from_mapping``, and the
  CLI ``verl-credit route`` on small rollouts files;
* ``test_every_route_flag_is_pinned`` / ``test_every_credit_math_key_is_pinned``: a new flag or key
  fails until it is pinned here (or listed as not-math with the reason).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import torch

from verl_credit.batch_credit import compute_batch_credit, trajectory_scores
from verl_credit.call_graph import CallEdge, CallGraph
from verl_credit.cli.main import build_parser, main
from verl_credit.config import (
    CallCreditConfig,
    CreditConfig,
    GiGPOConfig,
    IAPOConfig,
    InfoGainConfig,
    TurnRewardConfig,
)
from verl_credit.credit_math import call_credit
from verl_credit.credit_math.grpo import compute_grpo_trajectory_advantage
from verl_credit.credit_math.iapo import compute_iapo_weights
from verl_credit.graph import validate_graph

# ---------------------------------------------------------------------------------------------
# Plain-Python transcriptions of the docs/design.md formulas (the expected values; no project code)
# ---------------------------------------------------------------------------------------------


def expected_grpo(
    rewards: list[float], uids: list[str], epsilon: float = 1e-6, norm_by_std: bool = True
) -> list[float]:
    """docs/design.md section 3: ``A = (R - mu_G) / (sigma_G + eps)``, Bessel-corrected sigma; a group of one
    has ``mu = 0, sigma = 1``; ``norm_by_std=False`` drops the division."""
    out = []
    for reward, uid in zip(rewards, uids, strict=True):
        group = [r for r, u in zip(rewards, uids, strict=True) if u == uid]
        if len(group) == 1:
            mu, sigma = 0.0, 1.0
        else:
            mu = sum(group) / len(group)
            sigma = math.sqrt(sum((r - mu) ** 2 for r in group) / (len(group) - 1))
        out.append((reward - mu) / (sigma + epsilon) if norm_by_std else reward - mu)
    return out


def expected_iapo(
    advantage: float,
    d_plus: list[float],
    d_minus: list[float],
    d_in: list[float],
    errors: list[float],
    lengths: list[float],
    beta_plus: float = 0.05,
    clip_c: float = 0.25,
    neg_route: str = "error",
    beta_minus: float = 0.05,
    eps: float = 1e-6,
) -> list[float]:
    """docs/design.md section 3, one trajectory: the routed weight ``w_i`` (1 where ``A = 0``)."""
    n = len(lengths)
    total = sum(lengths)
    phi_plus = [math.log(1 + d_plus[i] + d_in[i]) for i in range(n)]
    phi_minus = [math.log(1 + errors[i] * (1 + d_minus[i] + d_in[i])) for i in range(n)]

    def bounded(phi: list[float]) -> list[float]:
        mean = sum(lengths[i] * phi[i] for i in range(n)) / total
        var = sum(lengths[i] * (phi[i] - mean) ** 2 for i in range(n)) / total
        z = [(phi[i] - mean) / (math.sqrt(var) + eps) for i in range(n)]
        raw = [math.exp(min(max(zi, -clip_c), clip_c)) for zi in z]
        norm = sum(lengths[i] * raw[i] for i in range(n)) / total
        return [r / norm for r in raw]

    mean_minus = sum(lengths[i] * phi_minus[i] for i in range(n)) / total
    psi = [phi_minus[i] - mean_minus for i in range(n)]

    def tilted(m: list[float], beta: float) -> list[float]:
        raw = [m[i] * math.exp(-beta * psi[i]) for i in range(n)]
        norm = sum(lengths[i] * raw[i] for i in range(n))
        return [total * r / norm for r in raw]

    m_plus = bounded(phi_plus)
    if advantage > 0:
        return tilted(m_plus, beta_plus)
    if advantage == 0:
        return [1.0] * n
    if neg_route == "error":
        return bounded(phi_minus)
    if neg_route == "support":
        return m_plus
    assert neg_route == "projected"
    return tilted(m_plus, -beta_minus)


DEFAULT_OMEGA = {"AE": 1.0, "IG": 0.6, "RV": 0.4}


def expected_call_weights(
    roles: list[str],
    degree: list[float],
    lengths: list[float],
    omega: dict[str, float] | None = None,
    smoothing: float = 1.0,
    gamma: float = 0.95,
    mode: str = "mass_conserving",
) -> list[float]:
    """docs/design.md section 4: ``s_i = omega(r_i) (deg_i + lambda) / sum_j (deg_j + lambda) gamma^(T - pos_i)``;
    ``mass_conserving``: ``w = L s / sum L s``; ``paper``: ``w = s T``."""
    omega = omega or DEFAULT_OMEGA
    count = len(roles)
    denominator = sum(d + smoothing for d in degree)
    s = [omega[roles[i]] * (degree[i] + smoothing) / denominator * gamma ** (count - (i + 1)) for i in range(count)]
    if mode == "paper":
        return [value * count for value in s]
    mass = sum(length * value for length, value in zip(lengths, s, strict=True))
    return [sum(lengths) * value / mass for value in s]


def expected_gigpo(
    rewards: list[float],
    uids: list[str],
    states: list[list[str]],
    step_advantage_w: float = 1.0,
    gamma: float = 0.95,
    mode: str = "mean_norm",
    eps: float = 1e-6,
    epsilon: float = 1e-6,
) -> list[list[float]]:
    """docs/design.md section 4b ``gigpo``: ``A_i = A^E + w A^S_i`` (no turn rewards)."""
    episode = expected_grpo(rewards, uids, epsilon, norm_by_std=mode == "mean_std_norm")
    returns = [
        [gamma ** (len(row) - 1 - i) * reward for i in range(len(row))]
        for row, reward in zip(states, rewards, strict=True)
    ]
    groups: dict[tuple[str, str], list[float]] = {}
    for b, row in enumerate(states):
        for i, state in enumerate(row):
            groups.setdefault((uids[b], state), []).append(returns[b][i])
    out = []
    for b, row in enumerate(states):
        values = []
        for i, state in enumerate(row):
            group = groups[(uids[b], state)]
            step = 0.0
            if len(group) > 1:
                mean = sum(group) / len(group)
                step = returns[b][i] - mean
                if mode == "mean_std_norm":
                    std = math.sqrt(sum((g - mean) ** 2 for g in group) / (len(group) - 1))
                    step = step / (std + eps)
            values.append(episode[b] + step_advantage_w * step)
        out.append(values)
    return out


def expected_turn_reward(
    rewards: list[float],
    uids: list[str],
    states: list[list[str]],
    turn_rewards: list[list[float] | None],
    lambda_turn: float = 1.0,
    gamma: float = 1.0,
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
) -> list[list[float]]:
    """docs/design.md section 4b ``turn_reward``: ``A_i = A_tau + lambda (G_i - b_i)``, ``b_i`` the mean ``G`` of
    the *other* rollouts of the uid at the same anchor state, else at the same turn index."""
    a_tau = expected_grpo(rewards, uids, epsilon, norm_by_std)
    returns: list[list[float] | None] = []
    for row in turn_rewards:
        if row is None:
            returns.append(None)
            continue
        g = [0.0] * len(row)
        running = 0.0
        for i in range(len(row) - 1, -1, -1):
            running = row[i] + gamma * running
            g[i] = running
        returns.append(g)
    out = []
    for b, row in enumerate(states):
        mine = returns[b]
        values = []
        for i, state in enumerate(row):
            term = 0.0
            if mine is not None:
                others = [
                    returns[o][j]
                    for o in range(len(states))
                    if o != b and uids[o] == uids[b] and returns[o] is not None
                    for j, other_state in enumerate(states[o])
                    if other_state == state
                ]
                if not others:
                    others = [
                        returns[o][i]
                        for o in range(len(states))
                        if o != b and uids[o] == uids[b] and returns[o] is not None and i < len(states[o])
                    ]
                if others:
                    term = mine[i] - sum(others) / len(others)
            values.append(a_tau[b] + lambda_turn * term)
        out.append(values)
    return out


# ---------------------------------------------------------------------------------------------
# The IAPO hand case: no z clipped, direct user inputs, the e * din term of phi-
# ---------------------------------------------------------------------------------------------

# 4 actions, L = [2, 1, 3, 2] (L = 8).
#   u_0 = 1, u_1 = 1 (direct user inputs); + edges 0 -> 1 (input), 0 -> 3 (success_utilization);
#   e_1 = 1, e_2 = 1; - edge 1 -> 2 (action 2 reuses action 1's invalid output).
HAND_GRAPH: dict[str, Any] = {
    "num_actions": 4,
    "errors": [
        {"action": 1, "kind": "tool_error", "evidence": "order #W99 not found"},
        {"action": 2, "kind": "tool_error", "evidence": "refund of #W99 failed"},
    ],
    "direct_user_inputs": {"0": 1, "1": 1},
    "edges": [
        {"src": 0, "dst": 1, "sign": "+", "type": "input", "unit": "order_id=#W12"},
        {"src": 0, "dst": 3, "sign": "+", "type": "success_utilization", "unit": "method=card"},
        {"src": 1, "dst": 2, "sign": "-", "type": "failed_utilization", "unit": "#W99"},
    ],
}
HAND_LENGTHS = [2, 1, 3, 2]
HAND_DEGREES = {"d_plus": [2.0, 0.0, 0.0, 0.0], "d_minus": [0.0, 1.0, 0.0, 0.0], "d_in": [1.0, 2.0, 0.0, 1.0]}
HAND_ERRORS = [0.0, 1.0, 1.0, 0.0]
HAND_PARAMS = {"beta_plus": 0.3, "clip_c": 2.5, "beta_minus": 0.8, "eps": 1e-6}


def hand_expected() -> dict[str, list[float]]:
    """docs/design.md section 3 on HAND_GRAPH with HAND_PARAMS, step by step (numbers in the comments)."""
    ln2, ln3, ln4, ln5 = math.log(2.0), math.log(3.0), math.log(4.0), math.log(5.0)
    eps, beta_plus, beta_minus = 1e-6, 0.3, 0.8  # clip_c = 2.5: no z below reaches it
    total = 2.0 + 1.0 + 3.0 + 2.0  # L = 8
    # degrees: d+ = [2, 0, 0, 0], d- = [0, 1, 0, 0], din = u + in(+) = [1 + 0, 1 + 1, 0, 0 + 1] = [1, 2, 0, 1]
    # phi+ = log(1 + d+ + din) = [log 4, log 3, log 1, log 2]
    phi_plus = [ln4, ln3, 0.0, ln2]
    # phi- = log(1 + e (1 + d- + din)): action 1: log(1 + 1*(1 + 1 + 2)) = log 5 (din_1 = 2 inside, the
    # e * din term); action 2: log(1 + 1*(1 + 0 + 0)) = log 2; actions 0 and 3 have e = 0
    phi_minus = [0.0, ln5, ln2, 0.0]

    # --- m+ ---
    mean_p = (2 * ln4 + 1 * ln3 + 3 * 0.0 + 2 * ln2) / total  # (6 ln2 + ln3) / 8 = 0.657186922
    c_p0, c_p1, c_p2, c_p3 = (
        ln4 - mean_p,
        ln3 - mean_p,
        0.0 - mean_p,
        ln2 - mean_p,
    )  # .7291074 .4414254 -.6571869 .0359603
    var_p = (2 * c_p0**2 + 1 * c_p1**2 + 3 * c_p2**2 + 2 * c_p3**2) / total  # 0.319540238
    std_p = math.sqrt(var_p)  # 0.565278903
    z_p = [c_p0 / (std_p + eps), c_p1 / (std_p + eps), c_p2 / (std_p + eps), c_p3 / (std_p + eps)]
    # z+ = [1.2898167, 0.7808970, -1.1625867, 0.0636150]: all inside [-2.5, 2.5], nothing clipped
    ex_p = [math.exp(z_p[0]), math.exp(z_p[1]), math.exp(z_p[2]), math.exp(z_p[3])]  # 3.63212 2.18343 .31268 1.06568
    norm_p = (2 * ex_p[0] + 1 * ex_p[1] + 3 * ex_p[2] + 2 * ex_p[3]) / total  # 1.564633003
    m_plus = [ex_p[0] / norm_p, ex_p[1] / norm_p, ex_p[2] / norm_p, ex_p[3] / norm_p]
    # m+ = [2.3213882, 1.3954901, 0.1998400, 0.6811067]

    # --- m- ---
    mean_m = (2 * 0.0 + 1 * ln5 + 3 * ln2 + 2 * 0.0) / total  # (ln5 + 3 ln2) / 8 = 0.461109932
    psi = [0.0 - mean_m, ln5 - mean_m, ln2 - mean_m, 0.0 - mean_m]  # psi- = [-.4611099, 1.1483280, .2320372, -.4611099]
    var_m = (2 * psi[0] ** 2 + 1 * psi[1] ** 2 + 3 * psi[2] ** 2 + 2 * psi[3] ** 2) / total  # 0.29133381
    std_m = math.sqrt(var_m)  # 0.539753472
    z_m = [psi[0] / (std_m + eps), psi[1] / (std_m + eps), psi[2] / (std_m + eps), psi[3] / (std_m + eps)]
    # z- = [-0.8542957, 2.1275006, 0.4298941, -0.8542957]: all inside [-2.5, 2.5], nothing clipped
    ex_m = [math.exp(z_m[0]), math.exp(z_m[1]), math.exp(z_m[2]), math.exp(z_m[3])]  # .42558 8.39386 1.53709 .42558
    norm_m = (2 * ex_m[0] + 1 * ex_m[1] + 3 * ex_m[2] + 2 * ex_m[3]) / total  # 1.838434575
    m_minus = [ex_m[0] / norm_m, ex_m[1] / norm_m, ex_m[2] / norm_m, ex_m[3] / norm_m]
    # m- = [0.2314920, 4.5657655, 0.8360889, 0.2314920]

    # --- w+ = L m+ exp(-beta+ psi-) / sum L m+ exp(-beta+ psi-) ---
    t_p = [m_plus[i] * math.exp(-beta_plus * psi[i]) for i in range(4)]  # 2.66578 .98881 .18640 .78215
    mass_p = 2 * t_p[0] + 1 * t_p[1] + 3 * t_p[2] + 2 * t_p[3]  # 8.443893856
    w_plus = [total * t_p[0] / mass_p, total * t_p[1] / mass_p, total * t_p[2] / mass_p, total * t_p[3] / mass_p]
    # w+ = [2.5256446, 0.9368288, 0.1766030, 0.7410365]

    # --- projected w- = L m+ exp(+beta- psi-) / sum L m+ exp(+beta- psi-) ---
    t_m = [m_plus[i] * math.exp(beta_minus * psi[i]) for i in range(4)]  # 1.60525 3.49701 .24060 .47099
    mass_m = 2 * t_m[0] + 1 * t_m[1] + 3 * t_m[2] + 2 * t_m[3]  # 8.371285036
    w_projected = [total * t_m[i] / mass_m for i in range(4)]
    # w- (projected) = [1.5340504, 3.3419090, 0.2299314, 0.4500979]
    return {
        "phi_plus": phi_plus,
        "phi_minus": phi_minus,
        "z_plus": z_p,
        "z_minus": z_m,
        "m_plus": m_plus,
        "m_minus": m_minus,
        "w_plus": w_plus,
        "w_projected": w_projected,
    }


def _hand_tensors(rows: int = 1) -> dict[str, torch.Tensor]:
    def t(values: list[float]) -> torch.Tensor:
        return torch.tensor([values] * rows, dtype=torch.float64)

    return {
        "d_plus": t(HAND_DEGREES["d_plus"]),
        "d_minus": t(HAND_DEGREES["d_minus"]),
        "d_in": t(HAND_DEGREES["d_in"]),
        "errors": t(HAND_ERRORS),
        "lengths": t([float(x) for x in HAND_LENGTHS]),
    }


def _iapo(advantages: list[float], **params: Any) -> dict[str, torch.Tensor]:
    tensors = _hand_tensors(len(advantages))
    return compute_iapo_weights(
        torch.tensor(advantages, dtype=torch.float64),
        tensors["d_plus"],
        tensors["d_minus"],
        tensors["d_in"],
        tensors["errors"],
        tensors["lengths"],
        **params,
    )


def _hand_expected_iapo(advantage: float, **params: Any) -> list[float]:
    return expected_iapo(
        advantage,
        HAND_DEGREES["d_plus"],
        HAND_DEGREES["d_minus"],
        HAND_DEGREES["d_in"],
        HAND_ERRORS,
        [float(x) for x in HAND_LENGTHS],
        **params,
    )


def test_iapo_hand_case_no_clip_features_and_bounded_weights() -> None:
    hand = hand_expected()
    # the premise: no z-score reaches the clip bound (c = 2.5), so every feature value matters
    assert max(abs(z) for z in hand["z_plus"] + hand["z_minus"]) < HAND_PARAMS["clip_c"] - 0.3
    # and the graph is what the degrees say (u_i enters din; e_1 = 1 with din_1 = 2)
    graph, report = validate_graph(HAND_GRAPH, 4)
    assert not report.fallback and report.repaired_edges == 0 and report.errors_added == 0
    d_plus, d_minus, d_in = graph.degrees()
    assert d_plus.tolist() == HAND_DEGREES["d_plus"]
    assert d_minus.tolist() == HAND_DEGREES["d_minus"]
    assert d_in.tolist() == HAND_DEGREES["d_in"]
    assert graph.error_indicator().tolist() == HAND_ERRORS

    out = _iapo([0.7], **{**HAND_PARAMS, "neg_route": "error"})
    assert out["phi_plus"][0].tolist() == pytest.approx(hand["phi_plus"], abs=1e-12)
    assert out["phi_minus"][0].tolist() == pytest.approx(hand["phi_minus"], abs=1e-12)
    assert out["m_plus"][0].tolist() == pytest.approx(hand["m_plus"], rel=1e-9)
    assert out["m_minus"][0].tolist() == pytest.approx(hand["m_minus"], rel=1e-9)
    # the numbers written in hand_expected's comments
    assert hand["m_plus"] == pytest.approx([2.3213882, 1.3954901, 0.1998400, 0.6811067], abs=1e-6)
    assert hand["m_minus"] == pytest.approx([0.2314920, 4.5657655, 0.8360889, 0.2314920], abs=1e-6)
    assert hand["w_plus"] == pytest.approx([2.5256446, 0.9368288, 0.1766030, 0.7410365], abs=1e-6)
    assert hand["w_projected"] == pytest.approx([1.5340504, 3.3419090, 0.2299314, 0.4500979], abs=1e-6)


def test_iapo_hand_case_routes_each_branch() -> None:
    hand = hand_expected()
    for neg_route, negative in (
        ("error", hand["m_minus"]),
        ("support", hand["m_plus"]),
        ("projected", hand["w_projected"]),
    ):
        out = _iapo([0.7, -0.7, 0.0], **{**HAND_PARAMS, "neg_route": neg_route})
        assert out["w_plus"][0].tolist() == pytest.approx(hand["w_plus"], rel=1e-9), neg_route
        assert out["weight"][0].tolist() == pytest.approx(hand["w_plus"], rel=1e-9), neg_route
        assert out["weight"][1].tolist() == pytest.approx(negative, rel=1e-9), neg_route
        assert out["w_minus"][1].tolist() == pytest.approx(negative, rel=1e-9), neg_route
        assert out["weight"][2].tolist() == [1.0, 1.0, 1.0, 1.0]
        # mass conservation: sum L_i w_i = L
        for row in (0, 1):
            assert sum(
                length * w for length, w in zip(HAND_LENGTHS, out["weight"][row].tolist(), strict=True)
            ) == pytest.approx(8.0)


def test_expected_helpers_reproduce_the_hand_case() -> None:
    """The helper used by the parametrized tests below agrees with the step-by-step arithmetic."""
    hand = hand_expected()
    assert _hand_expected_iapo(1.0, **HAND_PARAMS) == pytest.approx(hand["w_plus"], rel=1e-12)
    assert _hand_expected_iapo(-1.0, **HAND_PARAMS, neg_route="error") == pytest.approx(hand["m_minus"], rel=1e-12)
    assert _hand_expected_iapo(-1.0, **HAND_PARAMS, neg_route="support") == pytest.approx(hand["m_plus"], rel=1e-12)
    assert _hand_expected_iapo(-1.0, **HAND_PARAMS, neg_route="projected") == pytest.approx(
        hand["w_projected"], rel=1e-12
    )


def test_iapo_hand_case_through_batch_credit_and_from_mapping() -> None:
    """``credit.iapo.*`` from a mapping -> compute_batch_credit -> the hand numbers (both signs)."""
    hand = hand_expected()
    graph, _ = validate_graph(HAND_GRAPH, 4)
    config = CreditConfig.from_mapping({"estimator": "iapo", "iapo": {**HAND_PARAMS, "neg_route": "projected"}})
    scores = trajectory_scores([1.0, 0.0])
    credit = compute_batch_credit(scores, ["g", "g"], [HAND_LENGTHS, HAND_LENGTHS], config, graphs=[graph, graph])
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # R = [1, 0]: mu = 0.5, sigma = sqrt(0.5) (Bessel)
    assert credit.trajectory_advantage.tolist() == pytest.approx([a, -a], rel=1e-6)
    assert credit.weights_of(0) == pytest.approx(hand["w_plus"], rel=1e-9)
    assert credit.weights_of(1) == pytest.approx(hand["w_projected"], rel=1e-9)
    assert credit.advantages_of(0) == pytest.approx([a * w for w in hand["w_plus"]], rel=1e-6)
    assert credit.advantages_of(1) == pytest.approx([-a * w for w in hand["w_projected"]], rel=1e-6)


# ---------------------------------------------------------------------------------------------
# compute_iapo_weights: each parameter, one at a time
# ---------------------------------------------------------------------------------------------

IAPO_VARIANTS: dict[str, dict[str, Any]] = {
    "beta_plus": {"beta_plus": 0.3},
    "beta_plus_zero": {"beta_plus": 0.0},
    "clip_c_wide": {"clip_c": 2.5},
    "clip_c_narrow": {"clip_c": 0.1},
    "neg_route_support": {"neg_route": "support"},
    "neg_route_projected": {"neg_route": "projected"},
    "beta_minus": {"neg_route": "projected", "beta_minus": 0.8},
    "beta_minus_vs_beta_plus": {"neg_route": "projected", "beta_plus": 0.6, "beta_minus": 0.1},
    "eps": {"clip_c": 2.5, "eps": 0.25},
}


@pytest.mark.parametrize("name", list(IAPO_VARIANTS))
def test_iapo_weights_follow_each_parameter(name: str) -> None:
    params = IAPO_VARIANTS[name]
    baseline = {"clip_c": 2.5} if name == "eps" else {}  # eps is visible only where z is not clipped
    out = _iapo([0.7, -0.7], **params)
    for row, advantage in enumerate((0.7, -0.7)):
        expected = _hand_expected_iapo(advantage, **params)
        assert out["weight"][row].tolist() == pytest.approx(expected, rel=1e-9), (name, advantage)
    # the parameter is visible: some branch differs from the one without it
    moved = [
        max(
            abs(x - y)
            for x, y in zip(_hand_expected_iapo(a, **params), _hand_expected_iapo(a, **baseline), strict=True)
        )
        for a in (0.7, -0.7)
    ]
    assert max(moved) > 1e-3, name


# ---------------------------------------------------------------------------------------------
# GRPO: epsilon and norm_adv_by_std_in_grpo
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("epsilon", "norm"), [(1e-6, True), (0.5, True), (0.5, False), (2.0, True)])
def test_grpo_trajectory_advantage_epsilon_and_norm(epsilon: float, norm: bool) -> None:
    rewards = [1.0, 0.0, 0.0, 2.0, 3.0, 5.0]
    uids = ["a", "a", "a", "b", "c", "c"]
    got = compute_grpo_trajectory_advantage(
        torch.tensor(rewards, dtype=torch.float32), uids, epsilon=epsilon, norm_adv_by_std_in_grpo=norm
    )
    # by hand: group a: mu = 1/3, sigma = sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3);
    # group b (one sample): mu = 0, sigma = 1; group c: mu = 4, sigma = sqrt((1 + 1) / 1) = sqrt(2)
    s_a, s_c = math.sqrt(1 / 3), math.sqrt(2.0)
    if norm:
        hand = [
            (2 / 3) / (s_a + epsilon),
            (-1 / 3) / (s_a + epsilon),
            (-1 / 3) / (s_a + epsilon),
            2.0 / (1.0 + epsilon),
            -1.0 / (s_c + epsilon),
            1.0 / (s_c + epsilon),
        ]
    else:
        hand = [2 / 3, -1 / 3, -1 / 3, 2.0, -1.0, 1.0]
    assert got.tolist() == pytest.approx(hand, rel=1e-6)
    assert hand == pytest.approx(expected_grpo(rewards, uids, epsilon, norm), rel=1e-12)


# ---------------------------------------------------------------------------------------------
# compute_batch_credit + CreditConfig.from_mapping: every credit.* math key of the estimators
# ---------------------------------------------------------------------------------------------

BATCH_REWARDS = [1.0, 0.0, 2.0]
BATCH_UIDS = ["g", "g", "h"]  # "h" is a group of one: mu = 0, sigma = 1


def _batch_iapo(mapping: dict[str, Any]) -> Any:
    graph, _ = validate_graph(HAND_GRAPH, 4)
    config = CreditConfig.from_mapping({"estimator": "iapo", **mapping})
    return compute_batch_credit(
        trajectory_scores(BATCH_REWARDS), BATCH_UIDS, [HAND_LENGTHS] * 3, config, graphs=[graph] * 3
    )


IAPO_KEYS: dict[str, dict[str, Any]] = {
    "iapo.beta_plus": {"iapo": {"beta_plus": 0.3}},
    "iapo.clip_c": {"iapo": {"clip_c": 2.5}},
    "iapo.neg_route=support": {"iapo": {"neg_route": "support"}},
    "iapo.neg_route=projected": {"iapo": {"neg_route": "projected"}},
    "iapo.beta_minus": {"iapo": {"neg_route": "projected", "beta_minus": 0.8}},
    "iapo.eps": {"iapo": {"clip_c": 2.5, "eps": 0.25}},
    "epsilon": {"epsilon": 0.5},
    "norm_adv_by_std_in_grpo": {"norm_adv_by_std_in_grpo": False},
}


@pytest.mark.parametrize("key", list(IAPO_KEYS))
def test_iapo_credit_keys_reach_batch_credit(key: str) -> None:
    mapping = IAPO_KEYS[key]
    credit = _batch_iapo(mapping)
    iapo_params = dict(mapping.get("iapo", {}))
    epsilon = mapping.get("epsilon", 1e-6)
    norm = mapping.get("norm_adv_by_std_in_grpo", True)
    advantages = expected_grpo(BATCH_REWARDS, BATCH_UIDS, epsilon, norm)
    assert credit.trajectory_advantage.tolist() == pytest.approx(advantages, rel=1e-6)
    for row, advantage in enumerate(advantages):
        weights = _hand_expected_iapo(advantage, **iapo_params)
        assert credit.weights_of(row) == pytest.approx(weights, rel=1e-9), (key, row)
        assert credit.advantages_of(row) == pytest.approx([advantage * w for w in weights], rel=1e-5), (key, row)
    # visible: the numbers differ from the defaults' (iapo.eps: from clip_c=2.5 without eps)
    reference = _batch_iapo({"iapo": {"clip_c": 2.5}} if key == "iapo.eps" else {})
    assert not torch.allclose(credit.action_advantage, reference.action_advantage, rtol=1e-4, atol=1e-6), key


# call_credit: roles IG, AE, RV, AE; edges 0 -> 1, 0 -> 3 (IG->AE), 1 -> 2 (AE->RV), 2 -> 3 (RV->AE)
CALL_ROLES = ["IG", "AE", "RV", "AE"]
CALL_DEGREE = [2.0, 1.0, 1.0, 0.0]
CALL_LENGTHS = [2, 1, 3, 2]
CALL_GRAPH = CallGraph(
    roles=tuple(CALL_ROLES),
    ambiguous=(False,) * 4,
    edges=(
        CallEdge(0, 1, "IG->AE", "a.py"),
        CallEdge(0, 3, "IG->AE", "b.py"),
        CallEdge(1, 2, "AE->RV", "a.py"),
        CallEdge(2, 3, "RV->AE", "b.py"),
    ),
)


def test_call_credit_hand_case() -> None:
    """docs/design.md section 4 on CALL_GRAPH, by hand, defaults (lambda = 1, gamma = 0.95, omega AE 1 IG .6 RV .4)."""
    # deg + lambda = [3, 2, 2, 1], sum 8; gamma^(T - pos) = [.95^3, .95^2, .95, 1]
    s = [0.6 * 3 / 8 * 0.95**3, 1.0 * 2 / 8 * 0.95**2, 0.4 * 2 / 8 * 0.95, 1.0 * 1 / 8 * 1.0]
    # s = [0.192909375, 0.225625, 0.095, 0.125]
    mass = 2 * s[0] + 1 * s[1] + 3 * s[2] + 2 * s[3]  # 1.146443750
    hand_mass = [8 * value / mass for value in s]
    hand_paper = [4 * value for value in s]
    assert hand_mass == pytest.approx(expected_call_weights(CALL_ROLES, CALL_DEGREE, CALL_LENGTHS), rel=1e-12)
    table = CALL_GRAPH.role_table
    omega = torch.tensor([[DEFAULT_OMEGA[r] for r in CALL_ROLES]], dtype=torch.float64)
    degree = torch.from_numpy(table[0].copy()).unsqueeze(0)
    valid = torch.ones((1, 4), dtype=torch.float64)
    scores = call_credit.compute_call_scores(omega, degree, valid, smoothing=1.0, gamma=0.95)
    assert scores[0].tolist() == pytest.approx(s, rel=1e-12)
    lengths = torch.tensor([CALL_LENGTHS], dtype=torch.float64)
    assert call_credit.compute_call_weights(scores, lengths, valid)[0].tolist() == pytest.approx(hand_mass, rel=1e-12)
    assert call_credit.compute_call_weights(scores, lengths, valid, mode="paper")[0].tolist() == pytest.approx(
        hand_paper, rel=1e-12
    )
    # smoothing 0 and gamma 0.5 change it: s = [.6 * 2/4 * .125, 1 * 1/4 * .25, .4 * 1/4 * .5, 0]
    s0 = call_credit.compute_call_scores(omega, degree, valid, smoothing=0.0, gamma=0.5)
    assert s0[0].tolist() == pytest.approx([0.0375, 0.0625, 0.05, 0.0], abs=1e-15)


CALL_KEYS: dict[str, dict[str, Any]] = {
    "call_credit.mode": {"mode": "paper"},
    "call_credit.smoothing": {"smoothing": 3.0},
    "call_credit.smoothing=0": {"smoothing": 0.0},
    "call_credit.gamma": {"gamma": 0.5},
    "call_credit.omega": {"omega": {"AE": 2.0, "IG": 0.5, "RV": 0.25}},
}


def _batch_call(mapping: dict[str, Any], top: dict[str, Any] | None = None) -> Any:
    config = CreditConfig.from_mapping({"estimator": "call_credit", "call_credit": mapping, **(top or {})})
    return compute_batch_credit(
        trajectory_scores(BATCH_REWARDS), BATCH_UIDS, [CALL_LENGTHS] * 3, config, call_graphs=[CALL_GRAPH] * 3
    )


@pytest.mark.parametrize("key", [*CALL_KEYS, "epsilon", "norm_adv_by_std_in_grpo"])
def test_call_credit_keys_reach_batch_credit(key: str) -> None:
    top = {"epsilon": 0.5} if key == "epsilon" else {"norm_adv_by_std_in_grpo": False} if key.startswith("norm") else {}
    mapping = CALL_KEYS.get(key, {})
    credit = _batch_call(mapping, top)
    advantages = expected_grpo(
        BATCH_REWARDS, BATCH_UIDS, top.get("epsilon", 1e-6), top.get("norm_adv_by_std_in_grpo", True)
    )
    weights = expected_call_weights(CALL_ROLES, CALL_DEGREE, CALL_LENGTHS, **mapping)
    assert credit.trajectory_advantage.tolist() == pytest.approx(advantages, rel=1e-6)
    for row, advantage in enumerate(advantages):
        assert credit.weights_of(row) == pytest.approx(weights, rel=1e-9), (key, row)
        assert credit.advantages_of(row) == pytest.approx([advantage * w for w in weights], rel=1e-5), (key, row)
    reference = _batch_call({})
    assert not torch.allclose(credit.action_advantage, reference.action_advantage, rtol=1e-4, atol=1e-6), key


# gigpo / turn_reward: one uid "g" of three rollouts with two actions each; action 0 shares the state
# "s0", action 1 of rollouts 0 and 2 shares "a1", rollout 1 is alone at "b1"
GIGPO_REWARDS = [1.0, 0.0, 0.5]
GIGPO_UIDS = ["g", "g", "g"]
GIGPO_STATES = [["s0", "a1"], ["s0", "b1"], ["s0", "a1"]]
GIGPO_LENGTHS = [[2, 3], [2, 3], [2, 3]]
TURN_REWARDS: list[list[float] | None] = [[1.0, 0.5], [0.0, 1.0], [0.5, 0.0]]


def test_gigpo_hand_case() -> None:
    """docs/design.md section 4b by hand, defaults (w = 1, gamma = 0.95, mean_norm)."""
    g = 0.95
    # episode (mean_norm: no division): mu = 0.5 -> A^E = [0.5, -0.5, 0.0]
    # R_i = gamma^(T - 1 - i) R: [[g, 1], [0, 0], [0.5 g, 0.5]]
    # state s0: {g, 0, 0.5 g}, mean 0.5 g -> A^S_0 = [0.5 g, -0.5 g, 0]
    # state a1: {1, 0.5}, mean 0.75 -> [0.25, -, -0.25]; b1 alone -> 0
    hand = [[0.5 + 0.5 * g, 0.5 + 0.25], [-0.5 - 0.5 * g, -0.5], [0.0, -0.25]]
    config = CreditConfig.from_mapping({"estimator": "gigpo"})
    credit = compute_batch_credit(
        trajectory_scores(GIGPO_REWARDS), GIGPO_UIDS, GIGPO_LENGTHS, config, anchor_states=GIGPO_STATES
    )
    assert [credit.advantages_of(row) for row in range(3)] == [pytest.approx(r, rel=1e-6, abs=1e-7) for r in hand]
    assert hand == [pytest.approx(r, rel=1e-12) for r in expected_gigpo(GIGPO_REWARDS, GIGPO_UIDS, GIGPO_STATES)]
    # mean_std_norm: A^E = +-0.5 / (0.5 + epsilon) (sigma of {1, 0, .5} is 0.5);
    # s0: sigma = 0.5 g -> A^S_0 = +-0.5 g / (0.5 g + eps); a1: sigma = 0.5 / sqrt 2 -> +-0.25 / (0.35355 + eps)
    eps, epsilon = 0.3, 0.2
    e = 0.5 / (0.5 + epsilon)
    s0 = 0.5 * g / (0.5 * g + eps)
    a1 = 0.25 / (0.5 / math.sqrt(2.0) + eps)
    hand_std = [[e + 2.0 * s0, e + 2.0 * a1], [-e - 2.0 * s0, -e], [0.0, -2.0 * a1]]
    config = CreditConfig.from_mapping(
        {
            "estimator": "gigpo",
            "epsilon": epsilon,
            "gigpo": {"mode": "mean_std_norm", "eps": eps, "step_advantage_w": 2.0},
        }
    )
    credit = compute_batch_credit(
        trajectory_scores(GIGPO_REWARDS), GIGPO_UIDS, GIGPO_LENGTHS, config, anchor_states=GIGPO_STATES
    )
    assert [credit.advantages_of(row) for row in range(3)] == [pytest.approx(r, rel=1e-6, abs=1e-7) for r in hand_std]


GIGPO_KEYS: dict[str, dict[str, Any]] = {
    "gigpo.step_advantage_w": {"gigpo": {"step_advantage_w": 2.5}},
    "gigpo.gamma": {"gigpo": {"gamma": 0.5}},
    "gigpo.mode": {"gigpo": {"mode": "mean_std_norm"}},
    "gigpo.eps": {"gigpo": {"mode": "mean_std_norm", "eps": 0.3}},
    "epsilon": {"gigpo": {"mode": "mean_std_norm"}, "epsilon": 0.4},
}


def _batch_gigpo(mapping: dict[str, Any], turn_rewards: list[list[float] | None] | None = None) -> Any:
    config = CreditConfig.from_mapping({"estimator": "gigpo", **mapping})
    return compute_batch_credit(
        trajectory_scores(GIGPO_REWARDS),
        GIGPO_UIDS,
        GIGPO_LENGTHS,
        config,
        anchor_states=GIGPO_STATES,
        turn_rewards=turn_rewards,
    )


@pytest.mark.parametrize("key", list(GIGPO_KEYS))
def test_gigpo_keys_reach_batch_credit(key: str) -> None:
    mapping = GIGPO_KEYS[key]
    credit = _batch_gigpo(mapping)
    expected = expected_gigpo(
        GIGPO_REWARDS, GIGPO_UIDS, GIGPO_STATES, epsilon=mapping.get("epsilon", 1e-6), **mapping["gigpo"]
    )
    for row in range(3):
        assert credit.advantages_of(row) == pytest.approx(expected[row], rel=1e-6, abs=1e-7), (key, row)
    reference = _batch_gigpo({"gigpo": {"mode": "mean_std_norm"}} if key in ("gigpo.eps", "epsilon") else {})
    assert not torch.allclose(credit.action_advantage, reference.action_advantage, rtol=1e-4, atol=1e-6), key


def test_gigpo_adds_turn_rewards_to_step_returns() -> None:
    """R_i = gamma^(T-1-i) R + r_i: with turn rewards, s0 = {g + 1, 0 + 0, 0.5 g + 0.5}, a1 = {1.5, 0.5}."""
    g = 0.95
    mean_s0 = (g + 1.0 + 0.0 + 0.5 * g + 0.5) / 3
    hand = [
        [0.5 + (g + 1.0 - mean_s0), 0.5 + (1.5 - 1.0)],
        [-0.5 + (0.0 - mean_s0), -0.5],
        [0.0 + (0.5 * g + 0.5 - mean_s0), 0.0 + (0.5 - 1.0)],
    ]
    credit = _batch_gigpo({}, TURN_REWARDS)
    assert [credit.advantages_of(row) for row in range(3)] == [pytest.approx(r, rel=1e-6, abs=1e-7) for r in hand]


def test_turn_reward_hand_case() -> None:
    """docs/design.md section 4b ``turn_reward`` by hand, lambda = 2, gamma = 0.5."""
    lam, g = 2.0, 0.5
    a = 0.5 / (0.5 + 1e-6)  # R = [1, 0, 0.5]: mu = 0.5, sigma = 0.5 -> A_tau = [a, -a, 0]
    # G_i = sum_{k >= i} g^(k-i) r_k: [[1 + 0.5 g, 0.5], [g, 1], [0.5, 0]]
    g00, g01, g10, g11, g20, g21 = 1 + 0.5 * g, 0.5, g * 1.0, 1.0, 0.5, 0.0
    # baselines: s0 (all three): mean of the other two; a1: the other of {0, 2}; b1 alone -> turn index 1
    hand = [
        [a + lam * (g00 - (g10 + g20) / 2), a + lam * (g01 - g21)],
        [-a + lam * (g10 - (g00 + g20) / 2), -a + lam * (g11 - (g01 + g21) / 2)],
        [0.0 + lam * (g20 - (g00 + g10) / 2), 0.0 + lam * (g21 - g01)],
    ]
    assert hand == [
        pytest.approx(r, rel=1e-12)
        for r in expected_turn_reward(GIGPO_REWARDS, GIGPO_UIDS, GIGPO_STATES, TURN_REWARDS, lam, g)
    ]
    config = CreditConfig.from_mapping({"estimator": "turn_reward", "turn_reward": {"lambda_turn": lam, "gamma": g}})
    credit = compute_batch_credit(
        trajectory_scores(GIGPO_REWARDS),
        GIGPO_UIDS,
        GIGPO_LENGTHS,
        config,
        anchor_states=GIGPO_STATES,
        turn_rewards=TURN_REWARDS,
    )
    assert [credit.advantages_of(row) for row in range(3)] == [pytest.approx(r, rel=1e-6, abs=1e-7) for r in hand]


TURN_KEYS: dict[str, dict[str, Any]] = {
    "turn_reward.lambda_turn": {"turn_reward": {"lambda_turn": 2.5}},
    "turn_reward.gamma": {"turn_reward": {"gamma": 0.5}},
    "epsilon": {"epsilon": 0.5},
    "norm_adv_by_std_in_grpo": {"norm_adv_by_std_in_grpo": False},
}


def _batch_turn(mapping: dict[str, Any]) -> Any:
    config = CreditConfig.from_mapping({"estimator": "turn_reward", **mapping})
    return compute_batch_credit(
        trajectory_scores(GIGPO_REWARDS),
        GIGPO_UIDS,
        GIGPO_LENGTHS,
        config,
        anchor_states=GIGPO_STATES,
        turn_rewards=TURN_REWARDS,
    )


@pytest.mark.parametrize("key", list(TURN_KEYS))
def test_turn_reward_keys_reach_batch_credit(key: str) -> None:
    mapping = TURN_KEYS[key]
    credit = _batch_turn(mapping)
    expected = expected_turn_reward(
        GIGPO_REWARDS,
        GIGPO_UIDS,
        GIGPO_STATES,
        TURN_REWARDS,
        epsilon=mapping.get("epsilon", 1e-6),
        norm_by_std=mapping.get("norm_adv_by_std_in_grpo", True),
        **mapping.get("turn_reward", {}),
    )
    for row in range(3):
        assert credit.advantages_of(row) == pytest.approx(expected[row], rel=1e-6, abs=1e-7), (key, row)
    reference = _batch_turn({})
    assert not torch.allclose(credit.action_advantage, reference.action_advantage, rtol=1e-4, atol=1e-6), key


@pytest.mark.parametrize(
    "mapping", [{"epsilon": 0.5}, {"norm_adv_by_std_in_grpo": False}], ids=["epsilon", "norm_adv_by_std_in_grpo"]
)
def test_grpo_estimator_keys_reach_batch_credit(mapping: dict[str, Any]) -> None:
    config = CreditConfig.from_mapping({"estimator": "grpo", **mapping})
    credit = compute_batch_credit(trajectory_scores(BATCH_REWARDS), BATCH_UIDS, [CALL_LENGTHS] * 3, config)
    advantages = expected_grpo(
        BATCH_REWARDS, BATCH_UIDS, mapping.get("epsilon", 1e-6), mapping.get("norm_adv_by_std_in_grpo", True)
    )
    assert advantages != pytest.approx(expected_grpo(BATCH_REWARDS, BATCH_UIDS), rel=1e-4)
    for row, advantage in enumerate(advantages):
        assert credit.weights_of(row) == [1.0] * 4
        assert credit.advantages_of(row) == pytest.approx([advantage] * 4, rel=1e-6)


# ---------------------------------------------------------------------------------------------
# The CLI: every `verl-credit route` flag reaches the numbers of the credit JSONL
# ---------------------------------------------------------------------------------------------


def _tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _iapo_rollout(rid: str, uid: str, reward: float) -> dict[str, Any]:
    """Four actions with the hand graph given (no annotator involved)."""
    messages = [
        {"role": "system", "content": "You are a retail support agent."},
        {"role": "user", "content": "refund order #W12 to my card please"},
        {"role": "assistant", "content": "Which order number exactly?"},
        {"role": "user", "content": "#W12, card"},
        {"role": "assistant", "content": "", "tool_calls": [_tool_call("c1", "get_order", {"order_id": "#W99"})]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"error": "order #W99 not found"}'},
        {"role": "assistant", "content": "", "tool_calls": [_tool_call("c2", "refund", {"order_id": "#W99"})]},
        {"role": "tool", "tool_call_id": "c2", "content": '{"error": "refund of #W99 failed"}'},
        {"role": "assistant", "content": "Refund to your card is on its way."},
    ]
    return {
        "id": rid,
        "uid": uid,
        "reward": reward,
        "messages": messages,
        "action_token_lengths": HAND_LENGTHS,
        "graph": HAND_GRAPH,
    }


def _coding_rollout(rid: str, reward: float) -> dict[str, Any]:
    """read (IG) -> edit (AE) -> run tests (RV), in one uid."""
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "fix the bug in calc.py"},
        {"role": "assistant", "content": "", "tool_calls": [_tool_call("c1", "read_file", {"path": "calc.py"})]},
        {"role": "tool", "tool_call_id": "c1", "content": "def add(a, b):\n    return a - b\n"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_tool_call("c2", "str_replace", {"path": "calc.py", "old": "a - b", "new": "a + b"})],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "edited calc.py"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_tool_call("c3", "run_tests", {"cmd": "pytest tests/test_calc.py"})],
        },
        {"role": "tool", "tool_call_id": "c3", "content": "1 passed"},
    ]
    return {"id": rid, "uid": "code", "reward": reward, "messages": messages, "action_token_lengths": [2, 3, 4]}


def _dialog_rollout(rid: str, reward: float, first: str, second: str, turns: list[float]) -> dict[str, Any]:
    """Two actions; the prefix before action 0 is shared by all, the user turn before action 1 too."""
    messages = [
        {"role": "system", "content": "You are a retail support agent."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "ok"},
        {"role": "assistant", "content": second},
    ]
    return {
        "id": rid,
        "uid": "g",
        "reward": reward,
        "messages": messages,
        "action_token_lengths": [2, 3],
        "turn_rewards": turns,
    }


def _route(tmp_path: Path, records: list[dict[str, Any]], flags: list[str]) -> list[dict[str, Any]]:
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "credit.jsonl"
    assert main(["route", "--input", str(rollouts), "--out", str(out), *flags]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def _flag_value(flags: list[str], name: str, default: Any, kind: Any = float) -> Any:
    return kind(flags[flags.index(name) + 1]) if name in flags else default


IAPO_CLI: dict[str, list[str]] = {
    "defaults": [],
    "--beta-plus": ["--beta-plus", "0.3"],
    "--clip-c": ["--clip-c", "2.5"],
    "--neg-route support": ["--neg-route", "support"],
    "--neg-route projected": ["--neg-route", "projected"],
    "--neg-route error": ["--neg-route", "error"],
    "--beta-minus": ["--neg-route", "projected", "--beta-minus", "0.8"],
    "--iapo-eps": ["--iapo-eps", "0.5"],
    "--no-norm-by-std": ["--no-norm-by-std"],
}


@pytest.mark.parametrize("case", list(IAPO_CLI))
def test_cli_route_iapo_flags(tmp_path: Path, case: str) -> None:
    flags = IAPO_CLI[case]
    records = [_iapo_rollout("t1", "g", 1.0), _iapo_rollout("t2", "g", 0.0), _iapo_rollout("t3", "h", -2.0)]
    out = _route(tmp_path, records, ["--estimator", "iapo", *flags])
    params = {
        "beta_plus": _flag_value(flags, "--beta-plus", 0.05),
        "clip_c": _flag_value(flags, "--clip-c", 0.25),
        "neg_route": _flag_value(flags, "--neg-route", "error", str),
        "beta_minus": _flag_value(flags, "--beta-minus", 0.05),
        "eps": _flag_value(flags, "--iapo-eps", 1e-6),
    }
    advantages = expected_grpo([1.0, 0.0, -2.0], ["g", "g", "h"], norm_by_std="--no-norm-by-std" not in flags)
    defaults = expected_grpo([1.0, 0.0, -2.0], ["g", "g", "h"])
    moved = 0.0
    for record, advantage, default in zip(out, advantages, defaults, strict=True):
        weights = _hand_expected_iapo(advantage, **params)
        assert record["trajectory_advantage"] == pytest.approx(advantage, rel=1e-6), case
        assert [a["weight"] for a in record["actions"]] == pytest.approx(weights, rel=1e-9), (case, record["id"])
        assert [a["advantage"] for a in record["actions"]] == pytest.approx(
            [advantage * w for w in weights], rel=1e-5
        ), (case, record["id"])
        default_weights = _hand_expected_iapo(default)
        moved = max(moved, *(abs(advantage * w - default * d) for w, d in zip(weights, default_weights, strict=True)))
    if flags and case != "--neg-route error":  # error is the default: this case pins that it is the default
        assert moved > 1e-3, f"{case} is not visible on this data"


def test_cli_route_iapo_hand_case(tmp_path: Path) -> None:
    """All IAPO flags at once, against the step-by-step hand numbers."""
    hand = hand_expected()
    flags = ["--beta-plus", "0.3", "--clip-c", "2.5", "--neg-route", "projected", "--beta-minus", "0.8"]
    out = _route(tmp_path, [_iapo_rollout("t1", "g", 1.0), _iapo_rollout("t2", "g", 0.0)], flags)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert [r["trajectory_advantage"] for r in out] == pytest.approx([a, -a], rel=1e-6)
    assert [x["weight"] for x in out[0]["actions"]] == pytest.approx(hand["w_plus"], rel=1e-9)
    assert [x["weight"] for x in out[1]["actions"]] == pytest.approx(hand["w_projected"], rel=1e-9)
    out = _route(tmp_path, [_iapo_rollout("t1", "g", 1.0), _iapo_rollout("t2", "g", 0.0)], flags[:4])
    assert [x["weight"] for x in out[1]["actions"]] == pytest.approx(hand["m_minus"], rel=1e-9)
    # a file not grouped by uid (routed in memory, not streamed): the same numbers
    records = [_iapo_rollout("t1", "g", 1.0), _iapo_rollout("t3", "h", 0.0), _iapo_rollout("t2", "g", 0.0)]
    out = {r["id"]: r for r in _route(tmp_path, records, flags)}
    assert out["t1"]["trajectory_advantage"] == pytest.approx(a, rel=1e-6)
    assert [x["weight"] for x in out["t1"]["actions"]] == pytest.approx(hand["w_plus"], rel=1e-9)
    assert [x["weight"] for x in out["t2"]["actions"]] == pytest.approx(hand["w_projected"], rel=1e-9)
    assert [x["weight"] for x in out["t3"]["actions"]] == [1.0, 1.0, 1.0, 1.0]  # alone, R = 0: A = 0


CALL_CLI: dict[str, list[str]] = {
    "defaults": [],
    "--gamma": ["--gamma", "0.5"],
    "--smoothing": ["--smoothing", "3"],
    "--smoothing 0": ["--smoothing", "0"],
    "--call-mode": ["--call-mode", "paper"],
    "--call-credit-omega": ["--call-credit-omega", "IG=1,AE=2,RV=0.5"],
    "--no-norm-by-std": ["--no-norm-by-std"],
}


def _omega_flag(flags: list[str]) -> dict[str, float] | None:
    if "--call-credit-omega" not in flags:
        return None
    pairs = (item.split("=") for item in flags[flags.index("--call-credit-omega") + 1].split(","))
    return {role: float(value) for role, value in pairs}


@pytest.mark.parametrize("case", list(CALL_CLI))
def test_cli_route_call_credit_flags(tmp_path: Path, case: str) -> None:
    flags = CALL_CLI[case]
    records = [_coding_rollout("c1", 1.0), _coding_rollout("c2", 0.0), _coding_rollout("c3", 0.0)]
    out = _route(tmp_path, records, ["--estimator", "call_credit", *flags])
    # the rule classifier's graph: IG -> AE (calc.py), AE -> RV; deg = [1, 1, 0]
    assert [a["role"] for a in out[0]["actions"]] == ["IG", "AE", "RV"]
    assert [(e["src"], e["dst"]) for e in out[0]["call_graph"]["edges"]] == [(0, 1), (1, 2)]
    params = {
        "smoothing": _flag_value(flags, "--smoothing", 1.0),
        "gamma": _flag_value(flags, "--gamma", 0.95),
        "mode": _flag_value(flags, "--call-mode", "mass_conserving", str),
        "omega": _omega_flag(flags),
    }
    weights = expected_call_weights(["IG", "AE", "RV"], [1.0, 1.0, 0.0], [2.0, 3.0, 4.0], **params)
    default_weights = expected_call_weights(["IG", "AE", "RV"], [1.0, 1.0, 0.0], [2.0, 3.0, 4.0])
    advantages = expected_grpo([1.0, 0.0, 0.0], ["code"] * 3, norm_by_std="--no-norm-by-std" not in flags)
    defaults = expected_grpo([1.0, 0.0, 0.0], ["code"] * 3)
    moved = 0.0
    for record, advantage, default in zip(out, advantages, defaults, strict=True):
        assert record["trajectory_advantage"] == pytest.approx(advantage, rel=1e-6)
        assert [a["weight"] for a in record["actions"]] == pytest.approx(weights, rel=1e-9), case
        assert [a["advantage"] for a in record["actions"]] == pytest.approx([advantage * w for w in weights], rel=1e-5)
        moved = max(moved, *(abs(advantage * w - default * d) for w, d in zip(weights, default_weights, strict=True)))
    if flags:
        assert moved > 1e-3, f"{case} is not visible on this data"


def test_cli_route_call_credit_gamma_by_hand(tmp_path: Path) -> None:
    """--gamma 0.5: s = [.6 * 2/5 * .25, 1 * 2/5 * .5, .4 * 1/5 * 1] = [.06, .2, .08];
    sum L s = 2 * .06 + 3 * .2 + 4 * .08 = 1.04; w = 9 s / 1.04."""
    out = _route(
        tmp_path,
        [_coding_rollout("c1", 1.0), _coding_rollout("c2", 0.0)],
        ["--estimator", "call_credit", "--gamma", "0.5"],
    )
    assert [a["weight"] for a in out[0]["actions"]] == pytest.approx([9 * 0.06 / 1.04, 9 * 0.2 / 1.04, 9 * 0.08 / 1.04])


GIGPO_RECORDS = [
    _dialog_rollout("d1", 1.0, "a0", "a1", [1.0, 0.5]),
    _dialog_rollout("d2", 0.0, "b0", "b1", [0.0, 1.0]),
    _dialog_rollout("d3", 0.5, "a0", "c1", [0.5, 0.0]),
]
# anchor states: prefix -> action 0 shared by all; action 1 shared by d1 and d3 (same a0 before it)
#                last_observation -> action 1 shared by all three (the same "ok" before it)
PREFIX_STATES = [["s0", "a1"], ["s0", "b1"], ["s0", "a1"]]
LAST_OBSERVATION_STATES = [["s0", "ok"], ["s0", "ok"], ["s0", "ok"]]

GIGPO_CLI: dict[str, list[str]] = {
    "defaults": [],
    "--gigpo-w": ["--gigpo-w", "2.5"],
    "--gigpo-gamma": ["--gigpo-gamma", "0.5"],
    "--gigpo-mode": ["--gigpo-mode", "mean_std_norm"],
    "--gigpo-state": ["--gigpo-state", "last_observation"],
    "--gigpo-eps": ["--gigpo-mode", "mean_std_norm", "--gigpo-eps", "0.5"],
}


@pytest.mark.parametrize("case", list(GIGPO_CLI))
def test_cli_route_gigpo_flags(tmp_path: Path, case: str) -> None:
    flags = GIGPO_CLI[case]
    records = [{k: v for k, v in r.items() if k != "turn_rewards"} for r in GIGPO_RECORDS]
    out = _route(tmp_path, records, ["--estimator", "gigpo", *flags])
    states = LAST_OBSERVATION_STATES if "--gigpo-state" in flags else PREFIX_STATES
    expected = expected_gigpo(
        [1.0, 0.0, 0.5],
        ["g"] * 3,
        states,
        step_advantage_w=_flag_value(flags, "--gigpo-w", 1.0),
        gamma=_flag_value(flags, "--gigpo-gamma", 0.95),
        mode=_flag_value(flags, "--gigpo-mode", "mean_norm", str),
        eps=_flag_value(flags, "--gigpo-eps", 1e-6),
    )
    default = expected_gigpo([1.0, 0.0, 0.5], ["g"] * 3, PREFIX_STATES)
    for record, row in zip(out, expected, strict=True):
        assert [a["advantage"] for a in record["actions"]] == pytest.approx(row, rel=1e-6, abs=1e-7), case
    if flags:
        assert expected != [pytest.approx(r, abs=1e-3) for r in default], f"{case} is not visible on this data"


def test_cli_route_gigpo_state_by_hand(tmp_path: Path) -> None:
    """--gigpo-state last_observation: action 1 of all three shares the state ("ok"):
    R_1 = {1, 0, 0.5}, mean 0.5 -> A^S_1 = [0.5, -0.5, 0]; A^E = [0.5, -0.5, 0] (mean_norm)."""
    records = [{k: v for k, v in r.items() if k != "turn_rewards"} for r in GIGPO_RECORDS]
    out = _route(tmp_path, records, ["--estimator", "gigpo", "--gigpo-state", "last_observation"])
    assert [a["advantage"] for a in out[0]["actions"]][1] == pytest.approx(1.0, rel=1e-6)
    assert [a["advantage"] for a in out[1]["actions"]][1] == pytest.approx(-1.0, rel=1e-6)
    assert [a["advantage"] for a in out[2]["actions"]][1] == pytest.approx(0.0, abs=1e-7)


TURN_CLI: dict[str, list[str]] = {
    "defaults": [],
    "--turn-lambda": ["--turn-lambda", "2.5"],
    "--turn-gamma": ["--turn-gamma", "0.5"],
    "--gigpo-state": ["--gigpo-state", "last_observation"],
    "--no-norm-by-std": ["--no-norm-by-std"],
}


@pytest.mark.parametrize("case", list(TURN_CLI))
def test_cli_route_turn_reward_flags(tmp_path: Path, case: str) -> None:
    flags = TURN_CLI[case]
    out = _route(tmp_path, GIGPO_RECORDS, ["--estimator", "turn_reward", *flags])
    states = LAST_OBSERVATION_STATES if "--gigpo-state" in flags else PREFIX_STATES
    expected = expected_turn_reward(
        [1.0, 0.0, 0.5],
        ["g"] * 3,
        states,
        [r["turn_rewards"] for r in GIGPO_RECORDS],
        lambda_turn=_flag_value(flags, "--turn-lambda", 1.0),
        gamma=_flag_value(flags, "--turn-gamma", 1.0),
        norm_by_std="--no-norm-by-std" not in flags,
    )
    default = expected_turn_reward(
        [1.0, 0.0, 0.5], ["g"] * 3, PREFIX_STATES, [r["turn_rewards"] for r in GIGPO_RECORDS]
    )
    for record, row in zip(out, expected, strict=True):
        assert [a["advantage"] for a in record["actions"]] == pytest.approx(row, rel=1e-6, abs=1e-7), case
    if flags:
        assert expected != [pytest.approx(r, abs=1e-3) for r in default], f"{case} is not visible on this data"


@pytest.mark.parametrize("flags", [[], ["--no-norm-by-std"]], ids=["defaults", "--no-norm-by-std"])
def test_cli_route_grpo_flags(tmp_path: Path, flags: list[str]) -> None:
    out = _route(
        tmp_path,
        [_coding_rollout("c1", 1.0), _coding_rollout("c2", 0.0), _coding_rollout("c3", 0.0)],
        ["--estimator", "grpo", *flags],
    )
    # R = [1, 0, 0]: mu = 1/3, sigma = sqrt(1/3); without the division A = R - mu
    s = math.sqrt(1 / 3)
    hand = [2 / 3, -1 / 3, -1 / 3] if flags else [(2 / 3) / (s + 1e-6), (-1 / 3) / (s + 1e-6), (-1 / 3) / (s + 1e-6)]
    for record, advantage in zip(out, hand, strict=True):
        assert [a["weight"] for a in record["actions"]] == [1.0, 1.0, 1.0]
        assert [a["advantage"] for a in record["actions"]] == pytest.approx([advantage] * 3, rel=1e-6)


def test_cli_route_estimator_flag_selects_the_math(tmp_path: Path) -> None:
    records = [_iapo_rollout("t1", "g", 1.0), _iapo_rollout("t2", "g", 0.0)]
    iapo = _route(tmp_path, records, ["--estimator", "iapo", "--clip-c", "2.5"])
    grpo = _route(tmp_path, records, ["--estimator", "grpo", "--clip-c", "2.5"])
    assert [r["estimator"] for r in iapo + grpo] == ["iapo", "iapo", "grpo", "grpo"]
    assert [a["weight"] for a in iapo[0]["actions"]] == pytest.approx(_hand_expected_iapo(1.0, clip_c=2.5), rel=1e-9)
    assert [a["weight"] for a in grpo[0]["actions"]] == [1.0, 1.0, 1.0, 1.0]


def test_cli_route_annotator_and_fallback_flags(tmp_path: Path) -> None:
    """Lines without a graph go through --annotator; an unreachable LLM with --fallback uniform gives
    the uniform graph (w = 1), with --fallback rules the rule annotator's graph (w != 1 here)."""
    records = [{**_iapo_rollout("t1", "g", 1.0), "graph": None}, {**_iapo_rollout("t2", "g", 0.0), "graph": None}]
    llm = ["--annotator", "llm", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--max-retries", "0"]
    llm += ["--timeout", "2", "--max-model-len", "0"]
    uniform = _route(tmp_path, records, [*llm, "--fallback", "uniform"])
    assert all(a["weight"] == 1.0 for r in uniform for a in r["actions"])
    assert all(r["fallback"] for r in uniform)
    rules = _route(tmp_path, records, ["--annotator", "rules"])
    via_fallback = _route(tmp_path, records, [*llm, "--fallback", "rules"])
    rule_weights = [[a["weight"] for a in r["actions"]] for r in rules]
    assert any(abs(w - 1.0) > 1e-3 for row in rule_weights for w in row), "the rules find no edge on this data"
    assert [[a["weight"] for a in r["actions"]] for r in via_fallback] == rule_weights


# ---------------------------------------------------------------------------------------------
# info_gain (InfoPO, verl_credit/credit_math/info_gain.py equations 2-6): keys and flags
# ---------------------------------------------------------------------------------------------


def expected_info_gain(
    rewards: list[float],
    uids: list[str],
    lengths: list[list[int]],
    gains: list[list[float | None]],
    weight: float = 0.1,
    gate_temperature: float = 0.05,
    normalize: bool = True,
    eps: float = 1e-6,
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
) -> list[list[float]]:
    """``A_i = A_tau + weight * sigmoid(-sigma_g / T) * rho * Ahat_i`` in plain Python: r = IG / L per
    token; Ahat = (r - mu_g) / (s_g + eps) over the group's non-zero tokens (one token: 0); rho =
    min(1, max(s_A + eps, 1) / (s_Ahat + eps)) over all tokens; sigma_g the Bessel std of the group's
    rewards (1 alone)."""

    def stdev(values: list[float]) -> float:
        if len(values) < 2:
            return 0.0
        mean = sum(values) / len(values)
        return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))

    advantage = expected_grpo(rewards, uids, epsilon, norm_by_std)
    tokens = [
        [g / n if g is not None and n > 0 else 0.0 for g, n in zip(row, sizes, strict=True)]
        for row, sizes in zip(gains, lengths, strict=True)
    ]
    pooled: dict[str, list[float]] = {}
    for row, sizes, uid in zip(tokens, lengths, uids, strict=True):
        pooled.setdefault(uid, []).extend(r for r, n in zip(row, sizes, strict=True) for _ in range(n) if r != 0)
    intrinsic = []
    for row, uid in zip(tokens, uids, strict=True):
        values = pooled[uid]
        mean = sum(values) / len(values) if values else 0.0
        scale = 1.0 if len(values) == 1 else stdev(values)
        if not normalize:
            intrinsic.append(list(row))
        else:
            intrinsic.append(
                [0.0 if r == 0 else ((r - mean) / (scale + eps) if norm_by_std else r - mean) for r in row]
            )
    outcome_tokens = [a for a, sizes in zip(advantage, lengths, strict=True) for n in sizes for _ in range(n)]
    intrinsic_tokens = [
        v
        for row, sizes in zip(intrinsic, lengths, strict=True)
        for v, n in zip(row, sizes, strict=True)
        for _ in range(n)
    ]
    rho = min(1.0, max(stdev(outcome_tokens) + eps, 1.0) / (stdev(intrinsic_tokens) + eps))
    out = []
    for b, uid in enumerate(uids):
        group = [r for r, u in zip(rewards, uids, strict=True) if u == uid]
        sigma = 1.0 if len(group) == 1 else stdev(group)
        gate = 1.0 / (1.0 + math.exp(sigma / gate_temperature))
        out.append([advantage[b] + weight * gate * rho * v for v in intrinsic[b]])
    return out


INFO_REWARDS = [1.0, 0.0, 0.5, 0.0, 0.0]
INFO_UIDS = ["g", "g", "g", "h", "h"]
INFO_LENGTHS = [[2, 3]] * 5
INFO_GAINS: list[list[float | None]] = [[0.4, None], [0.2, None], [None, None], [9.0, None], [1.0, None]]
INFO_KEYS: dict[str, dict[str, Any]] = {
    "info_gain.weight": {"info_gain": {"weight": 0.5}},
    "info_gain.gate_temperature": {"info_gain": {"gate_temperature": 5.0}},
    "info_gain.normalize": {"info_gain": {"normalize": False}},
    "info_gain.eps": {"info_gain": {"eps": 0.5}},
}


def test_info_gain_hand_case() -> None:
    """Group h (rewards 0, 0: A = 0, gate 1/2): token rewards 9/2 = 4.5 (2 tokens) and 1/2 = 0.5 (2
    tokens); mean 2.5, Bessel std sqrt(4 * 4 / 3) = 2.3094 -> Ahat = +-2 / 2.3094 = +-0.86603. Group g:
    0.2 and 0.1 (2 tokens each), mean 0.15, std sqrt(4 * 0.0025 / 3) = 0.057735 -> Ahat = +-0.86603.
    All 25 tokens: Ahat has 8 non-zero tokens of +-0.86603 -> std sqrt(8 * 0.75 / 24) = 0.5; A_tau
    (+-1 x 5 tokens, 0 x 15) -> std sqrt(10 / 24) = 0.6455, so rho = min(1, 1 / 0.5) = 1.
    A(h0, 0) = 0 + 0.1 * 0.5 * 1 * 0.86603 = 0.043301."""
    ahat = 2 / math.sqrt(16 / 3)
    assert ahat == pytest.approx(0.86603, abs=1e-5)
    expected = expected_info_gain(INFO_REWARDS, INFO_UIDS, INFO_LENGTHS, INFO_GAINS)
    assert expected[3][0] == pytest.approx(0.1 * 0.5 * (2 / (math.sqrt(16 / 3) + 1e-6)), rel=1e-9)
    assert expected[4][0] == pytest.approx(-expected[3][0], rel=1e-9)
    assert expected[3][0] == pytest.approx(0.043301, abs=1e-6)
    credit = _batch_info({})
    for row in range(5):
        assert credit.advantages_of(row) == pytest.approx(expected[row], rel=1e-6, abs=1e-7), row


def _batch_info(mapping: dict[str, Any]) -> Any:
    config = CreditConfig.from_mapping({"estimator": "info_gain", **mapping})
    return compute_batch_credit(
        trajectory_scores(INFO_REWARDS), INFO_UIDS, INFO_LENGTHS, config, information_gains=INFO_GAINS
    )


@pytest.mark.parametrize("key", list(INFO_KEYS))
def test_info_gain_keys_reach_batch_credit(key: str) -> None:
    mapping = INFO_KEYS[key]
    credit = _batch_info(mapping)
    expected = expected_info_gain(INFO_REWARDS, INFO_UIDS, INFO_LENGTHS, INFO_GAINS, **mapping["info_gain"])
    for row in range(5):
        assert credit.advantages_of(row) == pytest.approx(expected[row], rel=1e-6, abs=1e-7), (key, row)
    reference = _batch_info({})
    assert not torch.allclose(credit.action_advantage, reference.action_advantage, rtol=1e-4, atol=1e-6), key


INFO_CLI: dict[str, list[str]] = {
    "defaults": [],
    "--info-weight": ["--info-weight", "0.5"],
    "--info-gate-temperature": ["--info-gate-temperature", "5"],
    "--info-no-normalize": ["--info-no-normalize"],
    "--no-info-gain-normalize": ["--no-info-gain-normalize"],
    "--info-gain-normalize": ["--info-no-normalize", "--info-gain-normalize"],  # the last one given wins
    "--info-gain-eps": ["--info-gain-eps", "0.5"],
}


@pytest.mark.parametrize("case", list(INFO_CLI))
def test_cli_route_info_gain_flags(tmp_path: Path, case: str) -> None:
    """Each line carries its ``information_gains``; the route command routes the file as one batch."""
    flags = INFO_CLI[case]
    records = [
        {**_dialog_rollout(f"d{n}", reward, "a0", "a1", [0.0, 0.0]), "uid": uid, "information_gains": gains}
        for n, (reward, uid, gains) in enumerate(zip(INFO_REWARDS, INFO_UIDS, INFO_GAINS, strict=True))
    ]
    records = [{k: v for k, v in r.items() if k != "turn_rewards"} for r in records]
    out = _route(tmp_path, records, ["--estimator", "info_gain", *flags])
    expected = expected_info_gain(
        INFO_REWARDS,
        INFO_UIDS,
        INFO_LENGTHS,
        INFO_GAINS,
        weight=_flag_value(flags, "--info-weight", 0.1),
        gate_temperature=_flag_value(flags, "--info-gate-temperature", 0.05),
        normalize=not flags or flags[-1] not in ("--info-no-normalize", "--no-info-gain-normalize"),
        eps=_flag_value(flags, "--info-gain-eps", 1e-6),
    )
    default = expected_info_gain(INFO_REWARDS, INFO_UIDS, INFO_LENGTHS, INFO_GAINS)
    for record, row in zip(out, expected, strict=True):
        assert [a["advantage"] for a in record["actions"]] == pytest.approx(row, rel=1e-6, abs=1e-7), case
    if flags and case != "--info-gain-normalize":  # normalizing is the default: this case pins that
        assert expected != [pytest.approx(r, abs=1e-3) for r in default], f"{case} is not visible on this data"


# ---------------------------------------------------------------------------------------------
# CALL-CREDIT's token hook in ``verl-credit route``: alpha fusion and the RV reward
# ---------------------------------------------------------------------------------------------


def _self_correcting_rollout(rid: str, reward: float) -> dict[str, Any]:
    """run tests (RV, fails naming calc.py) -> edit calc.py (AE) -> run tests (RV, passes): the rule
    classifier's graph is RV -> AE (the edit of a path the failure named), AE -> RV."""
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "fix the bug in calc.py"},
        {"role": "assistant", "content": "", "tool_calls": [_tool_call("c1", "run_tests", {"cmd": "pytest tests"})]},
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": "FAILED tests/test_calc.py::test_add - assert -1 == 3\ncalc.py:2: AssertionError\n1 failed",
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_tool_call("c2", "str_replace", {"path": "calc.py", "old": "a - b", "new": "a + b"})],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "edited calc.py"},
        {"role": "assistant", "content": "", "tool_calls": [_tool_call("c3", "run_tests", {"cmd": "pytest tests"})]},
        {"role": "tool", "tool_call_id": "c3", "content": "1 passed"},
    ]
    return {"id": rid, "uid": "code", "reward": reward, "messages": messages, "action_token_lengths": [2, 3, 4]}


TOKEN_HOOK_CLI: dict[str, list[str]] = {
    "--call-credit-alpha": ["--call-credit-alpha", "0.3"],
    "--call-credit-rv-reward self_correction": ["--call-credit-rv-reward", "self_correction"],
    "--call-credit-rv-reward literal": ["--call-credit-rv-reward", "literal"],
    "--call-credit-kappa": ["--call-credit-rv-reward", "self_correction", "--call-credit-kappa", "0.7"],
    "all": ["--call-credit-alpha", "0.6", "--call-credit-rv-reward", "literal", "--call-credit-kappa", "0.25"],
}


@pytest.mark.parametrize("case", list(TOKEN_HOOK_CLI))
def test_cli_route_call_credit_token_flags(tmp_path: Path, case: str) -> None:
    """docs/design.md section 4 eq. 13 and 14 per action: ``A (alpha + (1 - alpha) w_i) + r_i``, with
    ``r`` = kappa on the failing RV that a later edit fixed (self_correction), or
    ``kappa (1[passed] - 1[failed and fixed])`` (literal); the weights are the routed ``w``."""
    flags = TOKEN_HOOK_CLI[case]
    records = [_self_correcting_rollout(f"s{n}", reward) for n, reward in enumerate([1.0, 0.0, 0.0])]
    out = _route(tmp_path, records, ["--estimator", "call_credit", *flags])
    assert [a["role"] for a in out[0]["actions"]] == ["RV", "AE", "RV"]
    assert [(e["src"], e["dst"], e["kind"]) for e in out[0]["call_graph"]["edges"]] == [
        (0, 1, "RV->AE"),
        (1, 2, "AE->RV"),
    ]
    alpha = _flag_value(flags, "--call-credit-alpha", 0.0)
    kappa = _flag_value(flags, "--call-credit-kappa", 0.1)
    mode = _flag_value(flags, "--call-credit-rv-reward", "off", str)
    reward = {"off": [0.0, 0.0, 0.0], "self_correction": [kappa, 0.0, 0.0], "literal": [-kappa, 0.0, kappa]}[mode]
    weights = expected_call_weights(["RV", "AE", "RV"], [1.0, 1.0, 0.0], [2.0, 3.0, 4.0])
    for record, advantage in zip(out, expected_grpo([1.0, 0.0, 0.0], ["code"] * 3), strict=True):
        assert [a["weight"] for a in record["actions"]] == pytest.approx(weights, rel=1e-9), case
        expected = [advantage * (alpha + (1 - alpha) * w) + r for w, r in zip(weights, reward, strict=True)]
        assert [a["advantage"] for a in record["actions"]] == pytest.approx(expected, rel=1e-5, abs=1e-7), case
        plain = [advantage * w for w in weights]
        assert max(abs(a - b) for a, b in zip(expected, plain, strict=True)) > 1e-2, f"{case} is not visible"


# ---------------------------------------------------------------------------------------------
# Completeness: a new flag or key fails here until it is pinned above
# ---------------------------------------------------------------------------------------------

#: route flags pinned by the CLI tests above (flag -> test)
PINNED_ROUTE_FLAGS: dict[str, str] = {
    "--estimator": "test_cli_route_estimator_flag_selects_the_math",
    "--beta-plus": "test_cli_route_iapo_flags",
    "--clip-c": "test_cli_route_iapo_flags",
    "--neg-route": "test_cli_route_iapo_flags",
    "--beta-minus": "test_cli_route_iapo_flags",
    "--no-norm-by-std": "test_cli_route_iapo_flags",
    "--call-mode": "test_cli_route_call_credit_flags",
    "--smoothing": "test_cli_route_call_credit_flags",
    "--gamma": "test_cli_route_call_credit_flags",
    "--gigpo-w": "test_cli_route_gigpo_flags",
    "--gigpo-gamma": "test_cli_route_gigpo_flags",
    "--gigpo-mode": "test_cli_route_gigpo_flags",
    "--gigpo-state": "test_cli_route_gigpo_flags",
    "--turn-lambda": "test_cli_route_turn_reward_flags",
    "--turn-gamma": "test_cli_route_turn_reward_flags",
    "--info-weight": "test_cli_route_info_gain_flags",
    "--info-gate-temperature": "test_cli_route_info_gain_flags",
    "--info-no-normalize": "test_cli_route_info_gain_flags",
    "--info-gain-normalize": "test_cli_route_info_gain_flags",
    "--no-info-gain-normalize": "test_cli_route_info_gain_flags",
    "--info-gain-eps": "test_cli_route_info_gain_flags",
    "--iapo-eps": "test_cli_route_iapo_flags",
    "--gigpo-eps": "test_cli_route_gigpo_flags",
    "--call-credit-omega": "test_cli_route_call_credit_flags",
    "--call-credit-alpha": "test_cli_route_call_credit_token_flags",
    "--call-credit-rv-reward": "test_cli_route_call_credit_token_flags",
    "--call-credit-kappa": "test_cli_route_call_credit_token_flags",
    "--annotator": "test_cli_route_annotator_and_fallback_flags",
    "--fallback": "test_cli_route_annotator_and_fallback_flags",
}
#: route flags that are not math: files, and the LLM annotator's transport (tests/cli/test_cli_annotate.py,
#: tests/annotate/test_llm_annotator.py); they choose how a graph is obtained, not what it is routed to
NOT_MATH_ROUTE_FLAGS = {
    "--help",
    "--input",
    "--out",
    "--base-url",
    "--model",
    "--cache",
    "--concurrency",
    "--timeout",
    "--max-retries",
    "--deadline",
    "--max-model-len",
    "--max-prompt-tokens",
    "--trust-env",
}


def _route_flags() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    route = sub.choices["route"]
    return {option for action in route._actions for option in action.option_strings if option.startswith("--")}


def test_every_route_flag_is_pinned() -> None:
    flags = _route_flags()
    unpinned = sorted(flags - set(PINNED_ROUTE_FLAGS) - NOT_MATH_ROUTE_FLAGS)
    assert not unpinned, f"route flags without a math pin in this file: {unpinned}"
    assert not set(PINNED_ROUTE_FLAGS) - flags, "pinned flags that the route command no longer has"


#: credit.call_credit keys of the token hook (alpha fusion, RV reward): applied after routing, by the
#: trainer and by `verl-credit route` (pinned above through the route command)
TOKEN_HOOK_CALL_CREDIT_KEYS = {
    "alpha": "test_cli_route_call_credit_token_flags",
    "rv_reward": "test_cli_route_call_credit_token_flags",
    "kappa": "test_cli_route_call_credit_token_flags",
}
#: credit.* math keys pinned above (key -> test)
PINNED_CREDIT_KEYS: dict[str, str] = {
    "estimator": "test_cli_route_estimator_flag_selects_the_math",
    "norm_adv_by_std_in_grpo": "test_*_keys_reach_batch_credit",
    "epsilon": "test_*_keys_reach_batch_credit",
    **{f"iapo.{f.name}": "test_iapo_credit_keys_reach_batch_credit" for f in fields(IAPOConfig)},
    **{f"call_credit.{k}": "test_call_credit_keys_reach_batch_credit" for k in ("mode", "smoothing", "gamma", "omega")},
    **{f"gigpo.{k}": "test_gigpo_keys_reach_batch_credit" for k in ("step_advantage_w", "gamma", "mode", "eps")},
    "gigpo.state": "test_cli_route_gigpo_flags (--gigpo-state)",
    **{f"turn_reward.{f.name}": "test_turn_reward_keys_reach_batch_credit" for f in fields(TurnRewardConfig)},
    **{key: "test_info_gain_keys_reach_batch_credit" for key in INFO_KEYS},
    **{f"call_credit.{key}": test for key, test in TOKEN_HOOK_CALL_CREDIT_KEYS.items()},
}
#: credit.info_gain keys used by the trainer's masked forward passes, not by the math: pinned in
#: tests/verl/test_info_gain_trainer.py (a non-default placeholder reaches the masked rows)
TRAINER_INFO_GAIN_KEYS = {"placeholder"}
#: credit.call_credit keys of the trainer's replays: pinned in tests/verl (test_trainer_call_adjustments.py)
#: and tests/credit_math/test_call_credit_adjustments.py, not reachable from `verl-credit route`
TRAINER_CALL_CREDIT_KEYS = {
    "counterfactual",
    "ig_downweight",
    "adaptive_omega",
    "dpo_export",
}


def test_every_credit_math_key_is_pinned() -> None:
    sections = ("iapo", "call_credit", "gigpo", "turn_reward", "info_gain")
    # plugin_sections holds plug-in estimators' sections (none here), not a key of its own
    keys = {f.name for f in fields(CreditConfig) if f.name not in (*sections, "plugin_sections")}
    keys |= {f"iapo.{f.name}" for f in fields(IAPOConfig)}
    keys |= {f"call_credit.{f.name}" for f in fields(CallCreditConfig) if f.name not in TRAINER_CALL_CREDIT_KEYS}
    keys |= {f"gigpo.{f.name}" for f in fields(GiGPOConfig)}
    keys |= {f"turn_reward.{f.name}" for f in fields(TurnRewardConfig)}
    keys |= {f"info_gain.{f.name}" for f in fields(InfoGainConfig) if f.name not in TRAINER_INFO_GAIN_KEYS}
    unpinned = sorted(keys - set(PINNED_CREDIT_KEYS))
    assert not unpinned, f"credit keys without a math pin in this file: {unpinned}"
    assert TRAINER_CALL_CREDIT_KEYS <= {f.name for f in fields(CallCreditConfig)}
