"""``verl-credit``: one module per subcommand, each with ``add_parser(subparsers)`` and ``run(args)``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from verl_credit.estimators.registry import EstimatorPluginError
from verl_credit.io import InputError

# subcommand -> module under verl_credit.cli
COMMANDS: dict[str, str] = {
    "demo": "demo",
    "annotate": "annotate",
    "route": "route",
    "audit": "audit",
    "report": "report",
    "ingest": "ingest",
    "weakness": "weakness",
    "bench": "bench",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verl-credit",
        description="Dependency-aware credit assignment for multi-turn agent RL (IAPO, CALL-CREDIT).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMANDS.values():
        try:
            module = importlib.import_module(f"verl_credit.cli.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"verl_credit.cli.{module_name}":
                continue
            raise
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()  # builds the --estimator choices: loads the estimator plug-ins
    except EstimatorPluginError as exc:
        print(f"verl-credit: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except InputError as exc:
        print(f"verl-credit {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as exc:
        print(f"verl-credit {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader (e.g. `| head`) went away: stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:  # e.g. a full disk or a permission denied while writing
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"verl-credit {args.command}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
