"""``verl-credit audit``: agreement of annotators on the same trajectories (docs/design.md section 8).

Every file is compared with the first (the reference); the metrics are defined in
:mod:`verl_credit.report.audit`. Prints a table; ``--json`` also writes
``{metric: {annotator: value}}`` with the keys ``edge_f1, jaccard, kappa, spearman_m_pos,
spearman_m_neg, sign_agreement, parse_rate``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from verl_credit.config import IAPOConfig
from verl_credit.io import check_distinct_files
from verl_credit.report.audit import (
    audit_graph_sets,
    audit_to_json,
    format_audit_table,
    load_graph_set,
    load_rollout_lengths,
)

_IAPO = IAPOConfig()


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="compare graph files of the same trajectories against a reference",
        description="Edge F1/Jaccard, Cohen's kappa, Spearman rho of m+/m-, sign agreement and parse rate of "
        "each graphs JSONL against the first one.",
    )
    parser.add_argument("reference", help="reference graphs JSONL")
    parser.add_argument("others", nargs="+", help="graphs JSONL files to compare with the reference")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the metrics as JSON here")
    parser.add_argument(
        "--rollouts", default=None, help="rollouts JSONL for per-action token lengths (default: length 1 per action)"
    )
    parser.add_argument("--beta-plus", type=float, default=_IAPO.beta_plus, help="IAPO beta+ for w+")
    parser.add_argument("--clip-c", type=float, default=_IAPO.clip_c, help="IAPO clip bound c for m")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    inputs = [("reference", args.reference), *(("graphs", path) for path in args.others), ("--rollouts", args.rollouts)]
    check_distinct_files(inputs, [("--json", args.json_path)])
    lengths = load_rollout_lengths(args.rollouts) if args.rollouts else None
    sets = [load_graph_set(path, lengths) for path in [args.reference, *args.others]]
    rows = audit_graph_sets(sets, lengths, IAPOConfig(beta_plus=args.beta_plus, clip_c=args.clip_c))
    print(format_audit_table(rows))
    if args.json_path:
        target = Path(args.json_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(audit_to_json(rows), indent=2) + "\n", encoding="utf-8")
        print(f"wrote {target}")
    return 0
