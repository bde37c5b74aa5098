"""``verl-credit ingest``: gateway log (OpenAI / Anthropic API calls) -> rollouts JSONL."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from verl_credit.ingest import FORMATS, stream_ingest
from verl_credit.io import check_distinct_files, write_jsonl


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "ingest",
        help="turn an API-boundary gateway log into rollouts (one trajectory per session)",
        description="Read a gateway log (one model call per line: request, response or streamed chunks), "
        "drop failed attempts (error status, in-stream errors, unparseable replies: counted, the run goes on) "
        "and retries, group calls into sessions (session id, else prefix continuity and tool-call ids) "
        "and write rollouts JSONL (docs/design.md section 8) with per-call token accounting. A malformed request, "
        "a wrong --format or an unsupported API is an error naming file, line and field.",
    )
    parser.add_argument("--input", required=True, help="gateway log JSONL")
    parser.add_argument("--out", required=True, help="rollouts JSONL to write")
    parser.add_argument(
        "--format", choices=FORMATS, default="auto", help="API format of every line (default: per line)"
    )
    parser.add_argument("--stats", default=None, help="also write the ingestion counts (and issues) as JSON here")
    parser.add_argument(
        "--max-notes",
        type=int,
        default=20,
        help="print at most this many failed/flagged-call notes (all are in --stats; default 20)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    check_distinct_files([("--input", args.input)], [("--out", args.out), ("--stats", args.stats)])
    records, stats = stream_ingest(args.input, args.format)  # built one at a time as they are written
    count = write_jsonl(args.out, records)
    if args.stats:
        with open(args.stats, "w", encoding="utf-8") as handle:
            json.dump(stats.to_json(), handle, indent=2)
    print(f"wrote {count} trajectories to {args.out}", file=sys.stderr)
    print(stats.summary_line(args.input), file=sys.stderr)
    print(stats.summary(), file=sys.stderr)
    for note in notes(stats.issues, args.input, args.max_notes):
        print(note, file=sys.stderr)
    if stats.missing_rewards:
        print(
            f"note: {stats.missing_rewards} trajectories have no reward in the log (written as 0.0 with "
            f"reward_known: false)",
            file=sys.stderr,
        )
    return 0


def notes(issues: list[str], log: str, limit: int) -> list[str]:
    """``note: LOG:LINE: field '...': why`` per failed/flagged call, at most ``limit`` of them."""
    shown = [f"note: {log}:{issue}" for issue in issues[: max(limit, 0)]]
    if len(issues) > len(shown):
        shown.append(f"note: ... and {len(issues) - len(shown)} more (see --stats)")
    return shown
