#!/usr/bin/env python
"""The credit path's share of a real verl training step, from verl's own timing metrics.

Reads the runs of ``bash recipes/cpu/smoke.sh`` (``<SMOKE_DIR>/runs/<name>/metrics.jsonl``, written
by verl's file logger) and, for each estimator, averages over training steps after the first
(step 1 includes vLLM's warm-up):

* ``timing_s/step`` (verl: the whole step), ``timing_s/gen`` (rollout, annotation included: the
  agent loop annotates each episode as it finishes, overlapped with other episodes' generation),
  ``timing_s/adv`` (verl's advantage phase = the credit trainer's ``_compute_advantage``);
* ``credit/annotate_seconds``: the summed per-episode annotation time of the step's sessions
  (CPU time in the rollout workers, overlapped with other episodes' generation: an upper bound on
  what it adds to the step);

and prints the shares ``adv/step`` and ``annotate/step`` and each arm's ``adv`` relative to grpo's.
With ``--all-steps`` the sums over every training step are used (step 1 included: its vLLM warm-up
inflates ``step`` in every arm alike).

    python scripts/bench_cpu_training.py [--smoke-dir .cpu-train/smoke]

The last line is ``credit path share of a step: grpo A%, iapo B%, call_credit C%``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

RUNS = ("grpo", "iapo", "call_credit")


def step_metrics(run_dir: Path) -> list[dict[str, float]]:
    """verl's logged metrics of each training step (validation-only records skipped), by step."""
    steps: dict[int, dict[str, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(int(record["step"]), {}).update(record["data"])
    return [values for _, values in sorted(steps.items()) if "timing_s/step" in values]


def summarize(steps: list[dict[str, float]], all_steps: bool = False) -> dict[str, float]:
    used = steps if all_steps else (steps[1:] or steps)  # step 1 pays vLLM's warm-up
    names = ("timing_s/step", "timing_s/gen", "timing_s/adv", "timing_s/update_actor", "credit/annotate_seconds")
    mean = {name: statistics.fmean(s.get(name, 0.0) for s in used) for name in names}
    mean["steps"] = float(len(used))
    return mean


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke-dir", default=".cpu-train/smoke")
    parser.add_argument("--all-steps", action="store_true", help="include step 1 (vLLM warm-up)")
    args = parser.parse_args(argv)
    root = Path(args.smoke_dir) / "runs"
    table = {
        name: summarize(step_metrics(root / name), args.all_steps)
        for name in RUNS
        if (root / name / "metrics.jsonl").exists()
    }
    if "grpo" not in table:
        print(f"no grpo run under {root}: run bash recipes/cpu/smoke.sh first", file=sys.stderr)
        return 2
    base = table["grpo"]
    print(
        "| estimator | steps | step s | gen s | adv s | annotate s | adv/step | annotate/step | adv vs grpo |"
    )  # means
    print("|---|---|---|---|---|---|---|---|---|")
    for name, row in table.items():
        print(
            f"| {name} | {row['steps']:.0f} | {row['timing_s/step']:.2f} | {row['timing_s/gen']:.2f} | "
            f"{row['timing_s/adv']:.4f} | {row['credit/annotate_seconds']:.4f} | "
            f"{row['timing_s/adv'] / row['timing_s/step']:.2%} | "
            f"{row['credit/annotate_seconds'] / row['timing_s/step']:.2%} | "
            f"{row['timing_s/adv'] / max(base['timing_s/adv'], 1e-12):.2f}x |"
        )
    shares = ", ".join(
        f"{name} {(row['timing_s/adv'] + row['credit/annotate_seconds']) / row['timing_s/step']:.2%}"
        for name, row in table.items()
    )
    print(f"credit path share of a step: {shares}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
