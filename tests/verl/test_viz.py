"""Live credit pictures (``credit.viz``): which rollouts, the figure from a real step record, the
tracker adapters (tensorboard read back with tensorboard's own reader), errors counted, never raised.

The step records are real: the service world's scripted rollouts, annotated by the rule annotator
as the agent loop does, through the trainer's own ``compute_credit_advantages`` and
``step_record`` (:mod:`verl_credit.verl.viz_sample`).
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from matplotlib.image import imread

from verl_credit.report.credit_input import parse_credit_line
from verl_credit.report.figures import branch_weights, trajectory_figure
from verl_credit.verl.settings import VizSettings, load_settings
from verl_credit.verl.step_record import rebuild_step
from verl_credit.verl.viz import (
    BATCH_TAG,
    ROLLOUT_TAG,
    TABLE_TAG,
    W_MINUS_TAG,
    W_PLUS_TAG,
    CreditViz,
    action_rows,
    pick_rollouts,
    render_step,
)
from verl_credit.verl.viz_sample import sample_step_record
from verl_credit.verl.viz_sinks import MlflowSink, SwanlabSink, TensorboardSink, WandbSink, tracker_sinks


@pytest.fixture(scope="module")
def iapo_record() -> dict[str, Any]:
    return sample_step_record(4, 8, estimator="iapo", seed=0)


@pytest.fixture(scope="module")
def pictures(iapo_record, tmp_path_factory):
    return render_step(5, iapo_record, 4, tmp_path_factory.mktemp("viz"))


def _line(line_id: str, uid: str, reward: float, advantage: float, errors: int = 0, edges: int = 0):
    graph = {
        "num_actions": 3,
        "errors": [{"action": 0, "kind": "tool_error", "evidence": "x"}] * errors,
        "direct_user_inputs": {},
        "edges": [{"src": 0, "dst": 2, "sign": "+", "type": "input", "unit": "u"}] * edges,
    }
    return parse_credit_line(
        {
            "id": line_id,
            "uid": uid,
            "reward": reward,
            "estimator": "iapo",
            "trajectory_advantage": advantage,
            "actions": [{"index": i, "length": 2, "weight": 1.0, "advantage": advantage} for i in range(3)],
            "graph": graph,
        }
    )


# -- choosing the rollouts -----------------------------------------------------------------------


def test_pick_rollouts_takes_a_success_and_a_failure_of_one_task_first():
    lines = [
        _line("a0", "A", 1.0, 0.0),  # task A: all succeed, no pair
        _line("a1", "A", 1.0, 0.0),
        _line("b0", "B", 0.0, -1.0),
        _line("b1", "B", 1.0, 0.7),
        _line("b2", "B", 0.5, 0.3),
        _line("c0", "C", 1.0, 0.5, edges=1),
        _line("c1", "C", 1.0, 0.5, errors=1),  # the tie among C's successes: more errors first
        _line("c2", "C", 0.0, -1.0),
    ]
    assert [ln.id for ln in pick_rollouts(lines, 4)] == ["b1", "b0", "c1", "c2"]
    assert [ln.id for ln in pick_rollouts(lines, 3)] == ["b1", "b0", "c1"]
    # past the pairs: the report's order of the rest (A > 0 first, more edges first; A = 0 last)
    assert [ln.id for ln in pick_rollouts(lines, 7)] == ["b1", "b0", "c1", "c2", "c0", "b2", "a0"]
    assert pick_rollouts(lines, 0) == []
    uniform = [_line("u0", "U", 1.0, 0.0), _line("u1", "U", 1.0, 0.0)]
    assert [ln.id for ln in pick_rollouts(uniform, 4)] == ["u0", "u1"]


def test_action_rows_give_role_or_kind_weight_advantage_and_first_words(iapo_record):
    line = rebuild_step(iapo_record).lines[0]
    rows = action_rows([line])
    assert [row["action"] for row in rows] == list(range(line.num_actions))
    assert all(row["rollout"] == line.id for row in rows)
    assert [row["role"] for row in rows] == line.kinds  # iapo: no call roles, so the action kinds
    assert any(str(row["role"]).startswith("tool:") for row in rows) and "text" in [row["role"] for row in rows]
    assert [row["weight"] for row in rows] == [round(w, 4) for w in line.weights]
    assert [row["advantage"] for row in rows] == [round(a, 4) for a in line.advantages]
    assert all(len(str(row["text"]).split()) <= 9 for row in rows)  # 8 words and the ellipsis


# -- the record read back ------------------------------------------------------------------------


def _span_values(record: dict[str, Any], row: int) -> dict[int, float]:
    """The trainer's token advantage of each action of a (merged) row, read from the record."""
    payload = record["payloads"][row]
    values = {}
    for action, start, end in payload["spans"]:
        tokens = record["trainer_advantages"][row, start:end]
        assert torch.all(tokens == tokens[0])  # one value per action
        values[action] = float(tokens[0])
    return values


