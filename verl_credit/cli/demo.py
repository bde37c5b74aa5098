"""``verl-credit demo``: sample the built-in service world, annotate, route, write files and a report."""

from __future__ import annotations

import argparse
import time
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole pipeline on the built-in service world (offline, seconds)",
        description=(
            "Sample groups of rollouts from a stochastic scripted agent in the built-in service world, annotate "
            "them with the rule annotator, route credit with iapo (and call_credit, grpo for comparison), and "
            "write rollouts.jsonl, credit.jsonl, credit_call_credit.jsonl, credit_grpo.jsonl and report.html."
        ),
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--groups", type=int, default=8, help="tasks (groups) to sample (default 8)")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per task (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--variant",
        default="mixed",
        help="task variant: mixed, refund, exchange, revision, error_repair, delayed (default mixed)",
    )
    parser.add_argument("--max-trajectories", type=int, default=12, help="trajectory pictures in the report")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from verl_credit.cli.demo_run import format_summary, run_demo

    if args.groups < 1 or args.group_size < 1:
        raise ValueError(f"--groups and --group-size must be >= 1, got {args.groups} and {args.group_size}")
    started = time.perf_counter()
    result = run_demo(
        args.out,
        groups=args.groups,
        group_size=args.group_size,
        seed=args.seed,
        variant=args.variant,
        max_trajectories=args.max_trajectories,
    )
    print(
        f"{result.num_trajectories} rollouts ({args.groups} tasks x {args.group_size}), "
        f"success rate {result.success_rate:.0%}, {time.perf_counter() - started:.1f}s"
    )
    print(format_summary(result.summary))
    for name, path in result.files.items():
        print(f"{name:>18}: {path}")
    return 0
