#!/usr/bin/env python
"""What the live credit pictures (``credit.viz``) cost a training step.

The step record is a real one (:func:`verl_credit.verl.viz_sample.sample_step_record`: the service
world's scripted rollouts, rule-annotated as the agent loop does, through the trainer's own
``compute_credit_advantages`` and ``step_record``), default 4 tasks x 8 rollouts (the CPU smoke's
step). Measured, median of ``--repeats`` after one warm-up:

* ``record``: building the step record (``step_record``) -- on the trainer's thread, but only on
  drawn steps (or every step when ``credit.debug.dump_dir`` is set, which builds it anyway);
* ``render``: the drawing at K rollouts (rebuild the lines, K rollout figures and the batch plots,
  PNG files, the HTML page), and ``worker``: that plus preparing tensorboard's summaries (PNG
  encoding) -- the worker thread's whole job, off the trainer's thread;
* ``trainer``: what the trainer's own thread spends per drawn step: ``CreditViz.submit`` plus
  ``drain`` of a finished drawing into a real tensorboard ``SummaryWriter`` (images, histograms,
  table);
* ``interference``: how much slower a pure-Python loop on the trainer's thread runs while the
  worker draws (the GIL: the worst case, as the trainer mostly waits on Ray there).

Shares are of ``--step-seconds`` (BENCHMARKS.md section 5: an iapo step of the CPU recipe is about
6 s), per drawn step and amortized over ``--every`` steps.

Usage: ``python scripts/bench_viz.py [--groups 4 --group-size 8 --rollouts 4 --repeats 5]``.
The last line printed is ``viz cost per drawn step: trainer X ms (Y% of a Z s step), worker W s``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from typing import Any

import torch

from verl_credit.verl.settings import VizSettings
from verl_credit.verl.step_record import step_record
from verl_credit.verl.viz import CreditViz, render_step
from verl_credit.verl.viz_sample import sample_step_record


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _record_seconds(record: dict[str, Any], repeats: int) -> float:
    """Rebuild the record from its own fields, as the trainer does at ``_compute_advantage``."""
    from verl_credit.config import CreditConfig

    extras = [{"credit": p} if p else {} for p in record["payloads"]]
    config = CreditConfig.from_mapping(record["credit_config"])
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        step_record(
            keys=record["keys"],
            tags=record["tags"],
            uids=record["uids"],
            extras=extras,
            rollout_mask=record["rollout_mask"],
            response_mask=record["response_mask"],
            token_level_rewards=record["token_level_rewards"],
            estimator=record["estimator"],
            config=config,
            norm_adv_by_std_in_grpo=record["norm_adv_by_std_in_grpo"],
            advantages=record["trainer_advantages"],
        )
        times.append(time.perf_counter() - started)
    return _median(times[1:])


def _python_loop_seconds(n: int = 300_000) -> float:
    started = time.perf_counter()
    total = 0
    for i in range(n):
        total += i % 7
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=4, help="K: rollouts pictured per drawn step")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--estimator", default="iapo")
    parser.add_argument("--step-seconds", type=float, default=6.0, help="a training step, for the shares")
    parser.add_argument("--every", type=int, default=10, help="credit.viz.every_n_steps, for the amortized share")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()
    from torch.utils.tensorboard import SummaryWriter

    record = sample_step_record(args.groups, args.group_size, estimator=args.estimator)
    sessions = len(record["keys"])
    results: dict[str, Any] = {
        "sessions": sessions,
        "rollouts": args.rollouts,
        "estimator": args.estimator,
        "torch_threads": torch.get_num_threads(),
        "load_1min": os.getloadavg()[0],
        "python": platform.python_version(),
    }
    results["record_s"] = _record_seconds(record, args.repeats)

    with tempfile.TemporaryDirectory() as folder:
        render_step(0, record, args.rollouts, folder)  # warm-up: imports, font cache
        renders, cpu = [], []
        for _ in range(args.repeats):
            started, started_cpu = time.perf_counter(), time.thread_time()
            render_step(1, record, args.rollouts, folder)
            renders.append(time.perf_counter() - started)
            cpu.append(time.thread_time() - started_cpu)
        results["render_s"] = _median(renders)
        results["render_cpu_s"] = _median(cpu)  # this thread's CPU time: what load on the machine does not inflate

        writer = SummaryWriter(os.path.join(folder, "tb"))
        tracking = type("Tracking", (), {"logger": {"tensorboard": type("TB", (), {"writer": writer})()}})()
        viz = CreditViz(VizSettings(every_n_steps=1, rollouts=args.rollouts), folder)
        trainer, worker = [], []
        for step in range(1, args.repeats + 1):
            started = time.perf_counter()
            viz.submit(step, record, tracking)
            submitted = time.perf_counter() - started
            viz._jobs[-1].future.result()  # the drawing is done (it ran during the actor update)
            started = time.perf_counter()
            metrics = viz.drain(step + 1)
            trainer.append(submitted + time.perf_counter() - started)
            assert metrics["credit/viz_errors"] == 0.0, metrics
            worker.append(metrics["credit/viz_render_seconds"])
        viz.close()
        writer.close()
        results["trainer_s"] = _median(trainer)
        results["worker_s"] = _median(worker)

        alone = _median([_python_loop_seconds() for _ in range(args.repeats)])
        busy = []
        for _ in range(args.repeats):
            done = threading.Event()

            def draw(done: threading.Event = done) -> None:
                render_step(2, record, args.rollouts, folder)
                done.set()

            worker = threading.Thread(target=draw)
            worker.start()
            loops = []
            while not done.is_set():
                loops.append(_python_loop_seconds())
            worker.join()
            busy.append(_median(loops))
        results["loop_alone_s"] = alone
        results["loop_while_drawing_s"] = _median(busy)

    step = args.step_seconds
    results["trainer_share_drawn_step"] = (results["trainer_s"] + results["record_s"]) / step
    results["trainer_share_amortized"] = results["trainer_share_drawn_step"] / args.every
    results["render_share_if_inline"] = results["render_cpu_s"] / step
    results["render_share_inline_amortized"] = results["render_cpu_s"] / step / args.every
    print(
        f"{sessions} sessions ({args.groups} tasks x {args.group_size}), {args.estimator}, K={args.rollouts}, "
        f"load {results['load_1min']:.1f}, torch threads {results['torch_threads']}"
    )
    print(f"record build (trainer thread):         {results['record_s'] * 1e3:8.2f} ms")
    print(f"submit + drain to tensorboard (trainer): {results['trainer_s'] * 1e3:6.1f} ms")
    print(
        f"render (worker thread):                {results['render_s']:8.3f} s wall, "
        f"{results['render_cpu_s']:.3f} s CPU of its thread"
    )
    print(f"render + tensorboard prepare (worker):  {results['worker_s']:8.3f} s")
    print(
        f"pure-Python loop on the trainer thread: {alone * 1e3:.1f} ms alone, "
        f"{results['loop_while_drawing_s'] * 1e3:.1f} ms while the worker draws"
    )
    print(
        f"shares of a {step:g} s step: trainer {results['trainer_share_drawn_step']:.2%} per drawn step "
        f"({results['trainer_share_amortized']:.3%} at every_n_steps={args.every}); the render, were it inline: "
        f"{results['render_share_if_inline']:.1%} ({results['render_share_inline_amortized']:.2%} amortized)"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)
    print(
        f"viz cost per drawn step: trainer {(results['trainer_s'] + results['record_s']) * 1e3:.1f} ms "
        f"({results['trainer_share_drawn_step']:.2%} of a {step:g} s step), worker {results['worker_s']:.2f} s"
    )


if __name__ == "__main__":
    main()