@pytest.mark.parametrize("estimator", ["iapo", "call_credit", "grpo", "gigpo"])
def test_rebuilt_lines_are_what_the_trainer_wrote(estimator):
    record = sample_step_record(3, 4, estimator=estimator, seed=1)
    rebuilt = rebuild_step(record)
    assert rebuilt.max_abs_diff == 0.0 and rebuilt.agrees and rebuilt.notes == []
    assert [ln.id for ln in rebuilt.lines] == [k.rsplit("_", 1)[0] for k in record["keys"]]
    moved = 0
    for row, line in enumerate(rebuilt.lines):
        payload = record["payloads"][row]
        assert line.uid == record["uids"][row] and line.estimator == estimator
        assert line.reward == pytest.approx(float(record["token_level_rewards"][row].sum()))
        assert line.num_actions == payload["num_actions"] == len(line.labels) == len(line.kinds)
        for action, value in _span_values(record, row).items():
            assert line.advantages[action] == pytest.approx(value, rel=1e-6, abs=1e-7)
        moved += sum(abs(w - 1.0) > 1e-6 for w in line.weights)
        if estimator == "iapo":  # the graph the agent loop stored is the one drawn
            assert line.graph is not None and len(line.graph.edges) == len(payload["graph"]["edges"])
        if estimator == "call_credit":
            assert line.call_graph is not None and line.roles == list(line.call_graph.reported_roles())
    if estimator in ("iapo", "call_credit"):
        assert moved > 0  # the pictures have something to show


def test_a_session_without_its_graph_is_drawn_without_edges_and_said(iapo_record):
    record = dict(iapo_record)
    record["payloads"] = [dict(p) for p in iapo_record["payloads"]]
    written = rebuild_step(iapo_record).lines
    for row in range(len(record["payloads"])):  # drop the graph of a success whose edges moved its weights
        if written[row].trajectory_advantage > 0 and record["payloads"][row]["graph"]["edges"]:
            break
    del record["payloads"][row]["graph"]
    rebuilt = rebuild_step(record)
    line = rebuilt.lines[row]
    assert line.graph is None and "not recorded" in line.notes[0]
    assert rebuilt.not_recorded == 1 and "uniform graph" in rebuilt.notes[0]
    # its advantages here (uniform graph) are not the ones the trainer wrote (the stored graph)
    assert rebuilt.max_abs_diff > 1e-6 and not rebuilt.agrees


def test_a_record_without_its_fields_is_refused_by_name():
    with pytest.raises(ValueError, match=r"missing .*credit_config"):
        rebuild_step({"keys": [], "tags": [], "uids": [], "payloads": [], "rollout_mask": torch.zeros(0, 1)})


