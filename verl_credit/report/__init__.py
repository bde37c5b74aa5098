"""Pictures of routed credit (matplotlib) and one self-contained HTML report.

``load_credit_lines`` reads a credit JSONL; ``trajectory_figure`` / ``batch_figure`` draw;
``render_report`` writes the HTML with every picture embedded as a PNG ``data:`` URI.
"""

from verl_credit.report.figures import batch_figure, draw_trajectory, trajectory_figure, weight_color
from verl_credit.report.html import render_report
from verl_credit.report.records import CreditLine, action_labels, load_credit_lines, parse_credit_line

__all__ = [
    "CreditLine",
    "action_labels",
    "batch_figure",
    "draw_trajectory",
    "load_credit_lines",
    "parse_credit_line",
    "render_report",
    "trajectory_figure",
    "weight_color",
]
