"""The credit pictures into verl's trackers: one small adapter per backend of ``trainer.logger``.

verl 0.9.1's trainer builds ``self.logger = Tracking(...)`` in ``fit()``; ``Tracking.logger`` maps
each configured backend to what verl logs scalars with (``verl/utils/tracking.py``):

==============  =====================================  ===========================================
backend         ``Tracking.logger[name]``              what gets logged here
==============  =====================================  ===========================================
tensorboard     ``_TensorboardAdapter`` (``.writer``:   images (``add_image``), ``w+``/``w-``
                torch's ``SummaryWriter``)             histograms, the action table as markdown text
wandb           the ``wandb`` module                   ``wandb.Image`` s, ``wandb.Histogram`` s,
                                                       a ``wandb.Table``
mlflow          ``_MlflowLoggingAdapter`` (no handle;  ``mlflow.log_image(key=, step=)``, the table
                the ``mlflow`` module's active run)    with ``mlflow.log_table``
swanlab         the ``swanlab`` module                 ``swanlab.Image`` s
console, file   ``LocalLogger`` / ``FileLogger``        nothing: the PNGs and ``step_N.html`` are in
                                                       the viz folder (a log line names the page)
==============  =====================================  ===========================================

Each adapter works in two phases: ``prepare`` (the viz worker thread: PNG encoding, media objects)
and ``commit`` (the trainer's thread: hand them to the tracker, naming the step the pictures were
drawn for).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from verl_credit.verl.viz import StepPictures

__all__ = [
    "BATCH_TAG",
    "ROLLOUT_TAG",
    "TABLE_COLUMNS",
    "TABLE_TAG",
    "W_MINUS_TAG",
    "W_PLUS_TAG",
    "MlflowSink",
    "SwanlabSink",
    "TensorboardSink",
    "TrackerSink",
    "WandbSink",
    "markdown_table",
    "tracker_sinks",
]


#: tracker names (tensorboard tags, wandb / mlflow / swanlab keys)
ROLLOUT_TAG = "credit_viz/rollout_{k}"
BATCH_TAG = "credit_viz/batch"
TABLE_TAG = "credit_viz/actions"
W_PLUS_TAG = "credit_viz/w_plus"
W_MINUS_TAG = "credit_viz/w_minus"
#: the action table's columns (:func:`verl_credit.verl.viz.action_rows`)
TABLE_COLUMNS: tuple[str, ...] = ("rollout", "action", "role", "weight", "advantage", "text")


class TrackerSink(Protocol):
    """One backend. :meth:`prepare` runs in the viz worker thread and does the heavy part (PNG
    encoding, media objects); :meth:`commit` runs on the trainer's thread and only hands the
    prepared data to the tracker at the step it was drawn for."""

    name: str
    #: the tracker drops a step older than its current one (wandb): log at most one step late
    ordered_steps: bool

    def prepare(self, pictures: StepPictures) -> Any: ...

    def commit(self, prepared: Any, step: int) -> None: ...

    def log(self, pictures: StepPictures) -> None: ...


def _images(pictures: StepPictures) -> list[tuple[str, Any, str]]:
    """``(tag, (H, W, 3) uint8 pixels, caption)`` of every picture of a step."""
    found = [(ROLLOUT_TAG.format(k=k), p.pixels, p.caption) for k, p in enumerate(pictures.rollouts)]
    found.append((BATCH_TAG, pictures.batch_pixels, f"w+ / w- over the step's {pictures.sessions} rollouts"))
    return found


def _histograms(pictures: StepPictures) -> list[tuple[str, Any]]:
    """``(tag, values)`` of ``w+`` and ``w-`` (an empty branch is left out: no histogram of nothing)."""
    pairs = ((W_PLUS_TAG, pictures.w_plus), (W_MINUS_TAG, pictures.w_minus))
    return [(tag, values) for tag, values in pairs if values.size]


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[Mapping[str, object]], columns: Sequence[str] = TABLE_COLUMNS) -> str:
    """The rows as a markdown table (tensorboard's text tab renders it)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


class _PrepareCommit:
    ordered_steps = False

    def log(self, pictures: StepPictures) -> None:
        """Both phases at once (one thread)."""
        self.commit(self.prepare(pictures), pictures.step)  # type: ignore[attr-defined]


class TensorboardSink(_PrepareCommit):
    """Summaries built with torch's own ``torch.utils.tensorboard.summary`` functions (what
    ``SummaryWriter.add_image`` / ``add_histogram`` / ``add_text`` call) in the worker; the commit
    adds them to the writer's event file."""

    name = "tensorboard"

    def __init__(self, writer: Any):
        self.writer = writer

    def prepare(self, pictures: StepPictures) -> list[Any]:
        from torch.utils.tensorboard.summary import histogram, image, text

        bins = getattr(self.writer, "default_bins", None) or "auto"  # SummaryWriter.add_histogram's default
        summaries = [image(tag, pixels, dataformats="HWC") for tag, pixels, _ in _images(pictures)]
        summaries += [histogram(tag, values, bins) for tag, values in _histograms(pictures)]
        if pictures.table:
            summaries.append(text(TABLE_TAG, markdown_table(pictures.table)))
        return summaries

    def commit(self, prepared: list[Any], step: int) -> None:
        file_writer = getattr(self.writer, "file_writer", None) or self.writer._get_file_writer()
        for summary in prepared:  # queued: the writer's own thread writes them (within its flush_secs)
            file_writer.add_summary(summary, step)


class WandbSink(_PrepareCommit):
    name = "wandb"
    ordered_steps = True

    def __init__(self, wandb: Any):
        self.wandb = wandb

    def prepare(self, pictures: StepPictures) -> dict[str, Any]:
        wandb = self.wandb
        data: dict[str, Any] = {tag: wandb.Image(pixels, caption=caption) for tag, pixels, caption in _images(pictures)}
        data.update({tag: wandb.Histogram(values) for tag, values in _histograms(pictures)})
        if pictures.table:
            data[TABLE_TAG] = wandb.Table(
                columns=list(TABLE_COLUMNS), data=[[row[c] for c in TABLE_COLUMNS] for row in pictures.table]
            )
        return data

    def commit(self, prepared: dict[str, Any], step: int) -> None:
        # the step verl logs the metrics at (wandb merges them; an older step than its current one
        # would be dropped, hence the trainer's thread and at most one step late)
        self.wandb.log(prepared, step=step)


class MlflowSink(_PrepareCommit):
    """mlflow's fluent API is not thread-safe (its docs): everything happens at the commit."""

    name = "mlflow"

    def __init__(self, mlflow: Any):
        self.mlflow = mlflow

    def prepare(self, pictures: StepPictures) -> StepPictures:
        return pictures

    def commit(self, prepared: StepPictures, step: int) -> None:
        for tag, pixels, _ in _images(prepared):
            self.mlflow.log_image(pixels, key=tag, step=step)
        if prepared.table:
            columns = {c: [row[c] for row in prepared.table] for c in TABLE_COLUMNS}
            self.mlflow.log_table(data=columns, artifact_file=f"credit_viz/step_{step}_actions.json")


class SwanlabSink(_PrepareCommit):
    name = "swanlab"
    ordered_steps = True  # its step axis is per key and increasing, as wandb's

    def __init__(self, swanlab: Any):
        self.swanlab = swanlab

    def prepare(self, pictures: StepPictures) -> dict[str, Any]:
        return {tag: self.swanlab.Image(pixels, caption=caption) for tag, pixels, caption in _images(pictures)}

    def commit(self, prepared: dict[str, Any], step: int) -> None:
        self.swanlab.log(prepared, step=step)


def tracker_sinks(tracking: Any) -> tuple[list[TrackerSink], list[str]]:
    """The sinks of the image-capable backends of a verl ``Tracking`` (``None``: none), and a
    problem line for each such backend that could not be reached."""
    backends = getattr(tracking, "logger", None)
    if not isinstance(backends, Mapping):
        return [], []
    sinks: list[TrackerSink] = []
    problems: list[str] = []
    if "tensorboard" in backends:
        writer = getattr(backends["tensorboard"], "writer", None)
        if writer is None:
            problems.append("the tensorboard backend has no SummaryWriter (.writer); no pictures there")
        else:
            sinks.append(TensorboardSink(writer))
    if "wandb" in backends:
        sinks.append(WandbSink(backends["wandb"]))
    if "mlflow" in backends:
        try:
            import mlflow
        except ImportError as exc:
            problems.append(f"mlflow is configured but cannot be imported ({exc}); no pictures there")
        else:
            sinks.append(MlflowSink(mlflow))
    if "swanlab" in backends:
        sinks.append(SwanlabSink(backends["swanlab"]))
    return sinks, problems
