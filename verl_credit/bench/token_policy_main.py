"""Command line of the token-level learning benchmark (``scripts/bench_token_policy.py``).

Prints the warm start's success, the per-run progress (stderr), the table (rollouts to 90%,
p vs grpo, final success, credit precision), the behaviour table (tool-call redundancy), the
gradient diagnostics, and as its last line::

    token policy: iapo/grpo rollouts-to-90% ratio (delayed-use): R (p = P)
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_credit.bench.learning import format_table, plot_curves, summarize_runs, write_results
from verl_credit.bench.stats import format_rollouts, mann_whitney_p, quantiles
from verl_credit.bench.token_policy import (
    ARMS,
    MODEL_PRESETS,
    VARIANTS,
    TokenBenchConfig,
    TokenRunResult,
    evaluate,
    new_policy,
    run_token_benchmark,
    warm_starts,
)
from verl_credit.bench.token_policy_model import POLICY_MODELS

__all__ = ["final_line", "main"]

QUICK: dict[str, Any] = {
    "seeds": 1,
    "budget": 32,
    "check_episodes": 8,
    "eval_episodes": 8,
    "group_size": 4,
    "tasks_per_step": 2,
    "bc_episodes": 32,
    "bc_epochs": 1,
    "bc_dagger_rounds": 1,
    "bc_dagger_episodes": 8,
    "bc_dagger_epochs": 1,
    "workers": 1,
    "variants": ("delayed",),
    "arms": ("grpo", "iapo"),
}


def final_line(summary: dict[str, Any]) -> str:
    block = summary["variants"].get("delayed", {})
    ratio = block.get("iapo_grpo_ratio", math.nan)
    p_value = block.get("arms", {}).get("iapo", {}).get("p_rollouts_vs_grpo", math.nan)
    return f"token policy: iapo/grpo rollouts-to-90% ratio (delayed-use): {ratio:.2f} (p = {p_value:.2f})"


def behaviour_table(results: Sequence[TokenRunResult], config: TokenBenchConfig, level: float = 0.7) -> str:
    """Secondary speed (training success >= ``level``) and tool-call redundancy per arm."""
    header = (
        f"{'variant':<13}{'arm':<12}{f'to-{level:.0%} train':>14}{'IQR':>19}{'p vs grpo':>10}"
        f"{'redundant calls/ep':>20}{'p':>6}{'(1st batch)':>12}{'tokens/ep':>11}{'refund right (orig/gift)':>26}"
    )
    rows = [header, "-" * len(header)]
    for variant in config.variants:
        grpo = [r.rollouts_to_train_success(level) for r in results if r.variant == variant and r.arm == "grpo"]
        grpo_redundancy = [r.redundancy for r in results if r.variant == variant and r.arm == "grpo"]
        for arm in config.arms:
            runs = [r for r in results if r.variant == variant and r.arm == arm]
            if not runs:
                continue
            speeds = [r.rollouts_to_train_success(level) for r in runs]
            q25, median, q75 = quantiles(speeds)
            p_value = mann_whitney_p(speeds, grpo) if arm != "grpo" else math.nan
            p_text = "-" if math.isnan(p_value) else f"{p_value:.2f}"
            p_redundancy = mann_whitney_p([r.redundancy for r in runs], grpo_redundancy) if arm != "grpo" else math.nan
            p_redundancy_text = "-" if math.isnan(p_redundancy) else f"{p_redundancy:.2f}"
            rows.append(
                f"{variant:<13}{arm:<12}{format_rollouts(median):>14}"
                f"{f'[{format_rollouts(q25)}, {format_rollouts(q75)}]':>19}{p_text:>10}"
                f"{np.mean([r.redundancy for r in runs]):>20.3f}{p_redundancy_text:>6}"
                f"{np.mean([r.initial_redundancy for r in runs]):>12.3f}"
                f"{np.mean([r.tokens_per_episode for r in runs]):>11.0f}"
                f"{_mean_accuracy(runs, 'original'):>15.3f} / {_mean_accuracy(runs, 'gift_card'):<8.3f}"
            )
    return "\n".join(rows)


def _mean_accuracy(runs: Sequence[TokenRunResult], method: str) -> float:
    values = [r.refund_accuracy.get(method, math.nan) for r in runs]
    values = [v for v in values if not math.isnan(v)]
    return float(np.mean(values)) if values else math.nan


def main(argv: Sequence[str] | None = None) -> int:
    defaults = TokenBenchConfig()
    parser = argparse.ArgumentParser(prog="bench_token_policy", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        choices=POLICY_MODELS,
        default=defaults.model,
        help="policy network; each has its own hyper-parameters, chosen on grpo (MODEL_PRESETS)",
    )
    parser.add_argument("--seeds", type=int, help="default: the model's preset")
    parser.add_argument("--first-seed", type=int, default=defaults.first_seed, help="hyper-parameter runs: 100")
    parser.add_argument("--budget", type=int, help="training rollouts per run; default: the model's preset")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(defaults.variants))
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(defaults.arms))
    parser.add_argument("--lr", type=float, help="same for every arm; default: the model's preset")
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--diagnostic-batches", type=int, default=8, help="0 skips the gradient diagnostics")
    parser.add_argument("--out", help="directory for results.json and the warm-start cache (default: per model)")
    parser.add_argument("--plot", help="curves PNG (default: per model, under docs/bench/)")
    parser.add_argument("--quick", action="store_true", help="tiny smoke configuration for tests")
    parser.add_argument("--no-cache", action="store_true", help="recompute the warm starts even if --out has them")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    values: dict[str, Any] = {
        **MODEL_PRESETS[args.model],
        "model": args.model,
        "first_seed": args.first_seed,
        "variants": tuple(args.variants),
        "arms": tuple(args.arms),
        "workers": args.workers,
    }
    for key, value in (("seeds", args.seeds), ("budget", args.budget), ("learning_rate", args.lr)):
        if value is not None:
            values[key] = value
    suffix = "" if args.model == "gru" else f"_{args.model}"
    args.out = args.out or f"bench_results/token_policy{suffix}"
    args.plot = args.plot or f"docs/bench/token_policy{suffix}_curves.png"
    if args.quick:
        values.update(QUICK)
    try:
        config = TokenBenchConfig(**values)
    except ValueError as exc:
        print(f"bench_token_policy: error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    starts = warm_starts(config, None if args.no_cache else args.out)
    for variant, start in starts.items():
        policy = new_policy(config)
        policy.load_state_dict(start)
        count = 8 if args.quick else 128
        episodes = evaluate(policy, variant, list(range(64)), count, torch.Generator().manual_seed(0))
        success = np.mean([e.reward for e in episodes])
        print(f"warm start ({config.model}, {variant}): success {success:.3f} on {count} rollouts")
    total = len(config.variants) * len(config.arms) * config.seeds
    done = 0

    def progress(result: TokenRunResult) -> None:
        nonlocal done
        done += 1
        print(
            f"[{done}/{total}] {result.variant:<12} {result.arm:<11} seed {result.seed:<3} "
            f"to-target {result.rollouts_to_target:>6} final {result.final_success:.3f} ({result.seconds:.1f}s)",
            file=sys.stderr,
            flush=True,
        )

    results = run_token_benchmark(config, starts, progress)
    summary = summarize_runs(results, config)  # type: ignore[arg-type]
    print(format_table(summary))
    print()
    print(behaviour_table(results, config))
    diagnostics = []
    if args.diagnostic_batches > 0 and "grpo" in config.arms:
        from verl_credit.bench.token_diagnostics import format_diagnostics, gradient_diagnostics

        for variant in config.variants:
            diagnostics.append(
                gradient_diagnostics(variant, config, starts[variant], config.arms, args.diagnostic_batches)
            )
        print()
        print(format_diagnostics(diagnostics))
        summary["diagnostics"] = [dataclasses.asdict(d) for d in diagnostics]
    summary["wall_seconds"] = time.perf_counter() - started
    write_results(results, summary, Path(args.out) / "results.json")
    plot_curves(results, config, args.plot)  # type: ignore[arg-type]
    print(
        f"wall time {summary['wall_seconds']:.0f}s with {config.workers} worker(s); "
        f"results: {Path(args.out) / 'results.json'}, curves: {args.plot}"
    )
    print(final_line(summary))
    return 0
