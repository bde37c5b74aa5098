"""Coding learning-benchmark arm (verl_credit.bench.coding_arm) and its script."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl_credit.bench.coding_arm import (
    CachedTaskWorld,
    CallPolicy,
    CodingBenchConfig,
    CodingRunResult,
    credit_for_batch,
    format_markdown_table,
    play_episode,
    policy_gradient,
    run_coding_benchmark,
    summarize_coding_runs,
)
from verl_credit.bench.stats import quantiles
from verl_credit.envs.coding import CodingSandbox, load_task

#: slow: benchmark arm in the coding sandbox
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_coding.py"


def _force(policy: CallPolicy, slot: str, option: int) -> None:
    """Make ``option`` the (numerically) certain choice of ``slot``."""
    policy.logits[slot][:] = -50.0
    policy.logits[slot][option] = 50.0


@pytest.fixture(scope="module")
def pagination_world():
    world = CachedTaskWorld(load_task("pagination_offset"))
    yield world
    world.close()


def _play(world: CachedTaskWorld, reads: tuple[int, int], edit: int, verify: int, repair: int | None = None):
    policy = CallPolicy([world.task])
    _force(policy, "read_1", reads[0])
    _force(policy, "read_2", reads[1])
    _force(policy, f"edit/{world.task.name}", edit)
    _force(policy, "verify", verify)
    if repair is not None:
        _force(policy, f"repair/{world.task.name}", repair)
    return play_episode(world, policy, np.random.default_rng(0))


@pytest.mark.timeout(60)
def test_cached_world_replays_the_real_sandbox(pagination_world: CachedTaskWorld) -> None:
    task = pagination_world.task
    edit = task.solution[0].to_arguments()
    calls = [("read_file", {"path": task.target}), ("edit_file", edit)]
    state = pagination_world.initial_state
    cached_results = []
    for name, arguments in calls:
        result, state = pagination_world.step(state, name, arguments)
        cached_results.append(result.content)
    executed = pagination_world.executed
    with CodingSandbox(task) as fresh:
        fresh_results = [fresh.call(name, arguments).content for name, arguments in calls]
        fresh_reward = fresh.reward()
    assert cached_results == fresh_results
    assert pagination_world.reward(state) == fresh_reward == 1.0
    # the second time round nothing is executed again
    state = pagination_world.initial_state
    for name, arguments in calls:
        _, state = pagination_world.step(state, name, arguments)
    assert pagination_world.executed == executed


@pytest.mark.timeout(60)
def test_episode_structure_roles_and_read_before_edit(pagination_world: CachedTaskWorld) -> None:
    # read target, read distractor, reference fix, run_tests (pass) -> fixed answer
    good = _play(pagination_world, (0, 1), edit=0, verify=0)
    assert good.reward == 1.0
    assert good.decisions == [("read_1", 0), ("read_2", 1), ("edit/pagination_offset", 0), ("verify", 0), None]
    assert good.call_graph.roles == ("IG", "IG", "AE", "RV", "IG")
    kinds = {(e.src, e.dst, e.kind) for e in good.call_graph.edges}
    assert {(0, 2, "IG->AE"), (2, 3, "AE->RV")} <= kinds
    # never reading the target: the edit is refused, the bug stays, tests fail, the repair is refused too
    unread = _play(pagination_world, (1, 3), edit=0, verify=0, repair=0)
    assert unread.reward == 0.0
    assert "has not been read yet" in unread.messages[7]["content"]
    assert unread.decisions[-2] == ("repair/pagination_offset", 0)
    # wrong edit caught by the visible test, repaired with the reference fix -> success
    repaired = _play(pagination_world, (0, 0), edit=2, verify=0, repair=0)
    assert repaired.reward == 1.0
    assert repaired.call_graph.roles == ("IG", "IG", "AE", "RV", "AE", "IG")
    # wrong edit that fools the visible test: no repair slot, hidden tests fail
    fooled = _play(pagination_world, (0, 0), edit=1, verify=0)
    assert fooled.reward == 0.0 and all(d is None or not d[0].startswith("repair") for d in fooled.decisions)


@pytest.mark.timeout(60)
def test_call_credit_advantages_hand_computed(pagination_world: CachedTaskWorld) -> None:
    good = _play(pagination_world, (0, 1), edit=0, verify=0)
    bad = _play(pagination_world, (0, 1), edit=2, verify=0, repair=2)  # repair: the same wrong edit again
    assert good.lengths == [2, 2, 18, 1, 5]
    # read core.py -> edit core.py -> run the tests; the read of render.py supports nothing (it
    # shares only the variable per_page with the edit, and a symbol edge needs a defined name)
    assert good.call_graph.out_degree().tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]
    credit, masks = credit_for_batch("call_credit", [good, bad])
    # GRPO group of two, rewards [1, 0]: mean 0.5, Bessel std 0.70711 -> A = +-0.70711
    assert credit.trajectory_advantage.tolist() == pytest.approx([0.70711, -0.70711], abs=1e-5)
    # good: T=5, deg+1 = [2,1,2,1,1] (sum 7), omega = [.6,.6,1,.4,.6], gamma^(T-pos) = [.8145,.8574,.9025,.95,1]
    # s = [.13963, .07349, .25786, .05429, .08571]; L = [2,2,18,1,5] (sum 28); sum L s = 5.55052
    # w = 28 s / 5.55052 = [0.70437, 0.37072, 1.30078, 0.27385, 0.43239]
    assert credit.weight[0, :5].tolist() == pytest.approx([0.70437, 0.37072, 1.30078, 0.27385, 0.43239], abs=1e-5)
    assert credit.action_advantage[0, :5].tolist() == pytest.approx(
        [0.70711 * w for w in [0.70437, 0.37072, 1.30078, 0.27385, 0.43239]], abs=1e-4
    )
    assert masks["IG"][0, :5].tolist() == [1, 1, 0, 0, 1] and masks["AE"][0, :5].tolist() == [0, 0, 1, 0, 0]
    grpo, _ = credit_for_batch("grpo", [good, bad])
    assert grpo.weight[0, :5].tolist() == [1.0] * 5 and grpo.weight[1, :6].tolist() == [1.0] * 6
    with pytest.raises(ValueError, match="unknown coding-bench arm 'iapo'"):
        credit_for_batch("iapo", [good])


def test_policy_gradient_hand_computed() -> None:
    task = load_task("median_even")
    policy = CallPolicy([task])

    rollout = SimpleNamespace(decisions=[("read_1", 0), ("verify", 1), None])  # all policy_gradient reads

    # 2 decisions, advantages [1.0, -0.5] (the third call is the fixed answer, ignored)
    grad = policy_gradient(policy, [rollout], torch.tensor([[1.0, -0.5, 9.0]]))
    # read_1 uniform over 5: (onehot(0) - 0.2) * 1.0 / 2 = [0.4, -0.1, -0.1, -0.1, -0.1]
    assert grad["read_1"].tolist() == pytest.approx([0.4, -0.1, -0.1, -0.1, -0.1])
    # verify uniform over 2: (onehot(1) - 0.5) * -0.5 / 2 = [0.125, -0.125]
    assert grad["verify"].tolist() == pytest.approx([0.125, -0.125])
    assert not grad["read_2"].any() and not grad[f"edit/{task.name}"].any()


def test_quantiles_and_config_errors() -> None:
    assert quantiles([100.0, 200.0, 300.0]) == (150.0, 200.0, 250.0)
    # [100, 200, inf, inf]: q25 at position 0.75 -> 175; the median interpolates toward inf -> inf
    q25, median, q75 = quantiles([200.0, math.inf, 100.0, math.inf])
    assert q25 == 175.0 and math.isinf(median) and math.isinf(q75)
    with pytest.raises(ValueError, match="unknown coding-bench arm"):
        CodingBenchConfig(arms=("oracle",))
    with pytest.raises(ValueError, match="optimizer"):
        CodingBenchConfig(optimizer="rmsprop")
    with pytest.raises(ValueError, match="smaller than one batch"):
        CodingBenchConfig(budget=8)


@pytest.mark.timeout(400)
def test_tiny_benchmark_and_script(capsys: pytest.CaptureFixture[str]) -> None:
    config = CodingBenchConfig(
        seeds=2,
        tasks=("median_even", "slugify_dashes"),
        budget=64,
        window=32,
        eval_episodes=16,
        group_size=4,
        tasks_per_step=2,
        learning_rate=0.3,
        workers=1,
    )
    results = run_coding_benchmark(config)
    assert sorted((r.arm, r.seed) for r in results) == [
        ("call_credit", 0),
        ("call_credit", 1),
        ("grpo", 0),
        ("grpo", 1),
    ]
    for run in results:
        assert isinstance(run, CodingRunResult) and run.curve[-1][0] == 64 and 0.0 <= run.final_success <= 1.0
    # same seed -> same task sequence and the same first batch in both arms (the policies start equal)
    first = {(r.arm, r.seed): r.curve[0][1] for r in results}
    assert first[("grpo", 0)] == first[("call_credit", 0)]
    summary = summarize_coding_runs(results, config)
    # flat GRPO credit gives IG and AE the same per-token advantage: the hacking rate is 0 by construction
    assert summary["arms"]["grpo"]["reward_hacking_rate"] == 0.0
    assert summary["arms"]["grpo"]["runs"] == 2
    table = format_markdown_table(summary).splitlines()
    assert table[0].startswith("| arm | rollouts to 90% (median) | IQR |") and len(table) == 4

    spec = importlib.util.spec_from_file_location("bench_coding_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    code = script.main(
        [
            "--seeds",
            "1",
            "--tasks",
            "median_even",
            "--budget",
            "16",
            "--window",
            "8",
            "--eval-episodes",
            "4",
            "--group-size",
            "4",
            "--tasks-per-step",
            "1",
            "--workers",
            "1",
            "--arms",
            "grpo",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| arm |") and out[2].startswith("| grpo |")
