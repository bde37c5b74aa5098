"""Pictures of the credit while it trains (``credit.viz.*``).

Every ``credit.viz.every_n_steps`` training steps the credit trainer hands its step record
(:func:`verl_credit.verl.step_record.step_record`) to :class:`CreditViz`, which, in one worker
thread (off the training critical path):

1. rebuilds the step's credit lines from the record (:func:`~verl_credit.verl.step_record.rebuild_step`);
2. picks ``credit.viz.rollouts`` rollouts (:func:`pick_rollouts`: a success and a failure of the
   same task where the step has one);
3. draws them with the report's own figures (weights per action, support and failed-use arcs,
   errors, reward and advantage in the title) and the batch plots of ``w+`` / ``w-``;
4. writes ``step_<N>_rollout_<k>.png``, ``step_<N>_batch.png`` and ``step_<N>.html`` (the
   ``verl-credit report`` page, with a table of the pictured actions) into the viz folder.

5. prepares the pictures for the image-capable backends of verl's ``Tracking``
   (:mod:`verl_credit.verl.viz_sinks`: images, ``w+``/``w-`` histograms and the action table where
   the backend has them; PNG encoding and media objects happen here).

Right before verl logs a step's metrics (the trainer's ``_consume_sync_metrics``), :meth:`CreditViz.drain`
hands every finished drawing to the trackers on the trainer's thread, at the step it was drawn for.
When a backend drops steps older than its current one (wandb, swanlab), a drawing from an earlier
step is waited for, so it is logged at most one step late; for the others (tensorboard, mlflow,
the files) it is logged whenever it is done; at the last training step every drawing is waited for.

Nothing here fails a step: an error while drawing or logging is logged with its traceback and
counted in ``credit/viz_errors`` (cumulative). ``credit/viz_render_seconds`` is the worker's time
for the last logged drawing; ``credit/viz_wait_seconds`` is what viz cost the trainer's own thread
this step (handing the record over, waiting, the tracker calls).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verl_credit.report.credit_input import CreditLine
from verl_credit.verl.settings import VizSettings
from verl_credit.verl.viz_sinks import (
    BATCH_TAG,
    ROLLOUT_TAG,
    TABLE_COLUMNS,
    TABLE_TAG,
    W_MINUS_TAG,
    W_PLUS_TAG,
    tracker_sinks,
)

__all__ = [
    "BATCH_TAG",
    "ROLLOUT_TAG",
    "TABLE_COLUMNS",
    "TABLE_TAG",
    "WAIT_LIMIT_S",
    "W_MINUS_TAG",
    "W_PLUS_TAG",
    "CreditViz",
    "RolloutPicture",
    "StepPictures",
    "action_rows",
    "default_viz_dir",
    "pick_rollouts",
    "render_step",
]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

#: longest wait for one drawing (seconds) before it is dropped and counted as an error
WAIT_LIMIT_S = 300.0
#: words of an action's text in the table
TABLE_WORDS = 8


def default_viz_dir(project_name: str, experiment_name: str) -> str:
    """``credit_viz/<project>/<experiment>`` under the working directory (verl's ``tensorboard_log`` shape)."""
    return os.path.abspath(os.path.join("credit_viz", str(project_name), str(experiment_name)))


# -- which rollouts ------------------------------------------------------------------------------


def _interest(line: CreditLine) -> tuple[int, int]:
    """More errors, then more edges, first (the report's order)."""
    graph = line.graph
    return (-(len(graph.errors) if graph else 0), -(len(graph.edges) if graph else 0))


def pick_rollouts(lines: Sequence[CreditLine], count: int) -> list[CreditLine]:
    """Up to ``count`` rollouts to picture, deterministically.

    First, one pair per task (``uid``, in order of first appearance) whose rewards differ: its
    success (highest reward) then its failure (lowest), ties broken by more errors, then more
    edges, then batch order. When no such pair is left, the rest in the report's order (positive
    and negative advantages alternating, :func:`verl_credit.report.html.pick_trajectories`).
    """
    from verl_credit.report.html import pick_trajectories

    if count <= 0:
        return []
    groups: dict[str, list[CreditLine]] = {}
    for line in lines:
        groups.setdefault(line.uid, []).append(line)
    picked: list[CreditLine] = []
    for members in groups.values():
        rewards = [line.reward for line in members]
        if max(rewards) == min(rewards):
            continue
        ranked = sorted(members, key=lambda line: (-line.reward, _interest(line)))
        success = ranked[0]
        failure = sorted(members, key=lambda line: (line.reward, _interest(line)))[0]
        for line in (success, failure):
            if len(picked) < count:
                picked.append(line)
        if len(picked) >= count:
            return picked
    chosen = {id(line) for line in picked}
    rest = [line for line in lines if id(line) not in chosen]
    return picked + pick_trajectories(rest, count - len(picked))


def _first_words(text: str, words: int = TABLE_WORDS) -> str:
    parts = text.split()
    return " ".join(parts[:words]) + (" …" if len(parts) > words else "")


def action_rows(lines: Sequence[CreditLine]) -> list[dict[str, object]]:
    """One row per action of ``lines`` (:data:`TABLE_COLUMNS`): the role (call credit) or the
    action's kind (``tool:<name>`` / ``text``), its weight, advantage and first words."""
    rows: list[dict[str, object]] = []
    for line in lines:
        for index in range(line.num_actions):
            role = line.roles[index] or (line.kinds[index] if line.kinds else "")
            text = line.labels[index] if line.labels else ""
            rows.append(
                {
                    "rollout": line.id,
                    "action": index,
                    "role": role,
                    "weight": round(float(line.weights[index]), 4),
                    "advantage": round(float(line.advantages[index]), 4),
                    "text": _first_words(text),
                }
            )
    return rows


# -- drawing -------------------------------------------------------------------------------------


@dataclass
class RolloutPicture:
    line: CreditLine
    png: bytes
    pixels: np.ndarray  # (H, W, 3) uint8
    caption: str


@dataclass
class StepPictures:
    """Everything drawn for one step (what the trackers log)."""

    step: int
    estimator: str
    sessions: int
    rollouts: list[RolloutPicture]
    batch_png: bytes
    batch_pixels: np.ndarray
    table: list[dict[str, object]]
    w_plus: np.ndarray
    w_minus: np.ndarray
    max_abs_diff: float  # rebuilt vs the trainer's token advantages
    page: Path | None = None
    files: list[Path] = field(default_factory=list)
    seconds: float = 0.0


def _caption(line: CreditLine) -> str:
    return (
        f"{line.id} (task {line.uid}): reward {line.reward:g}, trajectory advantage "
        f"{line.trajectory_advantage:+.3f}{' [uniform fallback]' if line.fallback else ''}"
    )


def render_step(step: int, record: Mapping[str, Any], rollouts: int, folder: str | os.PathLike[str]) -> StepPictures:
    """Draw one step record: ``rollouts`` rollout pictures, the batch plots, the page and the PNGs
    in ``folder``. Runs in the viz worker thread; raises on any error (counted by the caller)."""
    from verl_credit.report.figures import batch_figure, branch_weights, figure_png_and_pixels, trajectory_figure
    from verl_credit.report.html import TrajectoryPicture, write_report_page
    from verl_credit.verl.step_record import rebuild_step

    started = time.perf_counter()
    rebuilt = rebuild_step(record)
    lines = rebuilt.lines
    estimator = lines[0].estimator if lines else str(record.get("estimator", "?"))
    picked = pick_rollouts(lines, rollouts)
    pictures = []
    for line in picked:
        figure, _ = trajectory_figure(line)
        png, pixels = figure_png_and_pixels(figure)
        pictures.append(RolloutPicture(line, png, pixels, _caption(line)))
    batch_png, batch_pixels = figure_png_and_pixels(batch_figure({estimator: lines}))
    table = action_rows(picked)
    result = StepPictures(
        step=int(step),
        estimator=estimator,
        sessions=len(lines),
        rollouts=pictures,
        batch_png=batch_png,
        batch_pixels=batch_pixels,
        table=table,
        w_plus=branch_weights(lines, True),
        w_minus=branch_weights(lines, False),
        max_abs_diff=rebuilt.max_abs_diff,
    )
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    for k, picture in enumerate(pictures):
        path = target / f"step_{int(step)}_rollout_{k}.png"
        path.write_bytes(picture.png)
        result.files.append(path)
    batch_path = target / f"step_{int(step)}_batch.png"
    batch_path.write_bytes(batch_png)
    result.files.append(batch_path)
    if lines:
        agreement = (
            f"rebuilt advantages match the trainer's (max |diff| {rebuilt.max_abs_diff:.2g})"
            if rebuilt.agrees
            else "; ".join(rebuilt.notes) or "the trainer's advantages were not recorded"
        )
        intro = (
            f"Training step {int(step)}: {len(pictures)} of {len(lines)} rollouts (a success and a failure of "
            f"the same task where the step has one); the batch plots use all of them. {agreement}."
        )
        result.page = write_report_page(
            lines,
            target / f"step_{int(step)}.html",
            title=f"credit at step {int(step)} ({estimator})",
            batch_png=batch_png,
            pictures=[TrajectoryPicture(p.line, p.png) for p in pictures],
            intro=intro,
            action_rows=table,
        )
        result.files.append(result.page)
    result.seconds = time.perf_counter() - started
    return result


# -- the trainer's side --------------------------------------------------------------------------

Render = Callable[[int, Mapping[str, Any], int, str], StepPictures]


@dataclass
class _Prepared:
    """A drawing and, per tracker sink, its prepared data or the error preparing it."""

    pictures: StepPictures
    sinks: list[tuple[Any, Any, BaseException | None]]


@dataclass
class _Job:
    step: int
    future: Future
    ordered: bool = False  # a sink needs it logged before a later step's metrics (wandb)


class CreditViz:
    """Schedules the drawings of :func:`render_step` on one worker thread and logs the finished ones
    (see the module doc). ``render`` is injectable for tests."""

    def __init__(self, settings: VizSettings, folder: str | os.PathLike[str], render: Render = render_step):
        self.settings = settings
        self.folder = os.fspath(folder)
        self._render = render
        self._executor: ThreadPoolExecutor | None = None
        self._jobs: list[_Job] = []
        self._sinks: tuple[int, list[Any]] | None = None  # (id of the Tracking, its sinks)
        self._trainer_seconds = 0.0  # this step's cost on the trainer's thread so far
        self.errors = 0
        self.logged: list[int] = []  # steps whose pictures were handed to the trackers
        self.last_render_seconds = math.nan

    @property
    def enabled(self) -> bool:
        return self.settings.every_n_steps > 0

    def due(self, step: int) -> bool:
        """Whether training step ``step`` is drawn (``step % every_n_steps == 0``)."""
        every = self.settings.every_n_steps
        return every > 0 and int(step) > 0 and int(step) % every == 0

    def submit(
        self, step: int, record: Mapping[str, Any] | Callable[[], Mapping[str, Any]], tracking: Any = None
    ) -> None:
        """Hand one step record to the worker thread, which draws it and prepares it for the
        image-capable backends of ``tracking`` (verl's ``Tracking``; ``None``: files only).
        ``record`` may be a function that builds it: it is called here, on the trainer's thread,
        and a failure to build it is counted like a failure to draw. Returns at once; never raises."""
        started = time.perf_counter()
        try:
            if callable(record):
                record = record()
            sinks = self._tracker_sinks(tracking)
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="credit-viz")
            future = self._executor.submit(self._draw, int(step), record, sinks)
            self._jobs.append(_Job(int(step), future, any(getattr(sink, "ordered_steps", True) for sink in sinks)))
        except Exception:
            self.errors += 1
            logger.warning(
                "credit viz: could not start drawing step %s (counted in credit/viz_errors)", step, exc_info=True
            )
        self._trainer_seconds += time.perf_counter() - started

    def drain(self, step: int, final: bool = False) -> dict[str, float]:
        """Hand every finished drawing to the trackers (waiting for those of earlier steps when a
        backend needs its steps in order; ``final``: for all); returns this step's ``credit/viz_*``
        metrics (empty when viz is off). Never raises."""
        if not self.enabled and not self._jobs:
            return {}
        started = time.perf_counter()
        try:
            waiting: list[_Job] = []
            for job in self._jobs:
                must_wait = final or (job.ordered and job.step < int(step))
                if not must_wait and not job.future.done():
                    waiting.append(job)
                    continue
                prepared = self._result(job)
                if prepared is not None:
                    self._commit(prepared)
            self._jobs = waiting
            if final:
                self.close()
        except Exception:  # a bug here must not fail the step either
            self.errors += 1
            logger.warning("credit viz: draining failed (counted in credit/viz_errors)", exc_info=True)
        metrics = {
            "credit/viz_errors": float(self.errors),
            "credit/viz_wait_seconds": self._trainer_seconds + time.perf_counter() - started,
        }
        if not math.isnan(self.last_render_seconds):
            metrics["credit/viz_render_seconds"] = self.last_render_seconds
        self._trainer_seconds = 0.0
        return metrics

    def close(self) -> None:
        """Stop the worker thread (after the drawing it is on, if any)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _tracker_sinks(self, tracking: Any) -> list[Any]:
        if self._sinks is None or self._sinks[0] != id(tracking):
            sinks, problems = tracker_sinks(tracking)
            for problem in problems:
                self.errors += 1
                logger.warning("credit viz: %s (counted in credit/viz_errors)", problem)
            self._sinks = (id(tracking), sinks)
        return self._sinks[1]

    def _draw(self, step: int, record: Mapping[str, Any], sinks: Sequence[Any]) -> _Prepared:
        """The worker's job: draw, then prepare each sink's data (an error there is kept for the
        trainer's thread to count: the other sinks still get the step)."""
        started = time.perf_counter()
        pictures = self._render(step, record, self.settings.rollouts, self.folder)
        prepared = []
        for sink in sinks:
            try:
                prepared.append((sink, sink.prepare(pictures), None))
            except Exception as exc:
                prepared.append((sink, None, exc))
        pictures.seconds = time.perf_counter() - started
        return _Prepared(pictures, prepared)

    def _result(self, job: _Job) -> _Prepared | None:
        try:
            return job.future.result(timeout=WAIT_LIMIT_S)
        except FutureTimeout:
            self.errors += 1
            logger.warning(
                "credit viz: drawing step %d took over %.0f s; dropped (counted in credit/viz_errors)",
                job.step,
                WAIT_LIMIT_S,
            )
        except Exception:
            self.errors += 1
            logger.warning("credit viz: drawing step %d failed (counted in credit/viz_errors)", job.step, exc_info=True)
        return None

    def _commit(self, prepared: _Prepared) -> None:
        pictures = prepared.pictures
        for sink, data, error in prepared.sinks:
            try:
                if error is not None:
                    raise error
                sink.commit(data, pictures.step)
            except Exception:
                self.errors += 1
                logger.warning(
                    "credit viz: logging step %d to %s failed (counted in credit/viz_errors)",
                    pictures.step,
                    sink.name,
                    exc_info=True,
                )
        self.logged.append(pictures.step)
        self.last_render_seconds = pictures.seconds
        logger.info(
            "credit viz: step %d: %d of %d rollouts drawn in %.2f s -> %s",
            pictures.step,
            len(pictures.rollouts),
            pictures.sessions,
            pictures.seconds,
            pictures.page or self.folder,
        )
