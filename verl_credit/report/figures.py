"""Matplotlib pictures of routed credit: one trajectory, and a batch.

Per trajectory (:func:`draw_trajectory`): the actions in order as bars whose height is the
routed weight ``w_i`` (dashed line at 1), colored by the side of 1 they fall on
(:data:`ABOVE_COLOR` / :data:`BELOW_COLOR`, :data:`EQUAL_COLOR` within :data:`EQUAL_TOLERANCE`);
support-use (``+``) edges as arcs above the bars, failed-use (``-``) edges as dashed arcs below
the baseline, error actions marked with a red cross; call-credit roles printed in the bars and
call-graph edges drawn as arcs too. The title carries the reward and the trajectory advantage.

Batch (:func:`batch_figure`): histograms of ``w+`` (the weights of actions of trajectories with
``A > 0``) and ``w-`` (``A < 0``), and the share of actions moved by more than 10% (``|w - 1| >
0.1``) on each branch, per estimator.

Figures are built with :class:`matplotlib.figure.Figure` (no pyplot state, no display needed).
Every text that comes from data (ids, estimator names, roles, action labels) goes through
:func:`plain_text`: matplotlib would read a ``$...$`` in it as mathtext (and a deeply nested one
raises ``RecursionError`` inside its parser).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, PathPatch
from matplotlib.path import Path

from verl_credit.report.credit_input import CreditLine

__all__ = [
    "ABOVE_COLOR",
    "BELOW_COLOR",
    "EQUAL_COLOR",
    "EQUAL_TOLERANCE",
    "TrajectoryDrawing",
    "batch_figure",
    "branch_weights",
    "draw_trajectory",
    "figure_png",
    "figure_png_and_pixels",
    "plain_text",
    "share_moved",
    "trajectory_figure",
    "weight_color",
]

# Okabe-Ito colorblind-safe pair: more credit than GRPO (orange), less (blue), same (grey).
ABOVE_COLOR = "#E69F00"
BELOW_COLOR = "#0072B2"
EQUAL_COLOR = "#BBBBBB"
EQUAL_TOLERANCE = 1e-6
SUPPORT_COLOR = "#009E73"
FAILED_COLOR = "#D55E00"
CALL_EDGE_COLOR = "#CC79A7"
ERROR_COLOR = "#C00000"


def plain_text(text: str) -> str:
    """``text`` as literal characters for a matplotlib label: every ``$`` escaped (``\\$``), so no
    part of it is parsed as mathtext."""
    return text.replace("$", r"\$")


def weight_color(weight: float) -> str:
    """The bar color of an action with routed weight ``weight``."""
    if weight > 1.0 + EQUAL_TOLERANCE:
        return ABOVE_COLOR
    if weight < 1.0 - EQUAL_TOLERANCE:
        return BELOW_COLOR
    return EQUAL_COLOR


@dataclass
class TrajectoryDrawing:
    """What :func:`draw_trajectory` drew (for tests and captions)."""

    face_colors: list[str]  # one per action, in order
    support_arcs: int
    failed_arcs: int
    call_arcs: int
    error_marks: list[int]


def _arc(ax: Axes, src: float, dst: float, base: float, height: float, color: str, dashed: bool) -> None:
    """A quadratic Bezier arc in data coordinates from ``(src, base)`` to ``(dst, base)`` whose peak
    is ``height`` away from ``base`` (negative: below), with an arrow head at ``dst``."""
    control = (0.5 * (src + dst), base + 2.0 * height)
    path = Path([(src, base), control, (dst, base)], [Path.MOVETO, Path.CURVE3, Path.CURVE3])
    ax.add_patch(
        PathPatch(path, facecolor="none", edgecolor=color, linewidth=1.3, alpha=0.9, linestyle="--" if dashed else "-")
    )
    ax.plot([dst], [base], marker="v" if height > 0 else "^", color=color, markersize=4)


def draw_trajectory(ax: Axes, line: CreditLine, max_label_chars: int = 26) -> TrajectoryDrawing:
    """Draw one trajectory's credit on ``ax`` (see the module doc); returns what was drawn."""
    count = line.num_actions
    x = np.arange(count)
    weights = np.asarray(line.weights, dtype=float)
    colors = [weight_color(w) for w in weights]
    errors = sorted({mark.action for mark in line.graph.errors}) if line.graph is not None else []
    edge_colors = [ERROR_COLOR if i in errors else "#333333" for i in range(count)]
    ax.bar(
        x,
        weights,
        width=0.78,
        color=colors,
        edgecolor=edge_colors,
        linewidth=[2.0 if i in errors else 0.6 for i in range(count)],
    )
    top = max(float(weights.max()) if count else 1.0, 1.0)
    ax.axhline(1.0, color="#555555", linestyle="--", linewidth=0.8)
    for i, w in enumerate(weights):
        ax.text(i, w + 0.02 * top, f"{w:.2f}", ha="center", va="bottom", fontsize=7)
        if line.roles[i] is not None:
            ax.text(
                i,
                0.04 * top,
                plain_text(line.roles[i]),
                ha="center",
                va="bottom",
                fontsize=7,
                color="white",
                weight="bold",
            )
    for i in errors:
        ax.plot([i], [weights[i] + 0.2 * top], marker="X", color=ERROR_COLOR, markersize=8)

    # Bands: arcs above the bars (support / call edges) and below the baseline (failed use).
    arc_base = 1.32 * top
    band = 0.9 * top
    longest = max(count - 1, 1)
    support = failed = calls = 0
    below = 0.0
    up_edges: list[tuple[int, int, str]] = []
    if line.graph is not None:
        for edge in line.graph.edges:
            if edge.sign == "+":
                up_edges.append((edge.src, edge.dst, SUPPORT_COLOR))
                support += 1
            else:
                height = -0.25 * top * (0.35 + 0.65 * (edge.dst - edge.src) / longest)
                _arc(ax, edge.src, edge.dst, -0.02 * top, height, FAILED_COLOR, dashed=True)
                below = min(below, height)
                failed += 1
    if line.call_graph is not None:
        for call_edge in line.call_graph.edges:
            up_edges.append((call_edge.src, call_edge.dst, CALL_EDGE_COLOR))
            calls += 1
    for src, dst, color in up_edges:
        _arc(ax, src, dst, arc_base, band * (0.2 + 0.8 * (dst - src) / longest), color, dashed=False)

    ax.set_xlim(-0.7, max(count, 1) - 0.3)
    ax.set_ylim(below * 1.15 - 0.02 * top if failed else 0.0, arc_base + (band if up_edges else 0.1 * top))
    ax.set_xticks(x)
    labels = line.labels or [f"a{i}" for i in range(count)]
    ax.set_xticklabels(
        [plain_text(f"{i}: {_short(label, max_label_chars)}") for i, label in enumerate(labels)],
        rotation=40,
        ha="right",
        fontsize=7,
    )
    ax.set_ylabel("routed weight w")
    ax.spines[["top", "right"]].set_visible(False)
    title = (
        f"{line.id} (group {line.uid}) - {line.estimator}: reward {line.reward:g}, "
        f"trajectory advantage {line.trajectory_advantage:+.3f}"
    )
    if line.fallback:
        title += " [uniform fallback]"
    ax.set_title(plain_text(title), fontsize=9)
    return TrajectoryDrawing(colors, support, failed, calls, errors)


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _legend_handles(line: CreditLine) -> list:
    handles: list = [
        Patch(color=ABOVE_COLOR, label="w > 1 (more than GRPO)"),
        Patch(color=BELOW_COLOR, label="w < 1 (less than GRPO)"),
        Patch(color=EQUAL_COLOR, label="w = 1"),
    ]
    if line.graph is not None:
        handles += [
            Line2D([], [], color=SUPPORT_COLOR, label="support-use edge (+)"),
            Line2D([], [], color=FAILED_COLOR, linestyle="--", label="failed-use edge (-)"),
            Line2D([], [], color=ERROR_COLOR, marker="X", linestyle="", label="error"),
        ]
    if line.call_graph is not None:
        handles.append(Line2D([], [], color=CALL_EDGE_COLOR, label="causal call edge"))
    return handles


