"""Does routed credit make verl's real GRPO trainer learn faster? The measures of the CPU benchmark.

Pure functions over what the runs of ``scripts/bench_cpu_learning.py`` wrote (verl's file logger,
one record per step): one run's curve -> its measures, several seeds -> medians and p-values, and
the picture. Nothing here starts a process; :mod:`verl_credit.bench.cpu_learning_main` runs the
trainer.

Definitions (``window`` = 5 steps, the thresholds 0.8 and 0.9):

* *training success* of a step: verl's ``critic/score/mean`` (the mean episode reward of the step's
  rollouts; the service world's reward is 1 for a solved task, else 0);
* *steps to X*: the first step whose trailing ``window``-step mean of training success is >= X
  (``inf`` when the run never got there within its budget: censored); *episodes to X* = steps x
  episodes per step; *seconds to X*: verl's summed ``timing_s/step`` up to that step (start-up
  excluded; it is reported on its own);
* *AUC*: the mean training success over the budget's steps; a run stopped early (it held the top
  threshold) counts its last ``window`` steps' mean for the steps it did not train;
* *early stop*: once the trailing mean has stayed >= the top threshold for ``hold`` steps, or once
  a run has collapsed (10 steps in a row with no success: no advantage is non-zero any more, so the
  policy is frozen and its AUC is filled with its last mean, 0).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verl_credit.bench.stats import mann_whitney_p, quantiles

__all__ = [
    "SUCCESS_METRIC",
    "THRESHOLDS",
    "RunRecord",
    "area_under_curve",
    "compare_arms",
    "first_reach",
    "format_table",
    "has_collapsed",
    "json_safe",
    "moving_mean",
    "plot_curves",
    "ratio_line",
    "read_step_metrics",
    "record_from_metrics",
    "should_stop",
    "summarize_records",
]

#: verl's per-step mean episode reward (= success rate for a 0/1 reward)
SUCCESS_METRIC = "critic/score/mean"
#: the success levels a run is timed to
THRESHOLDS: tuple[float, ...] = (0.8, 0.9)
#: the docs/design.md section 6 credit metrics averaged over a run's steps (where the arm logs them)
CREDIT_MEANS: tuple[str, ...] = (
    "credit/fallback_rate",
    "credit/w_pos_std",
    "credit/w_pos_frac_dev10",
    "credit/w_neg_frac_dev10",
    "credit/edges_per_action",
    "credit/error_rate",
    "credit/tool_call_redundancy",
    "credit/zero_adv_groups",
    "credit/malformed_tool_calls",
    "credit/anchor_match_rate",
    "actor/entropy",
    "actor/grad_norm",
    "response_length/mean",
    "num_turns/mean",
    # InfoPO's masked-feedback passes and verl's own stage timings: the passes' share of a step
    "credit/info_gain_seconds",
    "credit/info_gain_token_ratio",
    "timing_s/step",
    "timing_s/gen",
    "timing_s/old_log_prob",
    "timing_s/update_actor",
    "timing_s/adv",
)


@dataclass
class RunRecord:
    """One finished run: ``success[k]`` is step ``k + 1``'s training success."""

    setting: str
    arm: str
    seed: int
    lr: float
    budget: int
    episodes_per_step: int
    success: list[float]
    step_seconds: list[float]
    startup_seconds: float
    wall_seconds: float
    status: str  # "budget" (trained every step), "early_stop", or "failed: ..."
    validation: dict[int, float] = field(default_factory=dict)  # step -> greedy held-out success
    malformed_tool_calls: list[float] = field(default_factory=list)
    credit_means: dict[str, float] = field(default_factory=dict)
    diagnostics: dict[str, Any] = field(default_factory=dict)  # from the dumps (advantage, precision)

    @property
    def name(self) -> str:
        return run_name(self.setting, self.arm, self.seed, self.lr)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["validation"] = {str(step): value for step, value in self.validation.items()}
        data["measures"] = json_safe(self.measures())
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        values = {key: data[key] for key in cls.__dataclass_fields__ if key in data}
        values["validation"] = {int(step): float(v) for step, v in (data.get("validation") or {}).items()}
        return cls(**values)

    def measures(self, window: int = 5, thresholds: Sequence[float] = THRESHOLDS) -> dict[str, float]:
        """Steps, episodes and seconds to each threshold, AUC, final success, validation."""
        out: dict[str, float] = {}
        for threshold in thresholds:
            step = first_reach(self.success, threshold, window)
            out[f"steps_to_{threshold:g}"] = step
            out[f"episodes_to_{threshold:g}"] = step * self.episodes_per_step
            out[f"seconds_to_{threshold:g}"] = (
                math.inf if math.isinf(step) else float(sum(self.step_seconds[: int(step)]))
            )
        out["auc"] = area_under_curve(self.success, self.budget, window)
        out["final_success"] = float(np.mean(self.success[-window:])) if self.success else math.nan
        out["initial_success"] = float(np.mean(self.success[:window])) if self.success else math.nan
        out["steps"] = float(len(self.success))
        out["seconds_per_step"] = float(np.mean(self.step_seconds[1:] or self.step_seconds or [math.nan]))
        if self.validation:
            out["validation_first"] = self.validation[min(self.validation)]
            out["validation_last"] = self.validation[max(self.validation)]
            out["validation_mean"] = float(np.mean(list(self.validation.values())))
        if self.malformed_tool_calls:
            out["malformed_tool_calls_per_step"] = float(np.mean(self.malformed_tool_calls))
        return out


