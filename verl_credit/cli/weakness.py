"""``verl-credit weakness``: where a run's coding agent is systematically weak, by call role.

Reads rollouts (``messages``: roles, graph and call_credit credit are computed here with the
default settings) or credit lines of ``verl-credit route --estimator call_credit`` (``actions`` +
``call_graph``). Roles are those of the credit file (``actions[i].role``; the rollouts give the
same, computed): a null role -- a call the rules could not classify -- stays null and is counted as
``unclassified``. ``--rollouts`` describes the calls of credit lines by their tool calls; without
it they are described by what the credit line says. The report itself is
:mod:`verl_credit.report.weakness`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "weakness",
        help="aggregate call credit by role: unused reads, unverified edits, ignored test failures",
        description="Aggregate CALL-CREDIT by role across a run and report reads whose content was never "
        "used, edits never verified, and tests run but failures ignored.",
    )
    parser.add_argument("--input", required=True, help="rollouts JSONL or call_credit credit JSONL")
    parser.add_argument(
        "--rollouts", default=None, help="the rollouts JSONL of a credit file, to describe calls by their tool calls"
    )
    parser.add_argument("--json", default=None, help="also write the report as JSON here")
    parser.add_argument("--examples", type=int, default=3, help="examples listed per weakness")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from verl_credit.io import check_distinct_files
    from verl_credit.report.weakness import compute_weakness_report, format_weakness_report
    from verl_credit.report.weakness_input import call_summaries, load_run

    if args.examples < 0:
        raise ValueError(f"--examples must be >= 0, got {args.examples}")
    check_distinct_files([("--input", args.input), ("--rollouts", args.rollouts)], [("--json", args.json)])
    summaries = call_summaries(args.rollouts) if args.rollouts else None
    report = compute_weakness_report(load_run(args.input, summaries), examples=args.examples)
    print(format_weakness_report(report))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
