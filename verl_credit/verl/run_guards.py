"""When a step's numbers say the run is no longer training what was asked for: too many failed
sessions, or an annotator that has been falling back for a window of steps.

:class:`RunGuards` reads the credit metrics of each step (those of
:func:`verl_credit.verl.credit_step.compute_credit_advantages`) and returns why the run must stop,
or ``None``:

* ``credit/failed_session_share > credit.session.max_failed_share`` -- the user simulator, the
  environment or the rollout server failed for that many of the step's sessions
  (:mod:`verl_credit.verl.session_failures`): always a stop;
* the fallback rate over the last ``credit.annotator.fallback_window`` steps (fallback sessions
  over all sessions of the window, ``credit/fallback_rate_window``) above
  ``credit.annotator.max_fallback_rate``: a loud warning every such step
  (``credit/fallback_limit_exceeded`` = 1), and a stop once the window is full if
  ``credit.annotator.stop_on_fallback`` is set. A dead or slow LLM annotator turns IAPO into
  rule-graph IAPO; ``credit/fallback_rate`` alone is easy to miss.

The trainer saves a checkpoint of the last trained step before it raises (``CreditTrainerSync``).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import MutableMapping

from verl_credit.verl.settings import AnnotatorSettings, SessionSettings

__all__ = ["RunGuards"]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))


class RunGuards:
    """The stop rules of one run; keeps the fallback window across steps."""

    def __init__(self, session: SessionSettings, annotator: AnnotatorSettings):
        self.session = session
        self.annotator = annotator
        self._window: deque[tuple[float, float]] = deque(maxlen=annotator.fallback_window)

    def check(self, metrics: MutableMapping[str, float], step: int) -> str | None:
        """Add ``credit/fallback_rate_window`` / ``credit/fallback_limit_exceeded`` to ``metrics``
        and return the reason to stop the run after step ``step`` (``None``: go on)."""
        failed = self._failed_sessions(metrics, step)
        fallback = self._fallback_rate(metrics, step)
        return failed or fallback

    def _failed_sessions(self, metrics: MutableMapping[str, float], step: int) -> str | None:
        share = float(metrics.get("credit/failed_session_share", 0.0))
        if share <= self.session.max_failed_share:
            return None
        failed = int(metrics.get("credit/failed_sessions", 0))
        kinds = ", ".join(
            f"{name.removeprefix('credit/failed_sessions_')} {int(value)}"
            for name, value in sorted(metrics.items())
            if name.startswith("credit/failed_sessions_") and value
        )
        return (
            f"step {step}: {failed} sessions ({share:.0%}) failed ({kinds}), more than "
            f"credit.session.max_failed_share={self.session.max_failed_share:g}: the user simulator, the environment "
            f"or the rollout server is down or too slow for credit.session.deadline. Check the endpoints "
            f"(docs/cluster.md), then resume from the last checkpoint (trainer.resume_mode=auto)"
        )

    def _fallback_rate(self, metrics: MutableMapping[str, float], step: int) -> str | None:
        if "credit/fallback_rate" not in metrics:
            return None
        sessions = float(metrics.get("credit/sessions", 0.0))
        self._window.append((float(metrics["credit/fallback_rate"]) * sessions, sessions))
        total = sum(count for _, count in self._window)
        rate = sum(fallbacks for fallbacks, _ in self._window) / total if total else 0.0
        metrics["credit/fallback_rate_window"] = rate
        exceeded = rate > self.annotator.max_fallback_rate
        metrics["credit/fallback_limit_exceeded"] = float(exceeded)
        if not exceeded:
            return None
        full = len(self._window) == self._window.maxlen
        message = (
            f"step {step}: {rate:.0%} of the sessions of the last {len(self._window)} step(s) got a fallback graph "
            f"(credit.annotator.fallback={self.annotator.fallback}), more than "
            f"credit.annotator.max_fallback_rate={self.annotator.max_fallback_rate:g}: this run is not training with "
            f"the {self.annotator.name} annotator's graphs. Check the annotator endpoints "
            f"(credit.annotator.base_urls) and credit/annotation_timeouts"
        )
        logger.warning("credit: WARNING %s", message)
        if self.annotator.stop_on_fallback and full:
            return message + " (credit.annotator.stop_on_fallback=true)"
        return None
