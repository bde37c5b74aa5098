"""Summary statistics shared by the learning benchmarks (service world and coding sandbox)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["LearningRun", "format_rollouts", "mann_whitney_p", "quantiles", "summarize_learning_runs"]


class LearningRun(Protocol):
    """What every benchmark run reports."""

    rollouts_to_target: float  # inf when the target was never reached
    final_success: float
    initial_success: float
    seconds: float


def format_rollouts(value: float) -> str:
    """A rollouts-to-target number for a table: ``>budget`` when never reached, ``nan`` when empty."""
    if math.isinf(value):
        return ">budget"
    if math.isnan(value):
        return "nan"
    return f"{value:.0f}"


def quantiles(values: Sequence[float]) -> tuple[float, float, float]:
    """``(q25, median, q75)`` with linear interpolation; ``inf`` (never reached) sorts last and an
    interpolation toward ``inf`` is ``inf`` (lower quantiles stay finite while enough runs reached it)."""
    ordered = np.sort(np.asarray(values, dtype=float))
    if ordered.size == 0:
        return (math.nan, math.nan, math.nan)

    def q(p: float) -> float:
        position = p * (ordered.size - 1)
        low, high = math.floor(position), math.ceil(position)
        if low == high:
            return float(ordered[low])
        if math.isinf(ordered[high]):
            return math.inf
        return float(ordered[low] + (ordered[high] - ordered[low]) * (position - low))

    return q(0.25), q(0.5), q(0.75)


def summarize_learning_runs(runs: Sequence[LearningRun]) -> dict[str, Any]:
    """Rollouts-to-target (median, IQR, reached), final success (mean, std), initial success and
    seconds over the seeds of one arm."""
    q25, median, q75 = quantiles([r.rollouts_to_target for r in runs])
    finals = np.asarray([r.final_success for r in runs])
    return {
        "runs": len(runs),
        "reached": sum(not math.isinf(r.rollouts_to_target) for r in runs),
        "rollouts_to_target_median": median,
        "rollouts_to_target_q25": q25,
        "rollouts_to_target_q75": q75,
        "final_success_mean": float(finals.mean()),
        "final_success_std": float(finals.std()),
        "initial_success_mean": float(np.mean([r.initial_success for r in runs])),
        "seconds_mean": float(np.mean([r.seconds for r in runs])),
    }


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p-value (ranks only, so "never reached" = inf ranks last); nan
    without scipy."""
    try:
        from scipy.stats import mannwhitneyu
    except ImportError:
        return math.nan

    if len(a) < 2 or len(b) < 2 or len(set(a) | set(b)) < 2:
        return math.nan
    big = max([v for v in (*a, *b) if not math.isinf(v)], default=0.0) + 1.0
    return float(
        mannwhitneyu(
            [big if math.isinf(v) else v for v in a], [big if math.isinf(v) else v for v in b], alternative="two-sided"
        ).pvalue
    )
