"""CALL-CREDIT decomposition (docs/design.md section 4) through the shared batch path ``batch_credit``:
hand-computed examples (both modes, lambda 0 and 1, alpha fusion), per-request vs prefix-merged layout
invariance on random sessions, and ``credit/reward_hacking_rate``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl_credit.batch_credit import compute_batch_credit, route_token_advantages
from verl_credit.call_graph import CallEdge, CallGraph
from verl_credit.config import CallCreditConfig, CreditConfig
from verl_credit.credit_math.call_credit import compute_reward_hacking_rate, fuse_token_advantages

# Batch of one GRPO group "g" with R = (1, 0): mean 0.5, Bessel std 0.70711 -> A = +-0.5 / (0.70711 + 1e-6)
A_POS = 0.5 / (2**-0.5 + 1e-6)

# Trajectory 0: read -> edit -> test. roles (IG, AE, RV), edges 0->1 (IG->AE), 1->2 (AE->RV); deg = (1, 1, 0)
CHAIN = CallGraph(
    ("IG", "AE", "RV"), (False,) * 3, (CallEdge(0, 1, "IG->AE", "a.py"), CallEdge(1, 2, "AE->RV", "a.py"))
)
CHAIN_LENGTHS = [2, 3, 1]  # L = 6
# Trajectory 1: two reads, no edges; deg = (0, 0)
READS = CallGraph(("IG", "IG"), (False, False))
READS_LENGTHS = [4, 4]  # L = 8


def credit_for(mode: str, smoothing: float, alpha: float = 0.0):
    config = CreditConfig(
        estimator="call_credit", call_credit=CallCreditConfig(mode=mode, smoothing=smoothing, alpha=alpha)
    )
    return compute_batch_credit(
        torch.tensor([1.0, 0.0]), ["g", "g"], [CHAIN_LENGTHS, READS_LENGTHS], config, call_graphs=[CHAIN, READS]
    )


def test_mass_conserving_lambda_1_hand_computed() -> None:
    credit = credit_for("mass_conserving", 1.0)
    # chain: deg + 1 = (2, 2, 1), sum 5; gamma^(T - pos) = (0.9025, 0.95, 1); omega = (0.6, 1.0, 0.4)
    #   s = (0.6 * 0.4 * 0.9025, 1.0 * 0.4 * 0.95, 0.4 * 0.2 * 1) = (0.2166, 0.38, 0.08)
    #   sum L s = 2 * 0.2166 + 3 * 0.38 + 1 * 0.08 = 1.6532; w = 6 s / 1.6532
    s = np.array([0.2166, 0.38, 0.08])
    w_chain = 6 * s / 1.6532  # (0.786112, 1.379143, 0.290346)
    # reads: deg + 1 = (1, 1), share 0.5 each; gamma = (0.95, 1); s = 0.6 * 0.5 * (0.95, 1) = (0.285, 0.3)
    #   sum L s = 4 * 0.285 + 4 * 0.3 = 2.34; w = 8 s / 2.34 = (0.974359, 1.025641)
    w_reads = 8 * np.array([0.285, 0.3]) / 2.34
    assert np.allclose(credit.weights_of(0), w_chain, atol=1e-9)
    assert np.allclose(credit.weights_of(1), w_reads, atol=1e-9)
    assert np.allclose(w_chain, [0.786112, 1.379143, 0.290346], atol=1e-6)
    # A_i = A * w_i; mass sum_i L_i A_i = L A
    assert np.allclose(credit.advantages_of(0), A_POS * w_chain, atol=1e-6)
    assert np.allclose(credit.advantages_of(1), -A_POS * w_reads, atol=1e-6)
    assert np.isclose(float((credit.lengths[0] * credit.weight[0]).sum()), 6.0, rtol=1e-12)
    assert torch.equal(credit.extras["AE"][0, :3], torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))


def test_mass_conserving_lambda_0_gives_leaf_calls_nothing() -> None:
    credit = credit_for("mass_conserving", 0.0)
    # chain: deg = (1, 1, 0), sum 2 -> share (0.5, 0.5, 0); s = (0.6*0.5*0.9025, 1*0.5*0.95, 0) = (0.27075, 0.475, 0)
    #   sum L s = 2 * 0.27075 + 3 * 0.475 = 1.9665; w = 6 s / 1.9665 = (0.826087, 1.449275, 0): the final test
    #   run (a leaf) gets no credit at all -- why the default is lambda = 1
    assert np.allclose(credit.weights_of(0), 6 * np.array([0.27075, 0.475, 0.0]) / 1.9665, atol=1e-9)
    # reads: every deg + lambda = 0 -> the degree factor falls back to 1/T: same as lambda = 1 here
    assert np.allclose(credit.weights_of(1), 8 * np.array([0.285, 0.3]) / 2.34, atol=1e-9)


def test_paper_mode_hand_computed() -> None:
    credit = credit_for("paper", 1.0)
    # w = s * T: chain (0.2166, 0.38, 0.08) * 3; reads (0.285, 0.3) * 2 -- no mass guarantee
    assert np.allclose(credit.weights_of(0), [0.6498, 1.14, 0.24], atol=1e-9)
    assert np.allclose(credit.weights_of(1), [0.57, 0.6], atol=1e-9)
    assert np.allclose(credit.advantages_of(0), A_POS * np.array([0.6498, 1.14, 0.24]), atol=1e-6)
    assert not np.isclose(float((credit.lengths[0] * credit.weight[0]).sum()), 6.0)  # 2*.6498+3*1.14+.24 = 4.9596
    credit0 = credit_for("paper", 0.0)
    # lambda 0: s = (0.27075, 0.475, 0) -> w = 3 s = (0.81225, 1.425, 0)
    assert np.allclose(credit0.weights_of(0), [0.81225, 1.425, 0.0], atol=1e-9)


def test_uniform_roles_and_no_edges_reduce_to_grpo() -> None:
    # omega equal for all roles, gamma = 1, no edges -> s uniform -> w = 1 -> the GRPO advantage
    graph = CallGraph(("IG", "AE", "RV"), (False,) * 3)
    config = CreditConfig(
        estimator="call_credit", call_credit=CallCreditConfig(gamma=1.0, omega={"IG": 1.0, "AE": 1.0, "RV": 1.0})
    )
    credit = compute_batch_credit(
        torch.tensor([1.0, 0.0]), ["g", "g"], [[2, 3, 1], [1, 1, 1]], config, call_graphs=[graph, graph]
    )
    assert torch.allclose(credit.weight, torch.ones(2, 3, dtype=torch.float64))
    grpo = compute_batch_credit(
        torch.tensor([1.0, 0.0]), ["g", "g"], [[2, 3, 1], [1, 1, 1]], CreditConfig(estimator="grpo")
    )
    assert torch.equal(credit.action_advantage, grpo.action_advantage)


def merged_row_spans(lengths: list[int], gaps: list[int]) -> tuple[list[int], list[int], int]:
    """Spans of a prefix-merged row: call i's tokens start after ``gaps[i]`` observation tokens."""
    starts, ends, cursor = [], [], 0
    for length, gap in zip(lengths, gaps, strict=True):
        cursor += gap
        starts.append(cursor)
        ends.append(cursor + length)
        cursor += length
    return starts, ends, cursor


