#!/usr/bin/env python
"""Time the credit estimators (graphs given) against verl's own GRPO estimator on the same batch.

Default batch: 512 trajectories (32 groups x 16), up to 30 actions each (20..30, ragged), 4096
response tokens per row
(actions separated by observation tokens), random influence graphs (~1.5 edges per action, 10%
error actions) and random call roles. Every timed arm starts from the same inputs a trainer has
at ``_compute_advantage``: token-level rewards, the response mask, uids, and per-trajectory
Python objects (InfluenceGraph / CallGraph and span lists). The arms:

* ``verl_grpo``: ``verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage``;
* ``iapo``: span tensors from the span lists + ``batch_credit.compute_batch_credit`` (graph degrees,
  features, bounded weights, routing) + ``batch_credit.route_token_advantages``. Each graph's degree
  table is computed once when the graph is built (in training: in the agent loop, when the
  trajectory is annotated) and cached on the graph; the ``cold`` arm recounts every edge
  inside the timed call;
* ``call_credit``: the same with call graphs.

Usage: ``python scripts/bench_estimator.py [--trajectories 512 --actions 30 --response-length 4096]``.
The last line printed is ``iapo/grpo time ratio: X.XX``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from verl_credit.batch_credit import compute_batch_credit, route_token_advantages
from verl_credit.call_graph import CallEdge, CallGraph
from verl_credit.config import CreditConfig
from verl_credit.credit_math.tokens import pad_spans
from verl_credit.graph import validate_graph


def make_batch(trajectories: int, actions: int, response_length: int, group_size: int, seed: int):
    rng = np.random.default_rng(seed)
    mask = torch.zeros(trajectories, response_length)
    spans: list[list[tuple[int, int]]] = []
    per_action = response_length // actions
    counts = rng.integers(max(1, actions - actions // 3), actions + 1, size=trajectories)  # ragged: 20..30 actions
    for row in range(trajectories):
        row_spans = []
        for action in range(int(counts[row])):
            start = action * per_action
            length = int(rng.integers(per_action // 4, per_action - 8))
            row_spans.append((start, start + length))
            mask[row, start : start + length] = 1.0
        spans.append(row_spans)
    rewards = torch.zeros(trajectories, response_length)
    rewards[:, -1] = torch.from_numpy(rng.integers(0, 2, trajectories).astype(np.float32))
    index = np.array([f"g{row // group_size}" for row in range(trajectories)], dtype=object)
    graphs, call_graphs = [], []
    for row in range(trajectories):
        num_actions = int(counts[row])
        edges = []
        for _ in range(int(1.5 * num_actions)):
            src, dst = sorted(rng.choice(num_actions, size=2, replace=False).tolist())
            sign = "+" if rng.random() < 0.8 else "-"
            edges.append(
                {
                    "src": src,
                    "dst": dst,
                    "sign": sign,
                    "type": "input" if sign == "+" else "failed_utilization",
                    "unit": "v",
                }
            )
        errors = [{"action": int(a), "kind": "tool_error"} for a in np.flatnonzero(rng.random(num_actions) < 0.1)]
        graph, report = validate_graph(
            {"num_actions": num_actions, "edges": edges, "errors": errors, "direct_user_inputs": {"0": 1}}, num_actions
        )
        assert not report.fallback, report.problems  # the benchmark must route real graphs
        graphs.append(graph)
        roles = tuple(rng.choice(["IG", "AE", "RV"], size=num_actions).tolist())
        call_edges = tuple(
            CallEdge(int(s), int(d), "IG->AE")
            for s, d in (sorted(rng.choice(num_actions, size=2, replace=False).tolist()) for _ in range(num_actions))
        )
        call_graphs.append(CallGraph(roles, (False,) * num_actions, call_edges))
    return rewards, mask, index, spans, graphs, call_graphs


def time_call(function: Callable[[], object], repeats: int) -> tuple[float, float]:
    function()  # warm-up
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples), statistics.quantiles(samples, n=4)[2] if len(samples) >= 4 else max(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=512)
    parser.add_argument("--actions", type=int, default=30)
    parser.add_argument("--response-length", type=int, default=4096)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rewards, mask, index, spans, graphs, call_graphs = make_batch(
        args.trajectories, args.actions, args.response_length, args.group_size, seed=0
    )
    lengths = [[end - start for start, end in row] for row in spans]
    rows = torch.arange(args.trajectories)

    def verl_grpo() -> torch.Tensor:
        return compute_grpo_outcome_advantage(rewards, mask, index)[0]

    def credit_arm(config: CreditConfig, cold: bool = False) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            if cold:  # forget the per-graph degree tables: recount every edge in this call
                for graph in graphs:
                    graph.__dict__.pop("degree_table", None)
            span_action, span_start, span_end = pad_spans(spans)
            credit = compute_batch_credit(
                rewards.sum(-1), index, lengths, config, graphs=graphs, call_graphs=call_graphs
            )
            return route_token_advantages(credit, rows, span_action, span_start, span_end, args.response_length)

        return run

    arms = {
        "verl_grpo": verl_grpo,
        "iapo": credit_arm(CreditConfig(estimator="iapo")),
        "iapo (cold: degrees recounted)": credit_arm(CreditConfig(estimator="iapo"), cold=True),
        "call_credit": credit_arm(CreditConfig(estimator="call_credit")),
        "grpo (ours, w=1)": credit_arm(CreditConfig(estimator="grpo")),
    }
    # sanity: our grpo arm reproduces verl's tensor exactly
    assert torch.equal(arms["grpo (ours, w=1)"](), verl_grpo()), "grpo arm differs from verl"

    results = {name: time_call(function, args.repeats) for name, function in arms.items()}
    print(
        f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}"
    )
    print(
        f"batch: {args.trajectories} trajectories x up to {args.actions} actions x {args.response_length} tokens, "
        f"groups of {args.group_size}, {args.repeats} repeats (median, p75)"
    )
    print("| arm | median ms | p75 ms | ratio to verl GRPO |")
    print("|---|---|---|---|")
    base = results["verl_grpo"][0]
    for name, (median, p75) in results.items():
        print(f"| {name} | {median * 1e3:.2f} | {p75 * 1e3:.2f} | {median / base:.2f} |")
    print(f"call_credit/grpo time ratio: {results['call_credit'][0] / base:.2f}")
    print(f"iapo/grpo time ratio: {results['iapo'][0] / base:.2f}")


if __name__ == "__main__":
    main()
