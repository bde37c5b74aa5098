"""``verl-credit bench``: benchmarks. ``learning``: policy-gradient learning speed per advantage map."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench", help="run a benchmark (learning)", description="Benchmarks of the credit estimators."
    )
    benches = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    learning = benches.add_parser(
        "learning",
        help="learning speed of grpo / iapo / call_credit / oracle advantage maps in the service world",
        description="Train a small softmax policy by policy gradient in the service world; the arms differ only "
        "in the advantage map. Prints a table; the last line is the iapo/grpo ratio on delayed-use.",
    )
    from verl_credit.bench.learning_main import add_arguments

    add_arguments(learning)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from verl_credit.bench.learning_main import run as run_learning

    if args.bench == "learning":
        run_learning(args)
    return 0
