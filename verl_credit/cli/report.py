"""``verl-credit report``: a credit JSONL -> one self-contained HTML file with pictures."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="draw a credit JSONL as pictures in one HTML file",
        description=(
            "Per-trajectory pictures (weights per action, support/failed-use edges, errors) and batch histograms "
            "of w+ and w-, embedded as PNG in one self-contained HTML file."
        ),
    )
    parser.add_argument("--input", required=True, help="credit JSONL (written by verl-credit route or demo)")
    parser.add_argument("--out", required=True, help="HTML file to write")
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="CREDIT.jsonl",
        help="another estimator's credit JSONL for the batch plots (repeatable)",
    )
    parser.add_argument(
        "--rollouts", default=None, help="the rollouts JSONL, to label actions with their tool calls / text"
    )
    parser.add_argument("--max-trajectories", type=int, default=12, help="trajectory pictures (default 12)")
    parser.add_argument("--title", default=None, help="report title")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from verl_credit.io import load_trajectories
    from verl_credit.report.html import render_report
    from verl_credit.report.records import action_labels, load_credit_lines

    labels = None
    if args.rollouts:
        labels = {t.id: action_labels(t) for _, t in load_trajectories(args.rollouts)}
    lines = load_credit_lines(args.input, labels)
    comparisons = {}
    for path in args.compare:
        other = load_credit_lines(path, labels)
        name = other[0].estimator
        comparisons[f"{name} ({path})" if name in comparisons or name == lines[0].estimator else name] = other
    if args.max_trajectories < 0:
        raise ValueError(f"--max-trajectories must be >= 0, got {args.max_trajectories}")
    out = render_report(
        lines,
        args.out,
        title=args.title or f"verl-credit report: {args.input}",
        comparisons=comparisons,
        max_trajectories=args.max_trajectories,
    )
    print(f"wrote {out} ({len(lines)} trajectories)")
    return 0