def run_name(setting: str, arm: str, seed: int, lr: float) -> str:
    """The run's folder below the benchmark's ``runs/`` directory."""
    return f"{setting}/{arm}/lr{lr:g}/seed{seed}"


def moving_mean(values: Sequence[float], window: int) -> list[float]:
    """Trailing means: entry ``k`` is the mean of ``values[k - window + 1 : k + 1]`` (defined from
    ``k = window - 1`` on; fewer values give an empty list)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    array = np.asarray(values, dtype=float)
    if array.size < window:
        return []
    sums = np.cumsum(np.concatenate([[0.0], array]))
    return list((sums[window:] - sums[:-window]) / window)


def first_reach(success: Sequence[float], threshold: float, window: int = 5) -> float:
    """The first step (1-based) whose trailing ``window``-step mean is >= ``threshold``; ``inf``
    when none is (censored at the run's length)."""
    for index, value in enumerate(moving_mean(success, window)):
        if value >= threshold - 1e-12:
            return float(index + window)
    return math.inf


def should_stop(success: Sequence[float], threshold: float, window: int = 5, hold: int = 5) -> bool:
    """True once the trailing ``window``-step mean has been >= ``threshold`` for the last ``hold``
    steps in a row (the run has shown it holds the level)."""
    means = moving_mean(success, window)
    return len(means) >= hold and all(value >= threshold - 1e-12 for value in means[-hold:])


def has_collapsed(success: Sequence[float], steps: int = 10) -> bool:
    """True when the last ``steps`` steps all had zero training success: every GRPO group of such a
    step is uniform, so every advantage is 0 and the policy no longer changes -- the run would stay
    at (about) 0 until its budget, which can take a long time (failing episodes run to the turn limit)."""
    return len(success) >= steps and all(value == 0.0 for value in success[-steps:])


def area_under_curve(success: Sequence[float], budget: int, window: int = 5) -> float:
    """Mean training success over ``budget`` steps; steps after an early stop count the mean of the
    run's last ``window`` steps (0 for a collapsed run)."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    values = list(success[:budget])
    if not values:
        return math.nan
    tail = float(np.mean(values[-window:]))
    values.extend([tail] * (budget - len(values)))
    return float(np.mean(values))


# -- reading a run ----------------------------------------------------------------------------------


def read_step_metrics(path: str | Path) -> dict[int, dict[str, float]]:
    """verl's file logger output (``metrics.jsonl``: ``{"step": N, "data": {...}}`` per line) by
    step; a line cut off by a killed run is skipped."""
    steps: dict[int, dict[str, float]] = {}
    file = Path(path)
    if not file.exists():
        return steps
    for line in file.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "step" in record and isinstance(record.get("data"), dict):
            steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def training_steps(metrics: Mapping[int, Mapping[str, float]]) -> list[int]:
    """The steps that trained (verl logs ``timing_s/step`` for those; step 0 is validation only)."""
    return sorted(step for step, values in metrics.items() if "timing_s/step" in values and SUCCESS_METRIC in values)


def validation_metric(values: Mapping[str, float]) -> float | None:
    """The mean greedy validation reward of a step's record (``val-core/<source>/reward/mean@1``)."""
    found = [float(v) for k, v in values.items() if k.startswith("val-core/") and "/reward/mean@" in k]
    return float(np.mean(found)) if found else None


def record_from_metrics(
    metrics: Mapping[int, Mapping[str, float]],
    *,
    setting: str,
    arm: str,
    seed: int,
    lr: float,
    budget: int,
    episodes_per_step: int,
    startup_seconds: float,
    wall_seconds: float,
    status: str,
) -> RunRecord:
    """A :class:`RunRecord` from a run's metrics (by step), as :func:`read_step_metrics` reads them."""
    steps = training_steps(metrics)[:budget]
    validation = {}
    for step, values in metrics.items():
        value = validation_metric(values)
        if value is not None:
            validation[int(step)] = value
    means = {}
    for name in CREDIT_MEANS:
        found = [float(metrics[s][name]) for s in steps if name in metrics[s]]
        if found and all(math.isfinite(v) for v in found):
            means[name] = float(np.mean(found))
    return RunRecord(
        setting=setting,
        arm=arm,
        seed=seed,
        lr=lr,
        budget=budget,
        episodes_per_step=episodes_per_step,
        success=[float(metrics[s][SUCCESS_METRIC]) for s in steps],
        step_seconds=[float(metrics[s]["timing_s/step"]) for s in steps],
        startup_seconds=startup_seconds,
        wall_seconds=wall_seconds,
        status=status,
        validation=validation,
        malformed_tool_calls=[float(metrics[s].get("credit/malformed_tool_calls", 0.0)) for s in steps],
        credit_means=means,
    )


# -- across seeds ------------------------------------------------------------------------------------


def _median_iqr(values: Sequence[float]) -> dict[str, float]:
    q25, median, q75 = quantiles(values)
    return {"median": median, "q25": q25, "q75": q75}


def summarize_records(records: Iterable[RunRecord], window: int = 5) -> dict[str, dict[str, Any]]:
    """Per ``setting/arm``: seeds, medians and IQRs of the measures, means of the credit metrics."""
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for record in records:
        groups.setdefault((record.setting, record.arm), []).append(record)
    summary: dict[str, dict[str, Any]] = {}
    for (setting, arm), runs in sorted(groups.items()):
        runs.sort(key=lambda r: r.seed)
        measures = [r.measures(window) for r in runs]
        block: dict[str, Any] = {"seeds": [r.seed for r in runs], "runs": len(runs), "lr": sorted({r.lr for r in runs})}
        for name in measures[0]:
            values = [m.get(name, math.nan) for m in measures]
            if name.startswith(("steps_to", "episodes_to", "seconds_to")):
                block[name] = _median_iqr(values)
                block[name]["reached"] = sum(not math.isinf(v) for v in values)
            else:
                finite = [v for v in values if math.isfinite(v)]
                block[name] = float(np.mean(finite)) if finite else math.nan
        block["credit_means"] = {
            name: float(np.mean([r.credit_means[name] for r in runs if name in r.credit_means]))
            for name in sorted({n for r in runs for n in r.credit_means})
        }
        # credit precision, and the causal share of action tokens that flat credit scores by construction
        for name in ("credit_precision", "causal_token_share"):
            values = [r.diagnostics.get(name) for r in runs]
            values = [v for v in values if isinstance(v, float) and math.isfinite(v)]
            if values:
                block[name] = float(np.mean(values))
        block["startup_seconds"] = float(np.mean([r.startup_seconds for r in runs]))
        block["wall_seconds"] = float(np.mean([r.wall_seconds for r in runs]))
        summary[f"{setting}/{arm}"] = block
    return summary


def compare_arms(records: Sequence[RunRecord], reference: str = "grpo", window: int = 5) -> dict[str, dict[str, Any]]:
    """Each arm vs ``reference`` in the same setting: median ratios and two-sided Mann-Whitney p of
    steps to each threshold (censored runs rank last) and of AUC."""
    out: dict[str, dict[str, Any]] = {}
    settings = sorted({r.setting for r in records})
    for setting in settings:
        base = [r for r in records if r.setting == setting and r.arm == reference]
        if not base:
            continue
        base_measures = [r.measures(window) for r in base]
        for arm in sorted({r.arm for r in records if r.setting == setting} - {reference}):
            runs = [r.measures(window) for r in records if r.setting == setting and r.arm == arm]
            block: dict[str, Any] = {"seeds": len(runs), "reference_seeds": len(base_measures)}
            for threshold in THRESHOLDS:
                key = f"steps_to_{threshold:g}"
                ours = [m[key] for m in runs]
                theirs = [m[key] for m in base_measures]
                block[f"{key}_ratio"] = _ratio(quantiles(ours)[1], quantiles(theirs)[1])
                block[f"{key}_p"] = mann_whitney_p(ours, theirs)
            block["auc_difference"] = float(
                np.mean([m["auc"] for m in runs]) - np.mean([m["auc"] for m in base_measures])
            )
            block["auc_p"] = mann_whitney_p([m["auc"] for m in runs], [m["auc"] for m in base_measures])
            out[f"{setting}/{arm}"] = block
    return out


def _ratio(ours: float, theirs: float) -> float:
    """``ours / theirs`` for medians that may be censored: nan when either is nan or both are
    inf, inf when only ours is."""
    if math.isnan(ours) or math.isnan(theirs) or (math.isinf(ours) and math.isinf(theirs)):
        return math.nan
    if math.isinf(ours):
        return math.inf
    if math.isinf(theirs):
        return 0.0
    return ours / theirs


def ratio_line(comparison: Mapping[str, Mapping[str, Any]], setting: str = "service") -> str:
    """``real trainer: iapo/grpo steps-to-0.8 ratio: R (p = P, seeds N)`` for ``setting``."""
    block = comparison.get(f"{setting}/iapo", {})
    ratio = block.get("steps_to_0.8_ratio", math.nan)
    p = block.get("steps_to_0.8_p", math.nan)
    seeds = min(int(block.get("seeds", 0)), int(block.get("reference_seeds", 0)))
    return f"real trainer: iapo/grpo steps-to-0.8 ratio: {ratio:.2f} (p = {_format_p(p)}, seeds {seeds})"


def _format_p(p: float) -> str:
    if math.isnan(p):
        return "nan"
    return f"{p:.2g}"  # two significant digits: 0.22, 0.0079


def _format_steps(block: Mapping[str, float]) -> str:
    median = block["median"]
    text = ">budget" if math.isinf(median) else ("nan" if math.isnan(median) else f"{median:.0f}")
    return f"{text} ({block['reached']} reached)"


def format_table(summary: Mapping[str, Mapping[str, Any]], comparison: Mapping[str, Mapping[str, Any]]) -> str:
    """A markdown table: one row per setting/arm."""
    header = (
        "| setting/arm | seeds | steps to 0.8 | p | steps to 0.9 | p | AUC | p | final | held-out val "
        "(first -> last) | credit precision (causal tokens) | s/step | malformed/step |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for name, block in summary.items():
        versus = comparison.get(name, {})
        lines.append(
            f"| {name} | {block['runs']} | {_format_steps(block['steps_to_0.8'])} | "
            f"{_format_p(versus.get('steps_to_0.8_p', math.nan)) if versus else '-'} | "
            f"{_format_steps(block['steps_to_0.9'])} | "
            f"{_format_p(versus.get('steps_to_0.9_p', math.nan)) if versus else '-'} | "
            f"{block['auc']:.3f} | {_format_p(versus.get('auc_p', math.nan)) if versus else '-'} | "
            f"{block['final_success']:.2f} | "
            f"{block.get('validation_first', math.nan):.2f} -> {block.get('validation_last', math.nan):.2f} | "
            f"{block.get('credit_precision', math.nan):.2f} ({block.get('causal_token_share', math.nan):.2f}) | "
            f"{block['seconds_per_step']:.1f} | {block.get('malformed_tool_calls_per_step', math.nan):.1f} |"
        )
    return "\n".join(lines)


# -- the picture --------------------------------------------------------------------------------------

COLORS = {
    "grpo": "#555555",
    "iapo": "#E69F00",
    "call_credit": "#CC79A7",
    "gigpo": "#0072B2",
    "info_gain": "#D55E00",
    "turn_reward": "#009E73",
}


def plot_curves(records: Sequence[RunRecord], path: str | Path, window: int = 5) -> Path:
    """Training success (trailing ``window``-step mean) per setting: the mean over seeds and a band
    of +-1 standard error per arm; early-stopped runs are carried at their last mean."""
    from matplotlib.figure import Figure

    settings = sorted({r.setting for r in records}) or ["service"]
    figure = Figure(figsize=(5.2 * len(settings), 3.8), layout="constrained")
    axes = figure.subplots(1, len(settings), squeeze=False)[0]
    for ax, setting in zip(axes, settings, strict=True):
        for arm in [a for a in COLORS if any(r.arm == a and r.setting == setting for r in records)]:
            runs = [r for r in records if r.setting == setting and r.arm == arm and r.success]
            budget = max(r.budget for r in runs)
            curves = []
            for run in runs:
                smooth = moving_mean(run.success, min(window, len(run.success)))
                padded = smooth + [smooth[-1]] * (budget - len(run.success))
                curves.append(padded[: budget - min(window, len(run.success)) + 1])
            length = min(len(c) for c in curves)
            values = np.asarray([c[:length] for c in curves])
            steps = np.arange(window, window + length)
            mean = values.mean(axis=0)
            error = values.std(axis=0, ddof=1) / math.sqrt(len(runs)) if len(runs) > 1 else np.zeros_like(mean)
            ax.plot(steps, mean, color=COLORS[arm], label=f"{arm} ({len(runs)})", linewidth=1.6)
            ax.fill_between(steps, mean - error, mean + error, color=COLORS[arm], alpha=0.18)
        for threshold in THRESHOLDS:
            ax.axhline(threshold, color="#999999", linestyle=":", linewidth=1)
        ax.set_title(f"{setting}: verl fit() on CPU", fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylabel(f"training success ({window}-step mean)")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=8, frameon=False, loc="lower right")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=110)
    return target


def json_safe(value: Any) -> Any:
    """JSON-safe copy: inf -> "inf", nan -> None (recursively)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