def trajectory_figure(line: CreditLine) -> tuple[Figure, TrajectoryDrawing]:
    """A standalone figure of one trajectory (width grows with the number of actions)."""
    width = min(max(6.5, 0.62 * line.num_actions + 3.0), 16.0)
    figure = Figure(figsize=(width, 3.9), layout="constrained")
    ax = figure.add_subplot()
    drawing = draw_trajectory(ax, line)
    ax.legend(handles=_legend_handles(line), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return figure, drawing


def branch_weights(lines: Sequence[CreditLine], positive: bool) -> np.ndarray:
    """``w+`` (``positive``: routed weights of the actions with tokens of trajectories with ``A > 0``)
    or ``w-`` (``A < 0``), as in ``credit/w_pos_*`` (:mod:`verl_credit.metrics`)."""
    values = [
        w
        for line in lines
        if (line.trajectory_advantage > 0 if positive else line.trajectory_advantage < 0)
        for w, length in zip(line.weights, line.lengths, strict=True)
        if length > 0
    ]
    return np.asarray(values, dtype=float)


def share_moved(weights: np.ndarray, threshold: float = 0.1) -> float:
    """Share of weights with ``|w - 1| > threshold`` (0 for no weights)."""
    return float((np.abs(weights - 1.0) > threshold).mean()) if weights.size else 0.0


def batch_figure(sets: Mapping[str, Sequence[CreditLine]]) -> Figure:
    """Histograms of ``w+`` and ``w-`` and the share moved >10%, one series per estimator."""
    figure = Figure(figsize=(12.0, 3.6), layout="constrained")
    axes = figure.subplots(1, 3)
    palette = ["#E69F00", "#0072B2", "#009E73", "#CC79A7", "#56B4E9"]
    names = list(sets)
    shares: dict[str, tuple[float, float]] = {}
    every = np.concatenate([branch_weights(lines, side) for lines in sets.values() for side in (True, False)])
    low, high = (float(every.min()), float(every.max())) if every.size else (0.5, 1.5)
    bins = np.linspace(min(low, 0.95), max(high, 1.05), 41)
    for k, name in enumerate(names):
        color = palette[k % len(palette)]
        for ax, positive in ((axes[0], True), (axes[1], False)):
            values = branch_weights(sets[name], positive)
            if values.size and np.all(np.abs(values - 1.0) <= EQUAL_TOLERANCE):
                ax.plot([], [], " ", label=plain_text(f"{name}: all w = 1 (n={values.size})"))
            elif values.size:
                ax.hist(
                    values,
                    bins=bins,
                    histtype="stepfilled",
                    alpha=0.45,
                    color=color,
                    edgecolor=color,
                    label=plain_text(f"{name} (n={values.size})"),
                )
        shares[name] = (share_moved(branch_weights(sets[name], True)), share_moved(branch_weights(sets[name], False)))
    for ax, what in ((axes[0], "w+ (actions of trajectories with A > 0)"), (axes[1], "w- (actions with A < 0)")):
        ax.axvline(1.0, color="#555555", linestyle="--", linewidth=0.8)
        ax.set_title(what, fontsize=9)
        ax.set_xlabel("routed weight")
        ax.set_ylabel("actions")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, frameon=False)
    width = 0.8 / max(len(names), 1)
    for k, name in enumerate(names):
        positions = np.arange(2) + (k - (len(names) - 1) / 2) * width
        axes[2].bar(positions, shares[name], width=width, color=palette[k % len(palette)], label=plain_text(name))
        for position, value in zip(positions, shares[name], strict=True):
            axes[2].text(position, value + 0.01, f"{value:.0%}", ha="center", va="bottom", fontsize=7)
    axes[2].set_xticks([0, 1])
    axes[2].set_xticklabels(["A > 0 (w+)", "A < 0 (w-)"])
    axes[2].set_ylim(0, 1.1)
    axes[2].set_title("share of actions moved > 10% (|w - 1| > 0.1)", fontsize=9)
    axes[2].legend(fontsize=7, frameon=False)
    return figure


def figure_png(figure: Figure, dpi: int = 110) -> bytes:
    """The figure as PNG bytes."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def figure_png_and_pixels(figure: Figure, dpi: int = 110) -> tuple[bytes, np.ndarray]:
    """The figure drawn once: PNG bytes and the same picture as an ``(H, W, 3)`` uint8 RGB array
    (what trackers take: tensorboard, wandb, mlflow, swanlab)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    figure.set_dpi(dpi)
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    rgb = np.ascontiguousarray(np.asarray(canvas.buffer_rgba())[..., :3])
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="png")
    return buffer.getvalue(), rgb
