"""``verl-credit route``: rollouts JSONL -> credit JSONL (docs/design.md section 8).

Memory (see :data:`MEMORY_NOTE`): a file grouped by uid (each group's lines consecutive, as
verl writes them) is streamed -- one pass that keeps no transcript (line count, width, group
structure), then one group at a time, each group's lines written as it completes, byte for byte
what the whole-file path writes. A file that is not grouped, or holds a reward of 1e18 or more
(float64 scores), is routed in memory, as a whole.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import closing
from typing import Any

from tqdm import tqdm

from verl_credit.annotate.base import AnnotationStats
from verl_credit.cli.annotate import add_annotator_arguments, build_cli_annotator, check_annotator_flags
from verl_credit.cli.graph_problems import GraphProblems, print_graph_problems
from verl_credit.cli.section_flags import add_section_arguments, section_values
from verl_credit.config import CreditConfig
from verl_credit.credit_math.grpo import WIDE_SCORE
from verl_credit.credit_output import credit_records
from verl_credit.estimators import estimator_names
from verl_credit.io import (
    InputError,
    RolloutReader,
    RolloutScan,
    check_distinct_files,
    read_rollouts,
    scan_rollouts,
    write_jsonl,
)
from verl_credit.metrics import compute_credit_metrics, count_redundant_tool_calls
from verl_credit.pipeline import RoutedBatch, route_stream, route_trajectories

#: what ``route`` holds in memory (also in ``--help``)
MEMORY_NOTE = (
    "Memory: the input is read twice (a file, not a pipe). A file grouped by uid (every group's lines "
    "consecutive) is streamed: a first pass keeps "
    "no transcript, then one group is held at a time (plus, while the annotator works, up to "
    "--concurrency trajectories after it) and written as it completes; the largest line costs a few "
    "times its size. A file that is not grouped (or holds a reward of 1e18 or more, routed in float64) "
    "is routed in memory as a whole (about 9-10x its size); sort it by uid to stream it."
)

#: what ``--estimator info_gain`` reads (also in ``--help``)
INFO_GAIN_NOTE = (
    "--estimator info_gain needs each line's information_gains: one number or null per action, the "
    "teacher-forced gain in log-probability of the next action from the feedback after this action (what the "
    "trainer measures with a masked forward pass); a line without it gets GRPO's credit, and the file is routed "
    "as one batch (the estimator's magnitude ratio is batch-wide)."
)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "route",
        help=f"route trajectory advantages to actions ({', '.join(estimator_names())})",
        description="Read a rollouts JSONL, build or read graphs, write per-action credit JSONL. "
        + INFO_GAIN_NOTE
        + " "
        + MEMORY_NOTE,
    )
    parser.add_argument("--input", required=True, help="rollouts JSONL (docs/design.md section 8)")
    parser.add_argument("--out", required=True, help="credit JSONL to write")
    parser.add_argument("--estimator", choices=estimator_names(), default="iapo")
    parser.add_argument("--no-norm-by-std", action="store_true", help="Dr.GRPO: do not divide by the group std")
    add_annotator_arguments(parser)  # used for lines without a graph
    # every estimator's settings (its section's dataclass), e.g. --call-credit-alpha for the alpha fusion
    add_section_arguments(parser)
    parser.set_defaults(run=run)


def build_config(args: argparse.Namespace) -> CreditConfig:
    """The ``credit`` settings of the flags, built and validated as the trainer builds its own."""
    return CreditConfig.from_mapping(
        {"estimator": args.estimator, "norm_adv_by_std_in_grpo": not args.no_norm_by_std, **section_values(args)}
    )


def run(args: argparse.Namespace) -> int:
    check_distinct_files([("--input", args.input)], [("--out", args.out), ("--cache", args.cache)])
    check_annotator_flags(args)
    config = build_config(args)
    _check_rereadable(args.input)
    with tqdm(desc="scan", unit="line", file=sys.stderr, disable=None) as bar:
        scan = scan_rollouts(args.input, progress=bar.update)
    if not scan.lines:
        raise ValueError(f"{args.input}: no trajectories")
    if not scan.grouped:
        assert scan.reopened is not None
        line, key, first = scan.reopened
        print(
            f"verl-credit: warning: {args.input}:{line}: group {key} began on line {first} and ended before: "
            "the file is not grouped by uid, so it is routed in memory as a whole (sort it by uid to stream it)",
            file=sys.stderr,
        )
        return _run_in_memory(args, config, scan.lines)
    if scan.max_abs_reward >= WIDE_SCORE:  # float64 scores: see pipeline.route_group
        return _run_in_memory(args, config, scan.lines)
    if config.registered_estimator.couples_groups:  # batch-level statistics: the file is one batch
        return _run_in_memory(args, config, scan.lines)
    return _run_streaming(args, config, scan)


def _check_rereadable(path: str) -> None:
    """The input is read twice (scan, then route): a pipe or a socket cannot be."""
    try:
        info = os.stat(path)
    except OSError:
        return  # the reader names the problem ("cannot open: ...")
    if stat.S_ISFIFO(info.st_mode) or stat.S_ISSOCK(info.st_mode):
        raise ValueError(f"{path}: a pipe: route reads its input twice (save the pipe's output to a file)")


def _run_streaming(args: argparse.Namespace, config: CreditConfig, scan: RolloutScan) -> int:
    """One group at a time, each written as it completes (a file grouped by uid)."""
    needs_graphs = config.registered_estimator.needs_annotator
    annotator = build_cli_annotator(args) if needs_graphs else "rules"
    width = scan.max_actions
    summary = _StreamSummary()
    problems = GraphProblems()
    with tqdm(total=scan.lines, desc=f"route:{config.estimator}", unit="traj", file=sys.stderr, disable=None) as bar:
        reader = RolloutReader(args.input, warn=lambda line: bar.write(line, file=sys.stderr))

        def items() -> Iterator[tuple[str, Any]]:
            closed: set[str] = set()
            current: str | None = None
            for number, key, trajectory in reader:
                # the scan said so; a file that changes between the two passes is refused
                if trajectory.num_actions > width or abs(trajectory.reward) >= WIDE_SCORE:
                    raise InputError(args.input, number, "the file changed while it was routed")
                if key != current:
                    if key in closed:
                        raise InputError(args.input, number, "the file changed while it was routed")
                    if current is not None:
                        closed.add(current)
                    current = key
                yield key, trajectory

        def records() -> Iterator[dict[str, Any]]:
            stream = route_stream(items(), config, annotator, width=width, progress=bar.update)
            with closing(stream):
                for routed in stream:
                    summary.add(routed)
                    problems.add_all(routed.trajectories, routed.annotations or [])
                    yield from credit_records(
                        routed.trajectories, routed.credit, routed.annotations, routed.call_graphs
                    )
                    del routed  # hold one group: this one is freed before the next is routed

        count = write_jsonl(args.out, records())
    print_summary(args.out, config.estimator, count, summary.metrics())
    if needs_graphs:
        problems.print()
    if reader.duplicates:
        print(f"  duplicate ids                      {reader.duplicates}")
    return 0


class _Spread:
    """count, mean, sum of squared deviations (merged per group, Chan et al.), min, max and the
    number of ``|w - 1| > 0.1`` of the weights seen: ``metrics.weight_spread`` over a stream."""

    def __init__(self) -> None:
        self.count, self.mean, self.m2, self.dev10 = 0, 0.0, 0.0, 0
        self.low, self.high = float("inf"), float("-inf")

    def add(self, values: Any) -> None:
        count = int(values.numel())
        if not count:
            return
        mean = float(values.mean())
        m2 = float((values - mean).square().sum())
        total = self.count + count
        delta = mean - self.mean
        self.m2 += m2 + delta * delta * self.count * count / total
        self.mean += delta * count / total
        self.count = total
        self.dev10 += int(((values - 1.0).abs() > 0.1).sum())
        self.low, self.high = min(self.low, float(values.min())), max(self.high, float(values.max()))

    def result(self) -> dict[str, float]:
        if not self.count:
            return {"std": 0.0, "min": 0.0, "max": 0.0, "frac_dev10": 0.0}
        std = (max(self.m2, 0.0) / self.count) ** 0.5
        return {"std": std, "min": self.low, "max": self.high, "frac_dev10": self.dev10 / self.count}


class _StreamSummary:
    """The summary metrics of ``compute_credit_metrics`` (the ones :func:`print_summary` shows),
    summed group by group."""

    def __init__(self) -> None:
        self.stats = AnnotationStats()
        self.annotated = False
        self.positive, self.negative = _Spread(), _Spread()
        self.actions = self.edges = self.errors = self.trajectories = self.redundant = 0
        self.anchor_matched: float | None = None

    def add(self, routed: RoutedBatch) -> None:
        credit = routed.credit
        if routed.annotations is not None:
            self.annotated = True
            for result in routed.annotations:
                self.stats.add(result)
                self.edges += len(result.graph.edges)
                self.errors += len(result.graph.errors)
        has_tokens = credit.lengths > 0
        advantage = credit.trajectory_advantage.unsqueeze(-1)
        self.positive.add(credit.weight[has_tokens & (advantage > 0)])
        self.negative.add(credit.weight[has_tokens & (advantage < 0)])
        self.actions += int(credit.num_actions.sum())
        self.trajectories += len(routed.trajectories)
        self.redundant += sum(count_redundant_tool_calls(t) for t in routed.trajectories)
        if "anchor_matched" in credit.extras:
            self.anchor_matched = (self.anchor_matched or 0.0) + float(credit.extras["anchor_matched"].sum())

    def metrics(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if self.annotated:
            metrics["credit/fallback_rate"] = self.stats.fallback_rate
            metrics["credit/repaired_edges"] = float(self.stats.repaired_edges)
            metrics["credit/annotate_seconds"] = self.stats.seconds
            metrics["credit/cache_hit_rate"] = self.stats.cache_hit_rate
        positive, negative = self.positive.result(), self.negative.result()
        metrics["credit/w_pos_std"] = positive["std"]
        metrics["credit/w_pos_min"] = positive["min"]
        metrics["credit/w_pos_max"] = positive["max"]
        metrics["credit/w_pos_frac_dev10"] = positive["frac_dev10"]
        metrics["credit/w_neg_frac_dev10"] = negative["frac_dev10"]
        if self.annotated and self.actions:
            metrics["credit/edges_per_action"] = self.edges / self.actions
            metrics["credit/error_rate"] = self.errors / self.actions
        if self.anchor_matched is not None and self.actions:
            metrics["credit/anchor_match_rate"] = self.anchor_matched / self.actions
        if self.trajectories:
            metrics["credit/tool_call_redundancy"] = self.redundant / self.trajectories
        return metrics


def _run_in_memory(args: argparse.Namespace, config: CreditConfig, total: int) -> int:
    """The whole file at once (a file not grouped by uid)."""
    with tqdm(total=total, desc="read", unit="traj", file=sys.stderr, disable=None) as bar:
        trajectories, keys, duplicates = read_rollouts(
            args.input, warn=lambda line: bar.write(line, file=sys.stderr), progress=bar.update
        )
    if not trajectories:
        raise ValueError(f"{args.input}: no trajectories")
    # Group by the JSON value of ``uid`` (1 and "1", null and "None" are different groups); the
    # written records keep the trajectories' own ``uid``.
    grouped = [dataclasses.replace(t, uid=key) for t, key in zip(trajectories, keys, strict=True)]
    with tqdm(
        total=len(trajectories), desc=f"route:{config.estimator}", unit="traj", file=sys.stderr, disable=None
    ) as bar:
        needs_graphs = config.registered_estimator.needs_annotator
        annotator = build_cli_annotator(args) if needs_graphs else "rules"
        routed = route_trajectories(grouped, config, annotator, progress=bar.update)
    records = credit_records(trajectories, routed.credit, routed.annotations, routed.call_graphs)
    write_jsonl(args.out, records)
    metrics = compute_credit_metrics(
        routed.credit,
        routed.stats if routed.annotations is not None else None,
        grouped,
        graphs=[a.graph for a in routed.annotations] if routed.annotations is not None else None,
    )
    print_summary(args.out, config.estimator, len(records), metrics)
    if routed.annotations is not None:
        print_graph_problems(trajectories, routed.annotations)
    if duplicates:
        print(f"  duplicate ids                      {duplicates}")
    return 0


def print_summary(out: str, estimator: str, count: int, metrics: dict[str, float]) -> None:
    print(f"wrote {count} trajectories to {out} (estimator={estimator})")
    rows = [
        ("fallback rate", metrics.get("credit/fallback_rate")),
        ("repaired edges", metrics.get("credit/repaired_edges")),
        ("cache hit rate", metrics.get("credit/cache_hit_rate")),
        ("w+ std", metrics.get("credit/w_pos_std")),
        ("w+ min", metrics.get("credit/w_pos_min")),
        ("w+ max", metrics.get("credit/w_pos_max")),
        ("share of A>0 actions moved >10%", metrics.get("credit/w_pos_frac_dev10")),
        ("share of A<0 actions moved >10%", metrics.get("credit/w_neg_frac_dev10")),
        ("edges per action", metrics.get("credit/edges_per_action")),
        ("error rate", metrics.get("credit/error_rate")),
        ("tool-call redundancy", metrics.get("credit/tool_call_redundancy")),
        ("anchor match rate", metrics.get("credit/anchor_match_rate")),
    ]
    for name, value in rows:
        if value is not None:
            print(f"  {name:<34} {value:.4f}")
