"""Pictures of routed credit (matplotlib), one self-contained HTML report, and the weakness report.

``load_credit_lines`` reads a credit JSONL; ``trajectory_figure`` / ``batch_figure`` draw;
``render_report`` writes the HTML with every picture embedded as a PNG ``data:`` URI
(``write_report_page``: the same page from pictures already drawn, as the trainer's live ones);
:mod:`verl_credit.report.weakness` aggregates call credit by role (``verl-credit weakness``).

Names are imported on first use, so ``verl_credit.report.weakness`` (and the records) load
without matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "batch_figure": "figures",
    "draw_trajectory": "figures",
    "plain_text": "figures",
    "trajectory_figure": "figures",
    "weight_color": "figures",
    "render_report": "html",
    "write_report_page": "html",
    "CreditLine": "records",
    "action_labels": "records",
    "load_credit_lines": "records",
    "parse_credit_line": "records",
    "compute_weakness_report": "weakness",
    "format_weakness_report": "weakness",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