def test_alpha_fusion_hand_computed_on_a_merged_row() -> None:
    credit = credit_for("mass_conserving", 1.0, alpha=0.25)
    grpo = compute_batch_credit(
        torch.tensor([1.0, 0.0]), ["g", "g"], [CHAIN_LENGTHS, READS_LENGTHS], CreditConfig(estimator="grpo")
    )
    # merged row of the chain: [obs x2][IG x2][obs x1][AE x3][obs x2][RV x1] -> spans (2,4) (5,8) (10,11)
    args = (torch.tensor([0]), torch.tensor([[0, 1, 2]]), torch.tensor([[2, 5, 10]]), torch.tensor([[4, 8, 11]]), 12)
    call_tokens = route_token_advantages(credit, *args)
    grpo_tokens = route_token_advantages(grpo, *args)
    fused = fuse_token_advantages(grpo_tokens, call_tokens, alpha=0.25)
    # A~ = 0.25 A + 0.75 A w_i: IG 0.25 + 0.75 * 0.786112 = 0.839584; AE 0.25 + 0.75 * 1.379143 = 1.284357;
    # RV 0.25 + 0.75 * 0.290346 = 0.467760 (times A); observation tokens stay 0
    w = 6 * np.array([0.2166, 0.38, 0.08]) / 1.6532
    per_call = A_POS * (0.25 + 0.75 * w)
    expected = torch.zeros(1, 12)
    for (start, end), value in zip([(2, 4), (5, 8), (10, 11)], per_call, strict=True):
        expected[0, start:end] = float(value)
    assert torch.allclose(fused, expected, atol=1e-6)
    assert torch.equal(fuse_token_advantages(grpo_tokens, call_tokens, alpha=0.0), call_tokens)
    assert torch.equal(fuse_token_advantages(grpo_tokens, call_tokens, alpha=1.0), grpo_tokens)


