"""docs/metrics.md from the registry of logged metrics (``verl_credit.metrics.METRIC_DOCS``).

    python scripts/docs_metrics.py            # write docs/metrics.md
    python scripts/docs_metrics.py --check    # exit 1 when docs/metrics.md differs from the registry

It also holds the scanner that finds the metric names of the source (``credit/...`` and
``credit_viz/...`` string literals and f-strings), which ``tests/docs/test_metrics_doc.py`` checks
against the registry in both directions.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_credit.metrics import METRIC_DOCS, METRIC_GROUPS, VERL_METRIC_DOCS, MetricDoc

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "verl_credit"
OUTPUT = ROOT / "docs" / "metrics.md"

#: a whole string that is a metric name of this project; a name never ends in ``_`` or ``/``, so
#: prefixes (``name.startswith("credit/failed_sessions_")``) are not taken for names
METRIC_NAME = re.compile(r"(?:credit|credit_viz)/[A-Za-z0-9_{}]*[A-Za-z0-9}]")
_PLACEHOLDER = re.compile(r"\{[^{}]*\}")


def metric_pattern(name: str) -> str:
    """``name`` with every ``{...}`` part written ``{}``: ``credit/omega_{r}`` and the registry's
    ``credit/omega_{role}`` are the same pattern."""
    return _PLACEHOLDER.sub("{}", name)


@dataclass(frozen=True)
class MetricNameUse:
    """A metric name as written in the source (an f-string's fields as ``{expression}``)."""

    name: str
    path: str
    line: int

    @property
    def pattern(self) -> str:
        return metric_pattern(self.name)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def _literal_text(part: ast.expr) -> str:
    """A piece of an f-string: its text, or a field as ``{expression}``."""
    if isinstance(part, ast.FormattedValue):
        return "{" + ast.unparse(part.value) + "}"
    return str(part.value) if isinstance(part, ast.Constant) else ""


class _MetricNameFinder(ast.NodeVisitor):
    def __init__(self, path: str):
        self.path = path
        self.found: list[MetricNameUse] = []

    def _add(self, text: str, node: ast.expr) -> None:
        if METRIC_NAME.fullmatch(text):
            self.found.append(MetricNameUse(text, self.path, node.lineno))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if called == MetricDoc.__name__:  # the registry's own entries document names, they do not use them
            return
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        self._add("".join(_literal_text(part) for part in node.values), node)
        for part in node.values:  # the fields' expressions, not the literal pieces of the f-string
            if isinstance(part, ast.FormattedValue):
                self.visit(part.value)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self._add(node.value, node)


def find_metric_names(source: str, path: str = "<source>") -> list[MetricNameUse]:
    """Every string literal and f-string of ``source`` that is a whole metric name, in line order."""
    finder = _MetricNameFinder(path)
    finder.visit(ast.parse(source, filename=path))
    return sorted(finder.found, key=lambda use: use.line)


def scan_package(package: Path = PACKAGE) -> list[MetricNameUse]:
    """:func:`find_metric_names` over every ``.py`` file under ``package`` (paths relative to its parent)."""
    found: list[MetricNameUse] = []
    for path in sorted(package.rglob("*.py")):
        found += find_metric_names(path.read_text(encoding="utf-8"), path.relative_to(package.parent).as_posix())
    return found


def undocumented(uses: Iterable[MetricNameUse], docs: Sequence[MetricDoc] = METRIC_DOCS) -> list[MetricNameUse]:
    """The uses whose name (or pattern) has no entry in ``docs``."""
    known = {metric_pattern(doc.name) for doc in docs}
    return [use for use in uses if use.pattern not in known]


def unused(uses: Iterable[MetricNameUse], docs: Sequence[MetricDoc] = METRIC_DOCS) -> list[MetricDoc]:
    """The entries of ``docs`` that no use names (stale documentation)."""
    used = {use.pattern for use in uses}
    return [doc for doc in docs if metric_pattern(doc.name) not in used]


def find_doc(name: str, docs: Sequence[MetricDoc] = METRIC_DOCS) -> MetricDoc | None:
    """The entry documenting a logged key: the same name, or a pattern whose ``{...}`` parts stand
    for it (``credit/failed_sessions_user`` -> ``credit/failed_sessions_{kind}``)."""
    for doc in docs:
        literal = (re.escape(piece) for piece in _PLACEHOLDER.split(doc.name))
        if re.fullmatch("[A-Za-z0-9_]+".join(literal), name):
            return doc
    return None


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(docs: Iterable[MetricDoc], owner: str = "") -> list[str]:
    lines = ["| name | meaning | healthy range |", "| --- | --- | --- |"]
    lines += [f"| `{_cell(d.name)}`{owner} | {_cell(d.meaning)} | {_cell(d.healthy)} |" for d in docs]
    return lines


def render() -> str:
    """The markdown of ``docs/metrics.md``."""
    lines = [
        "# Metrics",
        "",
        "<!-- Generated by scripts/docs_metrics.py from METRIC_DOCS in verl_credit/metrics.py; "
        "edit those, then run `python scripts/docs_metrics.py`. -->",
        "",
        "Every training step the credit trainer adds these to verl's metrics dict, so verl's tracker "
        "(`trainer.logger`: console, file, wandb, tensorboard, mlflow, swanlab) logs them beside verl's own. "
        f"{len(METRIC_DOCS)} metrics in {len(METRIC_GROUPS)} groups; some are logged only by one estimator "
        "or with one switch on, as their group or meaning says. A `{...}` part of a name is a pattern "
        "whose values the meaning lists. *Healthy range* is what a healthy run shows, or what a bad "
        "value means. Counts are per step unless the meaning says otherwise.",
    ]
    for group in METRIC_GROUPS:
        lines += ["", f"## {group.title}", "", group.summary, "", *_table(group.metrics)]
    lines += [
        "",
        "## verl's metrics to watch beside these",
        "",
        "verl logs many metrics of its own (`actor/*`, `critic/*`, `timing_s/*`, ...), documented by verl; "
        "these few are the ones to read with the credit metrics.",
        "",
        *_table(VERL_METRIC_DOCS, owner=" (verl's)"),
    ]
    return "\n".join(lines) + "\n"


def _shown(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def main(argv: Sequence[str] | None = None, output: Path = OUTPUT) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help=f"exit 1 when {_shown(output)} differs from the registry (write nothing)"
    )
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = output.read_text(encoding="utf-8") if output.exists() else None
        if current != text:
            print(
                f"docs_metrics: {_shown(output)} is stale (it differs from METRIC_DOCS in verl_credit/metrics.py); "
                "run python scripts/docs_metrics.py",
                file=sys.stderr,
            )
            return 1
        return 0
    output.write_text(text, encoding="utf-8")
    print(f"wrote {_shown(output)}: {len(METRIC_DOCS)} metrics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
