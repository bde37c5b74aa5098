"""``verl-credit route``: rollouts JSONL -> credit JSONL (DESIGN.md section 8)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from tqdm import tqdm

from verl_credit.cli.annotate import add_annotator_arguments, build_cli_annotator
from verl_credit.config import ESTIMATORS, CallCreditConfig, CreditConfig, IAPOConfig
from verl_credit.credit.call_credit import CALL_CREDIT_MODES
from verl_credit.credit.iapo import NEG_ROUTES
from verl_credit.credit_records import credit_records
from verl_credit.io import count_lines, read_rollouts, write_jsonl
from verl_credit.metrics import compute_credit_metrics
from verl_credit.pipeline import route_trajectories

_IAPO = IAPOConfig()
_CALL = CallCreditConfig()


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "route",
        help="route trajectory advantages to actions (iapo, call_credit or grpo)",
        description="Read a rollouts JSONL, build or read graphs, write per-action credit JSONL.",
    )
    parser.add_argument("--input", required=True, help="rollouts JSONL (DESIGN.md section 8)")
    parser.add_argument("--out", required=True, help="credit JSONL to write")
    parser.add_argument("--estimator", choices=ESTIMATORS, default="iapo")
    parser.add_argument("--beta-plus", type=float, default=_IAPO.beta_plus)
    parser.add_argument("--clip-c", type=float, default=_IAPO.clip_c)
    parser.add_argument("--neg-route", choices=NEG_ROUTES, default=_IAPO.neg_route)
    parser.add_argument("--beta-minus", type=float, default=_IAPO.beta_minus)
    parser.add_argument("--no-norm-by-std", action="store_true", help="Dr.GRPO: do not divide by the group std")
    add_annotator_arguments(parser)  # used for lines without a graph
    parser.add_argument("--call-mode", choices=CALL_CREDIT_MODES, default=_CALL.mode)
    parser.add_argument("--smoothing", type=float, default=_CALL.smoothing, help="call_credit lambda")
    parser.add_argument("--gamma", type=float, default=_CALL.gamma, help="call_credit discount")
    parser.set_defaults(run=run)


def build_config(args: argparse.Namespace) -> CreditConfig:
    return CreditConfig(
        estimator=args.estimator,
        norm_adv_by_std_in_grpo=not args.no_norm_by_std,
        iapo=IAPOConfig(
            beta_plus=args.beta_plus, clip_c=args.clip_c, neg_route=args.neg_route, beta_minus=args.beta_minus
        ),
        call_credit=CallCreditConfig(mode=args.call_mode, smoothing=args.smoothing, gamma=args.gamma),
    )


def run(args: argparse.Namespace) -> int:
    config = build_config(args)
    total = count_lines(args.input)
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
        annotator = build_cli_annotator(args) if config.estimator == "iapo" else "rules"
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


def print_graph_problems(trajectories: list[Any], annotations: list[Any], limit: int = 20) -> None:
    """One stderr line per repaired or replaced given graph (the first ``limit``), naming its id."""
    shown = 0
    for trajectory, annotation in zip(trajectories, annotations, strict=True):
        validation = annotation.validation
        if annotation.source != "given" or not (validation.fallback or validation.repaired_edges):
            continue
        if shown == limit:
            print("verl-credit: warning: more graphs were repaired (see repaired_edges)", file=sys.stderr)
            return
        shown += 1
        action = "replaced by the uniform graph" if validation.fallback else f"{validation.repaired_edges} repairs"
        problems = "; ".join(validation.problems[:3])
        print(f"verl-credit: warning: graph of {trajectory.id!r}: {action}: {problems}", file=sys.stderr)


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
    ]
    for name, value in rows:
        if value is not None:
            print(f"  {name:<34} {value:.4f}")