# -- the figure ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_render_step_draws_a_success_and_a_failure_of_one_task(iapo_record, pictures):
    lines = rebuild_step(iapo_record).lines
    picked = [p.line for p in pictures.rollouts]
    assert len(picked) == 4 and pictures.sessions == len(lines) == 32
    assert picked[0].uid == picked[1].uid and picked[0].reward > picked[1].reward
    for picture in pictures.rollouts:
        decoded = imread(io.BytesIO(picture.png))
        assert picture.pixels.dtype == np.uint8 and picture.pixels.shape == (*decoded.shape[:2], 3)
        assert picture.pixels.std() > 10  # not a blank picture
        assert picture.line.id in picture.caption and f"{picture.line.reward:g}" in picture.caption
        # the report's figure of the same line: arcs for the stored graph's edges, its errors marked
        _, drawing = trajectory_figure(picture.line)
        graph = picture.line.graph
        assert drawing.support_arcs == sum(e.sign == "+" for e in graph.edges)
        assert drawing.failed_arcs == sum(e.sign == "-" for e in graph.edges)
        assert drawing.error_marks == sorted({m.action for m in graph.errors})
    assert np.array_equal(pictures.w_plus, branch_weights(lines, True)) and pictures.w_plus.size
    assert np.array_equal(pictures.w_minus, branch_weights(lines, False)) and pictures.w_minus.size
    assert len(pictures.table) == sum(line.num_actions for line in picked)


@pytest.mark.slow
def test_render_step_writes_the_pngs_and_the_report_page(pictures):
    names = sorted(path.name for path in pictures.files)
    assert names == sorted([*(f"step_5_rollout_{k}.png" for k in range(4)), "step_5_batch.png", "step_5.html"])
    assert all(path.read_bytes()[:4] == b"\x89PNG" for path in pictures.files if path.suffix == ".png")
    page = pictures.page.read_text()
    assert len(re.findall(r'src="data:image/png;base64,', page)) == 5  # batch plots + 4 rollouts
    assert "Actions pictured" in page and pictures.rollouts[0].line.id in page
    assert "match the trainer" in page  # the rebuild agreed with the advantages the step wrote


# -- the trackers --------------------------------------------------------------------------------


