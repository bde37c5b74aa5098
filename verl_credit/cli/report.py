"""``verl-credit report``: a credit JSONL, or one step of a trainer dump -> one self-contained HTML file."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="draw a credit JSONL (or a step of a trainer dump) as pictures in one HTML file",
        description=(
            "Per-trajectory pictures (weights per action, support/failed-use edges, errors) and batch histograms "
            "of w+ and w-, embedded as PNG in one self-contained HTML file. The input is a credit JSONL "
            "(--input) or one training step of the credit trainer's dump (--dump-dir, credit.debug.dump_dir): its "
            "credit is rebuilt from the recorded transcripts, graphs and rewards."
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", help="credit JSONL (written by verl-credit route or demo)")
    source.add_argument("--dump-dir", help="the trainer's credit.debug.dump_dir (step_N.pt files)")
    parser.add_argument("--step", type=int, default=None, help="with --dump-dir: the step to draw (default: the last)")
    parser.add_argument("--out", required=True, help="HTML file to write")
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="CREDIT.jsonl",
        help="another estimator's credit JSONL for the batch plots (repeatable)",
    )
    parser.add_argument(
        "--rollouts", default=None, help="the rollouts JSONL, to label actions with their tool calls / text"
    )
    parser.add_argument("--max-trajectories", type=int, default=12, help="trajectory pictures (default 12)")
    parser.add_argument("--title", default=None, help="report title")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from verl_credit.io import check_distinct_files, load_trajectories
    from verl_credit.report.credit_input import action_labels, load_credit_lines
    from verl_credit.report.html import render_report

    inputs = [("--input", args.input), *(("--compare", path) for path in args.compare), ("--rollouts", args.rollouts)]
    check_distinct_files(inputs, [("--out", args.out)])
    if args.max_trajectories < 0:
        raise ValueError(f"--max-trajectories must be >= 0, got {args.max_trajectories}")
    if args.step is not None and not args.dump_dir:
        raise ValueError("--step needs --dump-dir")
    labels = None
    if args.rollouts:
        labels = {t.id: action_labels(t) for _, t in load_trajectories(args.rollouts)}
    intro = ""
    if args.dump_dir:
        lines, title, intro = _dump_lines(args.dump_dir, args.step)
    else:
        lines, title = load_credit_lines(args.input, labels), f"verl-credit report: {args.input}"
    comparisons = {}
    for path in args.compare:
        other = load_credit_lines(path, labels)
        name = other[0].estimator
        comparisons[f"{name} ({path})" if name in comparisons or name == lines[0].estimator else name] = other
    out = render_report(
        lines,
        args.out,
        title=args.title or title,
        comparisons=comparisons,
        max_trajectories=args.max_trajectories,
        intro=intro,
    )
    print(f"wrote {out} ({len(lines)} trajectories)")
    return 0


def _dump_lines(folder: str, step: int | None) -> tuple[list[Any], str, str]:
    """The credit lines of one dumped step, the page title and a line on the rebuild."""
    from verl_credit.io import InputError
    from verl_credit.verl.credit_dump import dump_path
    from verl_credit.verl.step_record import read_step_record, rebuild_step

    chosen, record = read_step_record(folder, step)
    try:
        rebuilt = rebuild_step(record)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(dump_path(folder, chosen), None, f"not a credit step record: {exc}") from None
    if not rebuilt.lines:
        raise InputError(dump_path(folder, chosen), None, "the step has no training session (only padding rows)")
    agreement = (
        f"the rebuilt advantages match the trainer's (max |diff| {rebuilt.max_abs_diff:.2g})"
        if rebuilt.agrees
        else "; ".join(rebuilt.notes) or "the trainer's advantages are not in the dump"
    )
    intro = f"Training step {chosen} of {folder}: {len(rebuilt.lines)} sessions, rebuilt from the dump; {agreement}."
    return rebuilt.lines, f"verl-credit report: {folder} step {chosen}", intro
