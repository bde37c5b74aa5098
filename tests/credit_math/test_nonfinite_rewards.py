"""Finite rewards give finite advantages; non-finite rewards, rewards beyond the reward limit and
non-finite settings are refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from verl_credit.batch_credit import compute_batch_credit, trajectory_scores
from verl_credit.config import CallCreditConfig, CreditConfig, IAPOConfig
from verl_credit.credit_math.grpo import WIDE_SCORE, compute_grpo_trajectory_advantage
from verl_credit.graph import InfluenceGraph

UIDS = ["a", "a", "a", "a", "b", "b"]


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_fp32_rewards_near_the_fp32_limit_give_finite_advantages(norm_by_std: bool) -> None:
    scores = torch.tensor([3.4e38, 3.4e38, -3.4e38, 0.0, 1.0, 0.0])
    advantage = compute_grpo_trajectory_advantage(scores, UIDS, norm_adv_by_std_in_grpo=norm_by_std)
    assert advantage.dtype == torch.float32 and torch.isfinite(advantage).all()
    if norm_by_std:  # the same z-scores as exact float64 arithmetic
        exact = scores[:4].double()
        expected = (exact - exact.mean()) / exact.std()
        assert torch.allclose(advantage[:4].double(), expected, rtol=1e-6)
    # the ordinary group is still verl's fp32 arithmetic, bit for bit
    ordinary = compute_grpo_trajectory_advantage(scores[4:], UIDS[4:], norm_adv_by_std_in_grpo=norm_by_std)
    assert torch.equal(advantage[4:], ordinary)


def test_a_reward_beyond_fp32_gives_finite_advantages() -> None:
    scores = trajectory_scores([1e39, 0.0, 1.0, 0.0, 1.0, 0.0])
    assert scores.dtype == torch.float64 and float(scores[0]) == 1e39
    advantage = compute_grpo_trajectory_advantage(scores, UIDS)
    assert torch.isfinite(advantage).all()
    assert advantage[0] > 0 and advantage[1] < 0


def test_float64_rewards_near_the_float64_limit_give_finite_advantages() -> None:
    scores = torch.tensor([1.7e308, 1.7e308, -1.7e308, 0.0], dtype=torch.float64)
    for norm in (True, False):
        advantage = compute_grpo_trajectory_advantage(scores, ["g"] * 4, norm_adv_by_std_in_grpo=norm)
        assert torch.isfinite(advantage).all()


def test_ordinary_rewards_stay_float32_and_verl_exact() -> None:
    rewards = [float(x) for x in np.random.default_rng(0).normal(0, 1e3, 48)]
    scores = trajectory_scores(rewards)
    assert scores.dtype == torch.float32
    index = np.array([f"g{i // 4}" for i in range(48)], dtype=object)
    token_rewards = scores.unsqueeze(-1)
    expected, _ = compute_grpo_outcome_advantage(token_rewards.clone(), torch.ones_like(token_rewards), index)
    assert torch.equal(compute_grpo_trajectory_advantage(scores, index), expected[:, 0])
    # just below the threshold: still the fp32 path
    assert trajectory_scores([WIDE_SCORE / 2]).dtype == torch.float32


@pytest.mark.parametrize("estimator", ["grpo", "iapo", "call_credit"])
def test_batch_credit_of_huge_rewards_is_finite(estimator: str) -> None:
    from verl_credit.call_graph import CallGraph

    scores = trajectory_scores([1e39, -1e39, 3.0, 3.0, 1.0, 0.0])
    lengths = [[2, 3]] * 6
    credit = compute_batch_credit(
        scores,
        UIDS,
        lengths,
        CreditConfig(estimator=estimator),
        graphs=[InfluenceGraph.uniform(2)] * 6,
        call_graphs=[CallGraph(("AE", "AE"), (False, False))] * 6,
    )
    assert torch.isfinite(credit.trajectory_advantage).all()
    assert torch.isfinite(credit.action_advantage).all()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_reward_is_rejected_offline(bad: float) -> None:
    with pytest.raises(ValueError, match=r"trajectory 2 'third'.*must be finite"):
        trajectory_scores([1.0, 0.0, bad], names=["first", "second", "third"])
    scores = torch.tensor([1.0, 0.0, bad, 0.0])
    with pytest.raises(ValueError, match=r"trajectory 2 \(group 'b'\).*must be finite"):
        compute_batch_credit(scores, ["a", "a", "b", "b"], [[1]] * 4, CreditConfig(estimator="grpo"))


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"iapo": {"clip_c": math.nan}}, "credit.iapo.clip_c"),
        ({"iapo": {"beta_plus": math.nan}}, "credit.iapo.beta_plus"),
        ({"iapo": {"beta_minus": math.inf}}, "credit.iapo.beta_minus"),
        ({"iapo": {"eps": math.inf}}, "credit.iapo.eps"),
        ({"epsilon": math.nan}, "credit.epsilon"),
        ({"call_credit": {"smoothing": math.inf}}, "credit.call_credit.smoothing"),
        ({"call_credit": {"kappa": math.nan}}, "credit.call_credit.kappa"),
        ({"call_credit": {"omega": {"AE": math.inf, "IG": 1.0, "RV": 1.0}}}, "credit.call_credit.omega.AE"),
        ({"call_credit": {"counterfactual": {"eta": math.inf}}}, "credit.call_credit.counterfactual.eta"),
        ({"call_credit": {"counterfactual": {"timeout": math.inf}}}, "credit.call_credit.counterfactual.timeout"),
        ({"call_credit": {"ig_downweight": {"theta_ig": math.nan}}}, "credit.call_credit.ig_downweight.theta_ig"),
        ({"call_credit": {"adaptive_omega": {"omega_max": math.inf}}}, "credit.call_credit.adaptive_omega.omega_max"),
        ({"call_credit": {"dpo_export": {"theta_ae": math.inf}}}, "credit.call_credit.dpo_export.theta_ae"),
    ],
)
def test_nonfinite_settings_are_rejected_naming_the_key(values: dict, key: str) -> None:
    with pytest.raises(ValueError, match=rf"{key.replace('.', '[.]')} must be a finite number"):
        CreditConfig.from_mapping(values)


def test_nonfinite_settings_are_rejected_by_the_dataclasses_too() -> None:
    with pytest.raises(ValueError, match=r"credit\.iapo\.clip_c must be a finite"):
        IAPOConfig(clip_c=math.nan)
    with pytest.raises(ValueError, match=r"credit\.call_credit\.gamma must be a finite"):
        CallCreditConfig(gamma=math.nan)
    assert CreditConfig().iapo.clip_c == 0.25  # defaults are fine


@pytest.mark.parametrize("estimator", ["grpo", "iapo", "call_credit", "gigpo", "info_gain"])
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_rewards_at_the_reward_limit_give_finite_credit_for_every_estimator(estimator: str, norm_by_std: bool) -> None:
    from verl_credit.call_graph import CallGraph
    from verl_credit.credit_math.grpo import REWARD_LIMIT

    scores = trajectory_scores([REWARD_LIMIT, -REWARD_LIMIT, REWARD_LIMIT, REWARD_LIMIT, 1.0, 0.0])
    config = CreditConfig.from_mapping({"estimator": estimator, "norm_adv_by_std_in_grpo": norm_by_std})
    credit = compute_batch_credit(
        scores,
        UIDS,
        [[2, 3]] * 6,
        config,
        graphs=[InfluenceGraph.uniform(2)] * 6,
        call_graphs=[CallGraph(("AE", "AE"), (False, False))] * 6,
        anchor_states=[["s1", "s2"]] * 6,
    )
    assert torch.isfinite(credit.trajectory_advantage).all()
    assert torch.isfinite(credit.action_advantage).all()


@pytest.mark.slow
def test_a_reward_beyond_the_reward_limit_is_refused_before_any_work(tmp_path) -> None:
    import json
    import subprocess
    import sys

    with pytest.raises(ValueError, match=r"trajectory 0 'big'.*within \+-1e\+300"):
        trajectory_scores([1e308, 0.0], names=["big", "small"])
    wide = torch.tensor([1e308, 0.0], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"trajectory 0 \(group 'a'\).*overflows the credit"):
        compute_batch_credit(wide, ["a", "a"], [[1]] * 2, CreditConfig(estimator="gigpo"), anchor_states=[["s"]] * 2)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text(
        "".join(
            json.dumps({"id": f"t{i}", "uid": "g", "reward": r, "messages": messages}) + "\n"
            for i, r in enumerate([0.0, 1e308])
        )
    )
    out = tmp_path / "credit.jsonl"
    command = [sys.executable, "-m", "verl_credit.cli.main", "route", "--input", str(rollouts), "--estimator", "gigpo"]
    completed = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2, completed.stderr
    assert f"{rollouts}:2: field 'reward': 1e+308 lies beyond +-1e+300" in completed.stderr
    assert not out.exists()