def random_session(rng: np.random.Generator) -> tuple[CallGraph, list[int]]:
    """A random call graph (roles, edges of the three kinds with src < dst) and lengths (some 0)."""
    count = int(rng.integers(1, 9))
    roles = tuple(str(r) for r in rng.choice(["IG", "AE", "RV"], size=count))
    edges = []
    for src in range(count):
        for dst in range(src + 1, count):
            kind = f"{roles[src]}->{roles[dst]}"
            if kind in ("IG->AE", "AE->RV", "RV->AE") and rng.random() < 0.5:
                edges.append(CallEdge(src, dst, kind, "p"))
    lengths = [int(x) for x in rng.integers(0, 7, size=count)]
    return CallGraph(roles, tuple(bool(x) for x in rng.random(count) < 0.2), tuple(edges)), lengths


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("mode", ["mass_conserving", "paper"])
def test_per_request_and_prefix_merged_layouts_give_identical_call_advantages(seed: int, mode: str) -> None:
    rng = np.random.default_rng(seed)
    batch = int(rng.integers(2, 7))
    sessions = [random_session(rng) for _ in range(batch)]
    graphs = [g for g, _ in sessions]
    lengths = [lens for _, lens in sessions]
    scores = torch.tensor(rng.integers(0, 2, size=batch), dtype=torch.float32)
    uids = [f"task{int(u)}" for u in rng.integers(0, 2, size=batch)]
    alpha = float(rng.choice([0.0, 0.3]))
    config = CreditConfig(estimator="call_credit", call_credit=CallCreditConfig(mode=mode, alpha=alpha))
    credit = compute_batch_credit(scores, uids, lengths, config, call_graphs=graphs)
    grpo = compute_batch_credit(scores, uids, lengths, CreditConfig(estimator="grpo"))
    width = max(len(x) for x in lengths)

    # prefix_merged: one row per trajectory, calls separated by random observation tokens
    merged_spans = []
    for lens in lengths:
        merged_spans.append(merged_row_spans(lens, [int(g) for g in rng.integers(1, 5, size=len(lens))]))
    response_length = max(end for _, _, end in merged_spans) + 3

    def pack(rows: list[tuple[list[int], list[int], list[int]]]) -> tuple[torch.Tensor, ...]:
        span_action = torch.full((len(rows), width), -1, dtype=torch.long)
        span_start = torch.zeros((len(rows), width), dtype=torch.long)
        span_end = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (actions, starts, ends) in enumerate(rows):
            span_action[r, : len(actions)] = torch.tensor(actions, dtype=torch.long)
            span_start[r, : len(starts)] = torch.tensor(starts, dtype=torch.long)
            span_end[r, : len(ends)] = torch.tensor(ends, dtype=torch.long)
        return span_action, span_start, span_end

    merged_rows = [(list(range(len(lens))), s, e) for lens, (s, e, _) in zip(lengths, merged_spans, strict=True)]
    merged_args = (torch.arange(batch), *pack(merged_rows), response_length)
    merged = fuse_token_advantages(
        route_token_advantages(grpo, *merged_args), route_token_advantages(credit, *merged_args), alpha
    )

    # per_request: one row per call; its response is that call's tokens only, from offset 0
    request_rows, request_traj = [], []
    for t, lens in enumerate(lengths):
        for i, length in enumerate(lens):
            request_rows.append(([i], [0], [length]))
            request_traj.append((t, i))
    request_args = (torch.tensor([t for t, _ in request_traj]), *pack(request_rows), response_length)
    per_request = fuse_token_advantages(
        route_token_advantages(grpo, *request_args), route_token_advantages(credit, *request_args), alpha
    )

    for row, (t, i) in enumerate(request_traj):
        start, end = merged_spans[t][0][i], merged_spans[t][1][i]
        tokens_merged = merged[t, start:end]
        tokens_request = per_request[row, : end - start]
        assert torch.equal(tokens_merged, tokens_request), (seed, t, i)
        assert torch.all(per_request[row, end - start :] == 0)
        # and the value is the call's A_i fused with A_tau
        expected = alpha * float(grpo.trajectory_advantage[t]) + (1 - alpha) * float(credit.action_advantage[t, i])
        assert torch.allclose(tokens_request, torch.full_like(tokens_request, expected), atol=1e-6)
    # token mass of a trajectory is the same in both layouts
    for t in range(batch):
        rows = [row for row, (tt, _) in enumerate(request_traj) if tt == t]
        assert torch.isclose(merged[t].sum(), per_request[rows].sum(), atol=1e-5)


