"""Command line of the learning benchmark (shared by ``verl-credit bench learning`` and
``scripts/bench_learning.py``): parse flags, run, print the table, write JSON + PNG.

The last line printed is ``iapo/grpo rollouts-to-90% ratio (delayed-use): X.XX`` (the ratio of
the median rollouts-to-target of iapo to that of grpo on the ``delayed`` variant; ``inf`` when
iapo never reached the target and grpo did, ``nan`` when neither did or a run was skipped).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_credit.bench.learning import (
    ARMS,
    BENCH_VARIANTS,
    DIAGNOSTIC_ARMS,
    LearningConfig,
    RunResult,
    format_table,
    plot_curves,
    run_benchmark,
    summarize_runs,
    write_results,
)

__all__ = ["add_arguments", "config_from_args", "main", "run"]

QUICK = {"seeds": 2, "budget": 96, "check_episodes": 16, "eval_episodes": 16, "workers": 1}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = LearningConfig()
    parser.add_argument("--seeds", type=int, default=defaults.seeds, help=f"runs per arm (default {defaults.seeds})")
    parser.add_argument(
        "--budget", type=int, default=defaults.budget, help=f"training rollouts per run (default {defaults.budget})"
    )
    parser.add_argument("--variants", nargs="+", choices=BENCH_VARIANTS, default=list(defaults.variants))
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=ARMS + DIAGNOSTIC_ARMS,
        default=list(defaults.arms),
        help="advantage maps (default: grpo iapo call_credit oracle; diagnostic: oracle_pos)",
    )
    parser.add_argument("--target", type=float, default=defaults.target, help="success rate to reach (default 0.9)")
    parser.add_argument("--lr", type=float, default=defaults.learning_rate, help="step size (same for every arm)")
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default=defaults.optimizer)
    parser.add_argument("--workers", type=int, default=defaults.workers, help="processes (default 2)")
    parser.add_argument("--out", default="bench_results/learning", help="directory for results.json and curves.png")
    parser.add_argument(
        "--quick", action="store_true", help="tiny smoke configuration (2 seeds, 96 rollouts, 1 worker) for tests"
    )


def config_from_args(args: argparse.Namespace) -> LearningConfig:
    values: dict[str, Any] = {
        "seeds": args.seeds,
        "budget": args.budget,
        "variants": tuple(args.variants),
        "arms": tuple(args.arms),
        "target": args.target,
        "learning_rate": args.lr,
        "optimizer": args.optimizer,
        "workers": args.workers,
    }
    if args.quick:
        values.update(QUICK)
    return LearningConfig(**values)


def delayed_ratio_line(summary: dict[str, Any]) -> str:
    ratio = summary["variants"].get("delayed", {}).get("iapo_grpo_ratio", math.nan)
    return f"iapo/grpo rollouts-to-90% ratio (delayed-use): {ratio:.2f}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = config_from_args(args)
    started = time.perf_counter()
    total = len(config.variants) * len(config.arms) * config.seeds
    done = 0

    def progress(result: RunResult) -> None:
        nonlocal done
        done += 1
        print(
            f"[{done}/{total}] {result.variant:<12} {result.arm:<11} seed {result.seed:<3} "
            f"to-target {result.rollouts_to_target:>6} final {result.final_success:.3f} "
            f"({result.seconds:.1f}s)",
            file=sys.stderr,
            flush=True,
        )

    results = run_benchmark(config, progress)
    summary = summarize_runs(results, config)
    summary["wall_seconds"] = time.perf_counter() - started
    out = Path(args.out)
    write_results(results, summary, out / "results.json")
    plot_curves(results, config, out / "curves.png")
    print(format_table(summary))
    print(
        f"wall time {summary['wall_seconds']:.0f}s with {config.workers} worker(s); "
        f"results: {out / 'results.json'}, curves: {out / 'curves.png'}"
    )
    for variant, block in summary["variants"].items():
        print(f"iapo/grpo median rollouts-to-target ratio ({variant}): {block['iapo_grpo_ratio']:.2f}")
    print(delayed_ratio_line(summary))
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench_learning",
        description="Policy-gradient learning speed with grpo / iapo / call_credit / oracle advantage maps "
        "in the service world.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        run(args)
    except ValueError as exc:
        print(f"bench_learning: error: {exc}", file=sys.stderr)
        return 2
    return 0
