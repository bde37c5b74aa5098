"""One self-contained HTML report: PNG pictures embedded as ``data:`` URIs, no external files."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from verl_credit.report.credit_input import CreditLine
from verl_credit.report.figures import batch_figure, figure_png, trajectory_figure

__all__ = ["TrajectoryPicture", "pick_trajectories", "render_report", "write_report_page"]

_STYLE = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
img { max-width: 100%; display: block; margin: 6px 0 18px; }
.note { color: #666; font-size: 12px; }
"""


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(rows: Sequence[Mapping[str, object]]) -> str:
    if not rows:
        return ""
    columns = list(rows[0])
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(row.get(c)))}</td>" for c in columns) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "" if value is None else str(value)


def pick_trajectories(lines: Sequence[CreditLine], limit: int) -> list[CreditLine]:
    """Up to ``limit`` lines: positive and negative advantages alternating, those with errors or
    more edges first within each side, file order otherwise."""

    def interest(line: CreditLine) -> tuple[int, int]:
        graph = line.graph
        return (-(len(graph.errors) if graph else 0), -(len(graph.edges) if graph else 0))

    positive = sorted((ln for ln in lines if ln.trajectory_advantage > 0), key=interest)
    negative = sorted((ln for ln in lines if ln.trajectory_advantage < 0), key=interest)
    zero = [ln for ln in lines if ln.trajectory_advantage == 0]
    picked: list[CreditLine] = []
    for k in range(max(len(positive), len(negative))):
        for side in (positive, negative):
            if k < len(side) and len(picked) < limit:
                picked.append(side[k])
    picked += zero[: max(0, limit - len(picked))]
    return picked


@dataclass
class TrajectoryPicture:
    """One trajectory's picture on the page, with the same trajectory under other estimators."""

    line: CreditLine
    png: bytes
    others: list[tuple[str, bytes]] = field(default_factory=list)  # (estimator, PNG)


def render_report(
    lines: Sequence[CreditLine],
    out: str | Path,
    *,
    title: str = "verl-credit report",
    comparisons: Mapping[str, Sequence[CreditLine]] | None = None,
    summary_rows: Sequence[Mapping[str, object]] | None = None,
    max_trajectories: int = 12,
    intro: str = "",
) -> Path:
    """Write the HTML report of ``lines`` (the main estimator) to ``out`` and return its path.

    ``comparisons`` adds other estimators' lines to the batch plots (and one picture each for the
    first trajectory shown); ``summary_rows`` becomes a table at the top.
    """
    if not lines:
        raise ValueError("the report needs at least one credit line")
    main_name = lines[0].estimator
    sets: dict[str, Sequence[CreditLine]] = {main_name: lines, **dict(comparisons or {})}
    by_id = {name: {ln.id: ln for ln in group} for name, group in sets.items() if name != main_name}
    pictures = []
    for index, line in enumerate(pick_trajectories(lines, max_trajectories)):
        picture = TrajectoryPicture(line, figure_png(trajectory_figure(line)[0]))
        if index == 0:
            for name, lookup in by_id.items():
                other = lookup.get(line.id)
                if other is not None:
                    picture.others.append((name, figure_png(trajectory_figure(other)[0])))
        pictures.append(picture)
    return write_report_page(
        lines,
        out,
        title=title,
        batch_png=figure_png(batch_figure(sets)),
        pictures=pictures,
        summary_rows=summary_rows,
        intro=intro,
    )


def write_report_page(
    lines: Sequence[CreditLine],
    out: str | Path,
    *,
    title: str,
    batch_png: bytes,
    pictures: Sequence[TrajectoryPicture],
    summary_rows: Sequence[Mapping[str, object]] | None = None,
    intro: str = "",
    action_rows: Sequence[Mapping[str, object]] | None = None,
) -> Path:
    """Write the report page from pictures already drawn (:func:`render_report` draws them; the
    trainer's live pictures reuse theirs): a note on ``lines``, the summary table, the batch plots,
    one picture per trajectory and, if given, a table of the pictured actions."""
    main_name = lines[0].estimator if lines else "?"
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
    ]
    if intro:
        parts.append(f"<p>{html.escape(intro)}</p>")
    fallbacks = sum(line.fallback for line in lines)
    parts.append(
        f"<p class='note'>{len(lines)} trajectories, estimator <b>{html.escape(main_name)}</b>, "
        f"{fallbacks} uniform fallbacks.</p>"
    )
    if summary_rows:
        parts.append("<h2>Summary</h2>" + _table(summary_rows))
    parts.append("<h2>Batch: routed weights</h2>")
    parts.append(_img(batch_png, "histograms of routed weights"))
    parts.append(
        "<h2>Trajectories</h2><p class='note'>Bars: routed weight per action (dashed line: 1 = GRPO). "
        "Arcs above: support-use edges (+); dashed arcs below: failed-use edges (-); X: error.</p>"
    )
    for picture in pictures:
        parts.append(_img(picture.png, f"credit of {picture.line.id}"))
        for note in picture.line.notes:
            parts.append(f"<p class='note'>{html.escape(note)}</p>")
        for name, png in picture.others:
            parts.append(f"<p class='note'>The same trajectory under <b>{html.escape(name)}</b>:</p>")
            parts.append(_img(png, f"{name} credit of {picture.line.id}"))
    if action_rows:
        parts.append("<h2>Actions pictured</h2>" + _table(action_rows))
    parts.append("</body></html>")
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(parts), encoding="utf-8")
    return target
