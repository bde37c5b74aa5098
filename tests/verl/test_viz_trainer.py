"""The credit trainer's viz hook as verl's ``fit()`` drives it: each step ``_compute_advantage``
hands the step record to ``credit_viz``, ``_consume_sync_metrics`` (called by verl right before it
logs the step) logs the finished pictures through ``self.logger`` -- verl's own ``Tracking`` with
its console and tensorboard backends -- and then verl logs the step's metrics. The event file is
read back with tensorboard's own reader. The records are real step records
(:mod:`verl_credit.verl.viz_sample`)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from omegaconf import OmegaConf

from verl_credit.config import CreditConfig
from verl_credit.verl.settings import CreditSettings, VizSettings
from verl_credit.verl.viz import BATCH_TAG, ROLLOUT_TAG, W_MINUS_TAG, W_PLUS_TAG
from verl_credit.verl.viz_sample import sample_step_record

#: slow: verl's trainer and Tracking
pytestmark = pytest.mark.slow

STEPS = 2


def _trainer(tmp_path: Path, tracking: Any, viz: VizSettings):
    """A ``CreditTrainerSync`` with what these methods read (its ``__init__`` starts verl's workers)."""
    from verl_credit.verl.trainer import CreditTrainerSync

    trainer = CreditTrainerSync.__new__(CreditTrainerSync)
    trainer.config = OmegaConf.create({"trainer": {"project_name": "proj", "experiment_name": "exp"}})
    trainer._credit_settings = CreditSettings(credit=CreditConfig(estimator="iapo"), viz=viz)
    trainer.total_training_steps = STEPS
    trainer.logger = tracking
    return trainer


def _fit(trainer: Any, records: list[dict[str, Any]]) -> list[dict[str, float]]:
    """verl's per-step order: the advantage step (the trainer submits when due), the sync metrics,
    then ``self.logger.log`` of the step's metrics (when the logger is a real ``Tracking``)."""
    logged = []
    for step, record in enumerate(records, start=1):
        trainer.global_steps = step
        if trainer.credit_viz.due(step):
            trainer.credit_viz.submit(step, dict(record), trainer.logger)  # as _compute_advantage does
        metrics = trainer._consume_sync_metrics()
        if hasattr(trainer.logger, "log"):
            trainer.logger.log(data={"actor/pg_loss": 0.5, **metrics}, step=step)
        logged.append(metrics)
    return logged


def test_the_trainer_logs_each_drawn_step_through_verls_tracking(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from verl.utils.tracking import Tracking

    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    tracking = Tracking("proj", "exp", default_backend=["console", "tensorboard"])
    trainer = _trainer(tmp_path, tracking, VizSettings(every_n_steps=1, rollouts=4, dir=str(tmp_path / "viz")))
    records = [sample_step_record(4, 8, estimator="iapo", seed=seed) for seed in range(STEPS)]
    try:
        metrics = _fit(trainer, records)
    finally:
        tracking.finish()

    assert [m["credit/viz_errors"] for m in metrics] == [0.0] * STEPS
    assert all(m["credit/viz_wait_seconds"] >= 0 for m in metrics)
    assert metrics[-1]["credit/viz_render_seconds"] > 0
    assert trainer.credit_viz.logged == [1, 2]  # the last step waited for every drawing
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0, "histograms": 0})
    events.Reload()
    for tag in [*(ROLLOUT_TAG.format(k=k) for k in range(4)), BATCH_TAG]:
        assert [image.step for image in events.Images(tag)] == [1, 2], tag  # step 1's may come after step 1's scalars
    for tag in (W_PLUS_TAG, W_MINUS_TAG):
        assert [h.step for h in events.Histograms(tag)] == [1, 2], tag
    assert [s.value for s in events.Scalars("credit/viz_errors")] == [0.0, 0.0]  # verl's scalars, same file
    pages = sorted(p.name for p in (tmp_path / "viz").glob("*.html"))
    assert pages == ["step_1.html", "step_2.html"]


def test_viz_off_logs_nothing_and_adds_no_metric(tmp_path):
    tracking = SimpleNamespace(logger={"console": object()})
    trainer = _trainer(tmp_path, tracking, VizSettings(every_n_steps=0, dir=str(tmp_path / "viz")))
    metrics = _fit(trainer, [{}] * STEPS)  # never due: the records are never read
    assert metrics == [{}] * STEPS and not (tmp_path / "viz").exists()


def test_the_default_folder_is_credit_viz_project_experiment_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer = _trainer(tmp_path, None, VizSettings())
    assert trainer.credit_viz.folder == os.path.join(str(tmp_path), "credit_viz", "proj", "exp")
    assert [s for s in range(1, 31) if trainer.credit_viz.due(s)] == [10, 20, 30]


@pytest.mark.parametrize("broken", ["record", "tracker"])
def test_a_broken_record_or_tracker_never_fails_the_step(tmp_path, broken):
    class Exploding:
        def __getattr__(self, name):
            raise RuntimeError(f"tracker broke at {name}")

    tracking = SimpleNamespace(logger={"tensorboard": SimpleNamespace(writer=Exploding())})
    trainer = _trainer(tmp_path, tracking, VizSettings(every_n_steps=1, dir=str(tmp_path / "viz")))
    record = {"keys": ["x"]} if broken == "record" else sample_step_record(2, 2, seed=3)
    metrics = _fit(trainer, [record, record])
    # both steps' failures counted (step 1's when it finished: at step 1 or, at the latest, step 2)
    assert metrics[0]["credit/viz_errors"] in (0.0, 1.0) and metrics[1]["credit/viz_errors"] == 2.0
    assert trainer.credit_viz.logged == ([] if broken == "record" else [1, 2])
