"""Coding learning-benchmark arm: grpo vs call_credit on the coding sandbox (markdown table on stdout).

    python scripts/bench_coding.py                       # 20 seeds, 2 workers (~2 minutes on 2 cores)
    python scripts/bench_coding.py --seeds 5 --json out.json

See ``verl_credit/bench/coding_arm.py`` for the setup and BENCHMARKS.md for the published numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

from verl_credit.bench.coding_arm import (
    CODING_ARMS,
    CodingBenchConfig,
    format_markdown_table,
    run_coding_benchmark,
    summarize_coding_runs,
)


def _clean(value: object) -> object:
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return None if math.isnan(value) else "inf"
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    defaults = CodingBenchConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", default=list(defaults.arms), choices=CODING_ARMS)
    parser.add_argument("--seeds", type=int, default=defaults.seeds)
    parser.add_argument("--tasks", nargs="*", default=list(defaults.tasks), help="task names (default: all shipped)")
    parser.add_argument("--budget", type=int, default=defaults.budget, help="training rollouts per run")
    parser.add_argument("--target", type=float, default=defaults.target)
    parser.add_argument("--window", type=int, default=defaults.window)
    parser.add_argument("--eval-episodes", type=int, default=defaults.eval_episodes)
    parser.add_argument("--group-size", type=int, default=defaults.group_size)
    parser.add_argument("--tasks-per-step", type=int, default=defaults.tasks_per_step)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--optimizer", default=defaults.optimizer, choices=("adam", "sgd"))
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--jail", default="auto", choices=("auto", "namespace", "fallback"))
    parser.add_argument("--json", type=Path, default=None, help="write the summary and every run here")
    args = parser.parse_args(argv)
    config = CodingBenchConfig(
        arms=tuple(args.arms),
        seeds=args.seeds,
        tasks=tuple(args.tasks),
        budget=args.budget,
        target=args.target,
        window=args.window,
        eval_episodes=args.eval_episodes,
        group_size=args.group_size,
        tasks_per_step=args.tasks_per_step,
        learning_rate=args.learning_rate,
        optimizer=args.optimizer,
        workers=args.workers,
    )
    started = time.perf_counter()
    results = run_coding_benchmark(config, jail=args.jail)
    summary = summarize_coding_runs(results, config)
    print(format_markdown_table(summary))
    print(f"\n{len(results)} runs in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.json is not None:
        payload = {
            "summary": summary,
            "runs": [{**asdict(r), "reward_hacking_rate": r.reward_hacking_rate} for r in results],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(_clean(payload), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
