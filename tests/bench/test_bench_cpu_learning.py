"""The real-trainer learning benchmark (``scripts/bench_cpu_learning.py``): its measures, its plan,
and (slow) 2 arms x 1 seed x 2 steps of verl's real ``fit()`` through the same script."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from verl_credit.bench.cpu_learning import (
    RunRecord,
    area_under_curve,
    compare_arms,
    first_reach,
    format_table,
    moving_mean,
    plot_curves,
    ratio_line,
    read_step_metrics,
    record_from_metrics,
    should_stop,
    summarize_records,
)
from verl_credit.bench.cpu_learning_main import BenchConfig, choose_lr, config_from_args, plan_runs

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^real trainer: iapo/grpo steps-to-0\.8 ratio: (\S+) \(p = ([^,]+), seeds (\d+)\)$")


def _record(arm: str, seed: int, success: list[float], setting: str = "service", lr: float = 3e-4, **kw) -> RunRecord:
    return RunRecord(
        setting=setting,
        arm=arm,
        seed=seed,
        lr=lr,
        budget=kw.pop("budget", 10),
        episodes_per_step=32,
        success=success,
        step_seconds=[6.0] * len(success),
        startup_seconds=100.0,
        wall_seconds=100.0 + 6.0 * len(success),
        status=kw.pop("status", "budget"),
        **kw,
    )


def test_moving_mean_is_trailing_and_needs_a_full_window():
    assert moving_mean([1, 2, 3, 4], 2) == [1.5, 2.5, 3.5]
    assert moving_mean([1, 2], 3) == []
    with pytest.raises(ValueError, match="window"):
        moving_mean([1.0], 0)


def test_first_reach_counts_steps_from_one_and_censors():
    success = [0.0, 0.5, 1.0, 1.0, 0.9, 0.6]
    # 3-step means: .5 (step 3), .833 (4), .967 (5), .833 (6)
    assert first_reach(success, 0.8, window=3) == 4.0
    assert first_reach(success, 0.9, window=3) == 5.0
    assert first_reach(success, 0.99, window=3) == math.inf
    assert first_reach([1.0, 1.0], 0.5, window=3) == math.inf  # too short for one window


def test_early_stop_needs_the_level_held():
    assert not should_stop([0.9] * 5, 0.9, window=5, hold=2)  # one full window only
    assert should_stop([0.9] * 6, 0.9, window=5, hold=2)
    assert not should_stop([0.9] * 5 + [0.4], 0.9, window=5, hold=2)


def test_a_run_with_ten_steps_of_no_success_has_collapsed():
    from verl_credit.bench.cpu_learning import has_collapsed

    assert has_collapsed([0.9, 0.5] + [0.0] * 10)
    assert not has_collapsed([0.9] + [0.0] * 9)
    assert not has_collapsed([0.0] * 9 + [0.03])
    assert area_under_curve([1.0, 1.0, 0.0, 0.0], budget=8, window=2) == pytest.approx(2 / 8)


def test_auc_fills_the_budget_after_an_early_stop_with_the_last_window():
    assert area_under_curve([0.0, 1.0], budget=2, window=2) == 0.5
    # stopped after 4 of 8 steps; the last 2 steps' mean (0.9) stands for the 4 untrained ones
    assert area_under_curve([0.2, 0.4, 0.8, 1.0], budget=8, window=2) == pytest.approx((2.4 + 4 * 0.9) / 8)
    with pytest.raises(ValueError, match="budget"):
        area_under_curve([1.0], budget=0)


def test_record_from_verl_metrics_skips_validation_only_steps_and_a_cut_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 0, "data": {"val-core/service/reward/mean@1": 0.75}},
        {"step": 1, "data": {"critic/score/mean": 0.25, "timing_s/step": 10.0, "credit/malformed_tool_calls": 3.0}},
        {"step": 2, "data": {"critic/score/mean": 0.5, "timing_s/step": 5.0, "timing_s/testing": 2.0}},
        {"step": 2, "data": {"val-core/service/reward/mean@1": 1.0}},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + '\n{"step": 3, "da')
    metrics = read_step_metrics(path)
    record = record_from_metrics(
        metrics,
        setting="service",
        arm="iapo",
        seed=1,
        lr=3e-4,
        budget=100,
        episodes_per_step=32,
        startup_seconds=90.0,
        wall_seconds=107.0,
        status="budget",
    )
    assert record.success == [0.25, 0.5]
    assert record.step_seconds == [10.0, 5.0]
    assert record.validation == {0: 0.75, 2: 1.0}
    assert record.malformed_tool_calls == [3.0, 0.0]
    assert record.credit_means["credit/malformed_tool_calls"] == 3.0  # only where the step logged it
    again = RunRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert again == record


def test_measures_in_steps_episodes_and_seconds():
    record = _record("grpo", 1, [0.0, 0.5, 1.0, 1.0, 1.0], budget=5)
    measures = record.measures(window=2)
    # 2-step means: .25 (step 2), .75 (step 3), 1.0 (step 4)
    assert measures["steps_to_0.8"] == 4.0
    assert measures["episodes_to_0.8"] == 4.0 * 32
    assert measures["seconds_to_0.8"] == 24.0  # verl's timing_s/step of steps 1-4, start-up excluded
    assert measures["auc"] == pytest.approx(3.5 / 5)


def test_summary_comparison_and_the_last_line():
    grpo = [_record("grpo", s, [0.0] * 5 + [1.0] * 5) for s in range(1, 6)]  # reaches 0.8 at step 9
    iapo = [_record("iapo", s, [0.0, 0.0] + [1.0] * 8) for s in range(1, 6)]  # at step 6
    summary = summarize_records([*grpo, *iapo])
    assert summary["service/grpo"]["steps_to_0.8"]["median"] == 9.0
    assert summary["service/iapo"]["steps_to_0.8"]["median"] == 6.0
    comparison = compare_arms([*grpo, *iapo])
    block = comparison["service/iapo"]
    assert block["steps_to_0.8_ratio"] == pytest.approx(6 / 9)
    assert block["steps_to_0.8_p"] < 0.05  # every iapo seed before every grpo seed
    line = ratio_line(comparison)
    assert LINE.match(line), line
    p = comparison["service/iapo"]["steps_to_0.8_p"]
    assert line == f"real trainer: iapo/grpo steps-to-0.8 ratio: 0.67 (p = {p:.2g}, seeds 5)"
    table = format_table(summary, comparison)
    assert "| service/iapo | 5 | 6 (5 reached) |" in table


def test_censored_runs_rank_last_and_give_an_infinite_ratio():
    grpo = [_record("grpo", s, [1.0] * 10) for s in range(1, 4)]
    iapo = [_record("iapo", s, [0.0] * 10) for s in range(1, 4)]
    block = compare_arms([*grpo, *iapo])["service/iapo"]
    assert math.isinf(block["steps_to_0.8_ratio"])
    assert "inf" in ratio_line({"service/iapo": block})


def test_plot_writes_a_png_with_early_stopped_runs(tmp_path):
    records = [
        _record("grpo", 1, [0.1 * k for k in range(10)]),
        _record("iapo", 1, [0.5, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0], status="early_stop"),
        _record("iapo", 2, [0.4, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], status="early_stop"),
        _record("grpo", 1, [0.2] * 10, setting="delayed"),
    ]
    path = plot_curves(records, tmp_path / "curves.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_sweeps_grpo_on_unmeasured_seeds_then_runs_the_headline_comparison_first():
    config = BenchConfig(out=Path("x"), seeds=3, minor_seeds=2, delayed_seeds=2, sweep_seeds=(101,))
    plan = plan_runs(config, lr_chosen=False)
    sweep = [p for p in plan if p.stage == "sweep"]
    assert [(p.arm, p.seed) for p in sweep] == [("grpo", 101)]
    measured = [(p.setting, p.arm, p.seed) for p in plan if p.stage == "measured"]
    # service grpo vs iapo on every seed, the order rotating seed by seed
    assert measured[:6] == [
        ("service", "grpo", 1),
        ("service", "iapo", 1),
        ("service", "iapo", 2),
        ("service", "grpo", 2),
        ("service", "grpo", 3),
        ("service", "iapo", 3),
    ]
    # then the delayed-use variant, grpo vs iapo
    assert measured[6:10] == [
        ("delayed", "grpo", 1),
        ("delayed", "iapo", 1),
        ("delayed", "iapo", 2),
        ("delayed", "grpo", 2),
    ]
    # then the other arms on the service world, InfoPO (info_gain) among them
    assert measured[10:] == [
        ("service", "call_credit", 1),
        ("service", "gigpo", 1),
        ("service", "info_gain", 1),
        ("service", "gigpo", 2),
        ("service", "info_gain", 2),
        ("service", "call_credit", 2),
    ]
    assert not {p.seed for p in sweep} & {seed for _, _, seed in measured}
    assert all(p.stage == "measured" for p in plan_runs(config, lr_chosen=True))


def test_a_run_in_the_ledger_is_not_trained_again(tmp_path, monkeypatch):
    """A record committed to the ledger (measured on another machine) is restored, not rerun; a
    failed record in the run folder is not copied to the ledger."""
    import verl_credit.bench.cpu_learning_main as main_module

    ledger = tmp_path / "ledger"
    config = BenchConfig(out=tmp_path / "out", ledger=ledger, lr=1e-4)
    record = _record("iapo", 3, [0.5, 0.9, 1.0], lr=1e-4, status="early_stop")
    path = main_module.ledger_record_path(ledger, "service", "iapo", 3, 1e-4)
    assert path == ledger / "service" / "iapo" / "lr0.0001" / "seed3.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record.to_json()))

    def no_training(*args, **kwargs):
        raise AssertionError("a run in the ledger was started")

    monkeypatch.setattr(main_module.subprocess, "Popen", no_training)
    setting = main_module.SETTINGS["service"]
    restored = main_module.run_one(config, setting, "iapo", 3, 1e-4, (tmp_path, tmp_path), tmp_path)
    assert restored.success == record.success and restored.status == "early_stop"
    assert (tmp_path / "out" / "runs" / "service" / "iapo" / "lr0.0001" / "seed3" / "result.json").exists()
    assert main_module.ledger_record_path(None, "service", "iapo", 3, 1e-4) is None


def test_quick_runs_never_write_the_ledger():
    import argparse

    from verl_credit.bench.cpu_learning_main import DEFAULT_LEDGER, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args(["--quick"])).ledger is None
    assert config_from_args(parser.parse_args(["--ledger", "none", "--lr", "1e-4"])).ledger is None
    assert config_from_args(parser.parse_args(["--lr", "1e-4"])).ledger == DEFAULT_LEDGER.resolve()


def test_sweep_seeds_must_not_be_measured():
    import argparse

    from verl_credit.bench.cpu_learning_main import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError, match="overlap"):
        config_from_args(parser.parse_args(["--sweep-seeds", "3", "--seeds", "10"]))
    assert config_from_args(parser.parse_args(["--sweep-seeds", "3", "--seeds", "10", "--lr", "1e-4"])).lr == 1e-4


def test_the_sweep_picks_the_fastest_grpo_learning_rate():
    records = [
        _record("grpo", 101, [0.0] * 10, lr=1e-4),
        _record("grpo", 102, [0.0] * 8 + [1.0] * 2, lr=1e-4),
        _record("grpo", 101, [0.0] * 3 + [1.0] * 7, lr=3e-4),
        _record("grpo", 102, [0.0] * 4 + [1.0] * 6, lr=3e-4),
    ]
    lr, table = choose_lr(records, window=5)
    assert lr == 3e-4
    assert [row["lr"] for row in table] == [1e-4, 3e-4]
    # a learning rate that gets to 0.8 first and then collapses loses to a steady one
    collapse = [_record("grpo", s, [0.0] + [1.0] * 3 + [0.0] * 6, lr=1e-3) for s in (101, 102)]
    steady = [_record("grpo", s, [0.0] * 3 + [1.0] * 7, lr=3e-4) for s in (101, 102)]
    assert choose_lr([*collapse, *steady], window=2)[0] == 3e-4


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(os.environ.get("VERL_CREDIT_SKIP_CPU_TRAINING") == "1", reason="VERL_CREDIT_SKIP_CPU_TRAINING=1")
def test_two_arms_train_through_the_script_and_write_results_and_curves(tmp_path):
    """``--quick``: grpo and iapo, one seed, 2 steps each of verl's real fit() on this CPU (the same
    script and code path as the hours-long benchmark), then results.json, curves.png and the line."""
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_cpu_learning.py"), "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1700,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert LINE.match(last), last
    results = json.loads((out / "results.json").read_text())
    runs = {run["arm"]: run for run in results["runs"]}
    assert set(runs) == {"grpo", "iapo"}
    for arm, run in runs.items():
        assert run["status"] == "budget", (arm, run["status"], run["diagnostics"])
        assert len(run["success"]) == 2 and all(0.0 <= s <= 1.0 for s in run["success"])
        assert set(run["validation"]) == {"0", "2"}  # before training and after step 2, held-out tasks
        assert run["diagnostics"]["check_max_abs_diff"] <= 1e-6  # the actor's advantages == the core's
        assert run["diagnostics"]["check_problems"] == 0
        if any(s > 0 for s in run["success"]):  # successful sessions: their writes are causal actions
            assert run["diagnostics"]["causal_token_share"] > 0, run["diagnostics"]
            assert 0.0 <= run["diagnostics"]["credit_precision"] <= 1.0
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a rerun skips the finished runs and reports the same (its diagnostics recomputed from the dumps)
    again = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_cpu_learning.py"), "--quick", "--rediagnose", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.strip().splitlines()[-1] == last
    assert "measured service  grpo" in again.stderr
    assert "rediagnosed 2 finished runs" in again.stderr