def _events(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder), size_guidance={"images": 0, "histograms": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


@pytest.mark.slow
def test_tensorboard_sink_writes_images_histograms_and_the_table(pictures, tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    TensorboardSink(writer).log(pictures)
    writer.close()
    events = _events(tmp_path)
    tags = events.Tags()
    assert sorted(tags["images"]) == sorted([*(ROLLOUT_TAG.format(k=k) for k in range(4)), BATCH_TAG])
    for k, picture in enumerate(pictures.rollouts):
        (image,) = events.Images(ROLLOUT_TAG.format(k=k))
        assert image.step == 5 and (image.height, image.width) == picture.pixels.shape[:2]
        decoded = np.round(imread(io.BytesIO(image.encoded_image_string))[..., :3] * 255).astype(np.uint8)
        assert np.array_equal(decoded, picture.pixels)  # the very picture, losslessly
    for tag, values in ((W_PLUS_TAG, pictures.w_plus), (W_MINUS_TAG, pictures.w_minus)):
        (histogram,) = events.Histograms(tag)
        assert histogram.step == 5 and histogram.histogram_value.num == values.size
        assert histogram.histogram_value.min == pytest.approx(values.min())
        assert histogram.histogram_value.max == pytest.approx(values.max())
    (text,) = events.Tensors(f"{TABLE_TAG}/text_summary")
    table = text.tensor_proto.string_val[0].decode()
    assert table.startswith("| rollout | action | role | weight | advantage | text |")
    assert table.count("\n") == len(pictures.table) + 1 and pictures.rollouts[0].line.id in table


@pytest.mark.slow
def test_wandb_sink_builds_real_wandb_media_at_the_step(pictures):
    import wandb

    logged: list[tuple[dict[str, Any], int]] = []
    module = SimpleNamespace(
        Image=wandb.Image, Histogram=wandb.Histogram, Table=wandb.Table, log=lambda d, step: logged.append((d, step))
    )
    WandbSink(module).log(pictures)
    ((data, step),) = logged
    assert step == 5
    image = data[ROLLOUT_TAG.format(k=0)]
    assert isinstance(image, wandb.Image) and image.image.size == pictures.rollouts[0].pixels.shape[1::-1]
    assert isinstance(data[BATCH_TAG], wandb.Image)
    assert sum(data[W_PLUS_TAG].histogram) == pictures.w_plus.size
    assert data[TABLE_TAG].columns[:4] == ["rollout", "action", "role", "weight"]
    assert len(data[TABLE_TAG].data) == len(pictures.table)


@pytest.mark.slow
def test_mlflow_and_swanlab_sinks_log_every_picture_at_the_step(pictures):
    calls: list[tuple[str, Any, dict[str, Any]]] = []
    mlflow = SimpleNamespace(
        log_image=lambda image, **kw: calls.append(("image", image, kw)),
        log_table=lambda **kw: calls.append(("table", None, kw)),
    )
    MlflowSink(mlflow).log(pictures)
    images = [c for c in calls if c[0] == "image"]
    assert [c[2] for c in images] == [
        *({"key": ROLLOUT_TAG.format(k=k), "step": 5} for k in range(4)),
        {"key": BATCH_TAG, "step": 5},
    ]
    (table,) = [c for c in calls if c[0] == "table"]
    assert table[2]["artifact_file"] == "credit_viz/step_5_actions.json"
    assert len(table[2]["data"]["weight"]) == len(pictures.table)

    swan: list[tuple[dict[str, Any], int]] = []
    swanlab = SimpleNamespace(
        Image=lambda pixels, caption: ("image", pixels.shape, caption), log=lambda d, step: swan.append((d, step))
    )
    SwanlabSink(swanlab).log(pictures)
    ((data, step),) = swan
    assert step == 5 and set(data) == {*(ROLLOUT_TAG.format(k=k) for k in range(4)), BATCH_TAG}


def test_tracker_sinks_follow_the_configured_backends():
    writer = object()
    tracking = SimpleNamespace(
        logger={"console": object(), "file": object(), "tensorboard": SimpleNamespace(writer=writer), "wandb": "w"}
    )
    sinks, problems = tracker_sinks(tracking)
    assert [s.name for s in sinks] == ["tensorboard", "wandb"] and problems == []
    assert sinks[0].writer is writer
    assert tracker_sinks(None) == ([], [])
    assert tracker_sinks(SimpleNamespace(logger={"console": object()})) == ([], [])
    _, problems = tracker_sinks(SimpleNamespace(logger={"tensorboard": object()}))
    assert "SummaryWriter" in problems[0]


# -- scheduling, errors --------------------------------------------------------------------------


def test_due_follows_every_n_steps_and_zero_is_off(tmp_path):
    viz = CreditViz(VizSettings(every_n_steps=3), tmp_path)
    assert [s for s in range(0, 10) if viz.due(s)] == [3, 6, 9]
    off = CreditViz(VizSettings(every_n_steps=0), tmp_path)
    assert not any(off.due(s) for s in range(10)) and off.drain(1) == {}


@pytest.mark.slow
def test_drawing_and_logging_errors_are_counted_never_raised(iapo_record, tmp_path):
    def broken(step, record, rollouts, folder):
        raise RuntimeError("matplotlib exploded")

    viz = CreditViz(VizSettings(every_n_steps=1), tmp_path, render=broken)
    viz.submit(1, iapo_record)
    metrics = viz.drain(1, final=True)
    assert metrics["credit/viz_errors"] == 1.0 and viz.logged == []

    class BrokenFileWriter:
        def add_summary(self, *args, **kwargs):
            raise OSError("disk full")

    class BrokenWriter:
        default_bins = "auto"
        file_writer = BrokenFileWriter()

    logged: list[int] = []
    tracking = SimpleNamespace(
        logger={
            "tensorboard": SimpleNamespace(writer=BrokenWriter()),
            "wandb": SimpleNamespace(
                Image=lambda *a, **k: None,
                Histogram=lambda *a, **k: None,
                Table=lambda *a, **k: None,
                log=lambda data, step: logged.append(step),
            ),
        }
    )
    viz = CreditViz(VizSettings(every_n_steps=1, rollouts=2), tmp_path)
    viz.submit(2, iapo_record, tracking)
    metrics = viz.drain(2, final=True)
    assert metrics["credit/viz_errors"] == 1.0  # tensorboard failed ...
    assert logged == [2] and viz.logged == [2]  # ... wandb still got the step
    assert metrics["credit/viz_render_seconds"] > 0 and metrics["credit/viz_wait_seconds"] >= 0


@pytest.mark.slow
def test_a_step_record_that_cannot_be_built_is_counted_and_the_next_step_still_draws(iapo_record, tmp_path):
    """The trainer hands the viz a function that builds the step record when nothing is dumped: a
    failure to build it (odd rollout content) costs one counted error, not the training step."""

    def unbuildable() -> dict:
        raise KeyError("response_mask")

    viz = CreditViz(VizSettings(every_n_steps=1, rollouts=2), tmp_path)
    viz.submit(1, unbuildable)  # must not raise
    assert viz.drain(1)["credit/viz_errors"] == 1.0
    viz.submit(2, lambda: dict(iapo_record))
    metrics = viz.drain(2, final=True)
    assert metrics["credit/viz_errors"] == 1.0 and viz.logged == [2]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["wandb", "tensorboard"])
def test_an_earlier_steps_drawing_is_waited_for_only_where_the_tracker_needs_steps_in_order(
    iapo_record, tmp_path, backend
):
    """wandb drops a step older than its current one: step 1's drawing is waited for at step 2.
    tensorboard takes any step: the trainer never waits for it before the last step."""
    import threading

    release = threading.Event()

    def slow(step, record, rollouts, folder):
        release.wait(60)
        return render_step(step, record, rollouts, folder)

    steps: list[int] = []
    wandb = SimpleNamespace(
        Image=lambda *a, **k: 0, Histogram=lambda *a: 0, Table=lambda **k: 0, log=lambda d, step: steps.append(step)
    )
    writer = SimpleNamespace(
        default_bins="auto", file_writer=SimpleNamespace(add_summary=lambda summary, step: steps.append(step))
    )
    tracking = SimpleNamespace(logger={backend: wandb if backend == "wandb" else SimpleNamespace(writer=writer)})
    viz = CreditViz(VizSettings(every_n_steps=1, rollouts=1), tmp_path, render=slow)
    viz.submit(1, iapo_record, tracking)
    assert viz.drain(1)["credit/viz_errors"] == 0.0 and steps == []  # still drawing: not waited for
    if backend == "wandb":
        release.set()
        viz.drain(2)  # the next step waits for step 1's drawing ...
        assert steps == [1]  # ... and logs it at step 1
    else:
        viz.drain(2)  # not waited for: still drawing
        assert steps == []
        release.set()
        viz.drain(2, final=True)  # the last step waits for everything
        assert set(steps) == {1}  # every summary at step 1
    viz.close()


def test_viz_settings_are_validated_by_key():
    assert load_settings({"estimator": "iapo"}).viz == VizSettings(every_n_steps=10, rollouts=4, dir=None)
    for key, value in (("every_n_steps", -1), ("every_n_steps", 1.5), ("rollouts", 0), ("rollouts", True), ("dir", "")):
        with pytest.raises(ValueError, match=rf"credit\.viz\.{key}"):
            load_settings({"estimator": "iapo", "viz": {key: value}})
    with pytest.raises(ValueError, match=r"credit\.viz\.colour"):
        load_settings({"estimator": "iapo", "viz": {"colour": "red"}})
