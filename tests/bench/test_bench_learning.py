"""Learning benchmark: advantage maps, policy gradient, summaries, and the quick mode end to end."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from verl_credit.bench.learning import (
    CreditMap,
    LearningConfig,
    oracle_weights,
    policy_gradient,
    summarize_runs,
    train_run,
)
from verl_credit.bench.learning_main import main
from verl_credit.bench.stats import quantiles
from verl_credit.cli.main import main as cli_main
from verl_credit.envs.service.agent import FEATURES, MACROS, Episode, LinearSoftmaxPolicy


def _episode(causal, mistakes, reward):
    count = len(causal)
    return Episode("refund-0", [], reward, [0] * count, np.zeros((count, len(FEATURES))), causal, mistakes)


def test_oracle_weights_hand_computed():
    episodes = [
        _episode([True, False, True, False], [False] * 4, 1.0),
        _episode([False] * 4, [False, False, False, True], 0.0),
        _episode([False] * 3, [False] * 3, 0.0),
        _episode([True, True], [False, False], 1.0),
    ]
    weights = oracle_weights(episodes, np.array([0.8, -0.8, -0.5, 0.0]))
    # T=4, |C|=2 -> 4/2 = 2 on the causal actions; T=4, one mistake -> 4/1 = 4 on it;
    # no mistake flagged -> uniform; A = 0 -> uniform.
    assert weights[0].tolist() == [2.0, 0.0, 2.0, 0.0]
    assert weights[1].tolist() == [0.0, 0.0, 0.0, 4.0]
    assert weights[2].tolist() == [1.0, 1.0, 1.0]
    assert weights[3].tolist() == [1.0, 1.0]
    for w in weights:  # mass conservation with unit lengths
        assert w.sum() == pytest.approx(len(w))


def test_policy_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    policy = LinearSoftmaxPolicy(rng.normal(size=(len(MACROS), len(FEATURES))))
    features = rng.random((5, len(FEATURES)))
    actions = np.array([0, 3, 3, 7, 11])
    advantages = np.array([1.0, -0.5, 0.25, 2.0, -1.0])

    def objective(weights):
        logits = features @ weights.T
        log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        return float((advantages * log_probs[np.arange(5), actions]).mean())

    gradient = policy_gradient(policy, features, actions, advantages)
    numeric = np.zeros_like(policy.weights)
    step = 1e-6
    for index in np.ndindex(policy.weights.shape):
        up, down = policy.weights.copy(), policy.weights.copy()
        up[index] += step
        down[index] -= step
        numeric[index] = (objective(up) - objective(down)) / (2 * step)
    np.testing.assert_allclose(gradient, numeric, atol=1e-6)


def test_quantiles_treat_never_as_infinite():
    # sorted [100, 200, inf, inf]: q25 at position 0.75 -> 100 + 0.75 * 100 = 175;
    # median at 1.5 interpolates towards inf -> inf; q75 at 2.25 -> inf
    assert quantiles([200, math.inf, 100, math.inf]) == (175.0, math.inf, math.inf)
    assert quantiles([100, 300, 200]) == (150.0, 200.0, 250.0)


def test_iapo_credit_map_uses_rule_graphs_and_caches_them():
    from verl_credit.annotate.factory import build_annotator
    from verl_credit.envs.service.agent import MACRO_INDEX, run_episode
    from verl_credit.envs.service.env import ServiceEpisode

    plan = [MACRO_INDEX[m] for m in ("ask_request", "small_talk", "lookup_order", "return_item", "refund", "finish")]
    spec = {"variant": "refund", "seed": 2}  # this customer wants the original payment method: the plan succeeds
    good = run_episode(ServiceEpisode(spec), lambda phi, turn: plan[turn])
    bad = run_episode(ServiceEpisode(spec), lambda phi, turn: MACRO_INDEX["finish"])
    assert (good.reward, bad.reward) == (1.0, 0.0)
    credit_map = CreditMap("iapo", build_annotator("rules"))
    advantage, weights = credit_map.weights([good, bad, good], torch.tensor([1.0, 0.0, 1.0]), ["1", "1", "1"])
    assert len(credit_map.graphs) == 2  # two distinct transcripts, annotated once each
    assert advantage[0] > 0 > advantage[1]
    w = weights[0]
    assert w.sum() == pytest.approx(len(w))
    # the small talk (1) and the closing (5) bind nothing and get less than GRPO; the order lookup
    # (2) supplies the item and payment ids and gets more
    assert w[1] < 1 and w[5] < 1 and w[2] > 1
    assert weights[1].tolist() == [1.0]  # a one-action failure without errors: uniform


@pytest.mark.timeout(120)
def test_train_run_structure_and_precision_bounds():
    config = LearningConfig(seeds=1, budget=64, check_episodes=8, eval_episodes=8, workers=1)
    oracle = train_run("refund", "oracle", 0, config)
    grpo = train_run("refund", "grpo", 0, config)
    assert [point[0] for point in grpo.curve] == [32, 64]
    assert oracle.initial_success == grpo.initial_success  # same tasks, same first policy, same sampler
    assert oracle.credit_precision == pytest.approx(1.0)  # positive mass only on causal actions
    assert 0 < grpo.credit_precision < 1
    assert 0 <= grpo.final_success <= 1
    summary = summarize_runs(
        [oracle, grpo], LearningConfig(seeds=1, budget=64, variants=("refund",), arms=("grpo", "oracle"))
    )
    block = summary["variants"]["refund"]["arms"]["grpo"]
    assert set(block) >= {
        "rollouts_to_target_median",
        "rollouts_to_target_q25",
        "rollouts_to_target_q75",
        "final_success_mean",
        "credit_precision",
        "reached",
        "runs",
    }


def test_config_errors_name_the_setting():
    with pytest.raises(ValueError, match="arm"):
        LearningConfig(arms=("grpo", "magic"))
    with pytest.raises(ValueError, match="variant"):
        LearningConfig(variants=("teleport",))
    with pytest.raises(ValueError, match="budget"):
        LearningConfig(budget=8)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_quick_mode_prints_the_ratio_line_last_and_writes_results(tmp_path, capsys):
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"iapo/grpo rollouts-to-90% ratio \(delayed-use\): (\d+\.\d\d|nan|inf)", printed[-1])
    results = json.loads((tmp_path / "results.json").read_text())
    variants = results["summary"]["variants"]
    assert set(variants) == {"refund", "delayed", "error_repair"}
    assert set(variants["delayed"]["arms"]) == {"grpo", "iapo", "call_credit", "oracle"}
    assert len(results["runs"]) == 3 * 4 * 2
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cli_bench_learning_runs_one_arm(tmp_path, capsys):
    code = cli_main(
        ["bench", "learning", "--quick", "--variants", "delayed", "--arms", "grpo", "iapo", "--out", str(tmp_path)]
    )
    assert code == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("iapo/grpo rollouts-to-90% ratio")