def test_reward_hacking_rate_examples() -> None:
    # Three trajectories, each its own group (A = R for a group of one).
    # t0 (R=1): one read feeding three edits: roles (IG, AE, AE, AE), edges 0->1, 0->2, 0->3, lengths 1 each
    #   deg + 1 = (4, 1, 1, 1) / 7; gamma^(4-pos) = (.857375, .9025, .95, 1); omega (.6, 1, 1, 1)
    #   s = (.293957, .128929, .135714, .142857): IG's per-token advantage (prop. to .294) exceeds
    #   1.1 x the AE mean (prop. to 1.1 x .1358 = .149) -> hacking
    # t1 (R=1): the read -> edit -> test chain of the tests above: w = (0.786, 1.379, 0.290): IG < AE
    # t2 (R=0): excluded (not successful)
    hub = CallGraph(("IG", "AE", "AE", "AE"), (False,) * 4, tuple(CallEdge(0, j, "IG->AE", "a.py") for j in (1, 2, 3)))
    credit = compute_batch_credit(
        torch.tensor([1.0, 1.0, 0.0]),
        ["a", "b", "c"],
        [[1, 1, 1, 1], CHAIN_LENGTHS, [1]],
        CreditConfig(estimator="call_credit"),
        call_graphs=[hub, CHAIN, CallGraph(("IG",), (False,))],
    )
    s = np.array([0.6 * 4 / 7 * 0.857375, 1 / 7 * 0.9025, 1 / 7 * 0.95, 1 / 7])
    assert np.allclose(credit.weights_of(0), 4 * s / s.sum(), atol=1e-9)
    rate, eligible = compute_reward_hacking_rate(
        torch.tensor([1.0, 1.0, 0.0]), credit.action_advantage, credit.lengths, credit.extras["IG"], credit.extras["AE"]
    )
    assert (rate, eligible) == (0.5, 2)
    # flat GRPO credit: IG and AE means are equal -> 0% by construction
    grpo = compute_batch_credit(
        torch.tensor([1.0, 1.0, 0.0]),
        ["a", "b", "c"],
        [[1, 1, 1, 1], CHAIN_LENGTHS, [1]],
        CreditConfig(estimator="grpo"),
    )
    assert compute_reward_hacking_rate(
        torch.tensor([1.0, 1.0, 0.0]), grpo.action_advantage, grpo.lengths, credit.extras["IG"], credit.extras["AE"]
    ) == (0.0, 2)
    # the 10% margin: IG 1.05 vs AE 1.0 is not hacking, IG 1.2 vs AE 1.0 is
    lengths = torch.ones(2, 2)
    is_ig, is_ae = torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    advantage = torch.tensor([[1.05, 1.0], [1.2, 1.0]])
    assert compute_reward_hacking_rate(torch.tensor([1.0, 1.0]), advantage, lengths, is_ig, is_ae) == (0.5, 2)
    # a successful trajectory without AE calls is not eligible
    assert compute_reward_hacking_rate(
        torch.tensor([1.0]), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2), torch.ones(1, 2), torch.zeros(1, 2)
    ) == (0.0, 0)
