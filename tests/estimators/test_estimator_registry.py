"""The estimator registry and the paper's baselines (gigpo, turn_reward), on hand-computed cases."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from verl_credit.batch_credit import compute_batch_credit, trajectory_scores
from verl_credit.cli.main import main as cli_main
from verl_credit.config import CreditConfig, GiGPOConfig, TurnRewardConfig
from verl_credit.estimators import Estimator, estimator_names, get_estimator, register_estimator
from verl_credit.estimators.needs import anchor_states_of, turn_rewards_of
from verl_credit.trajectory import Trajectory

GAMMA = 0.95


def _dialog(first: str, second: str) -> list[dict]:
    return [
        {"role": "system", "content": "You help customers."},
        {"role": "user", "content": "my order is late"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "it is #W1"},
        {"role": "assistant", "content": second},
    ]


def _trajectory(name: str, uid: str, reward: float, first: str, second: str, **extra: object) -> Trajectory:
    record = {"id": name, "uid": uid, "reward": reward, "messages": _dialog(first, second), **extra}
    record["action_token_lengths"] = [3, 5]
    return Trajectory.from_record(record)


def _credit(trajectories: list[Trajectory], config: CreditConfig):
    return compute_batch_credit(
        trajectory_scores([t.reward for t in trajectories]),
        [t.uid for t in trajectories],
        [t.action_lengths for t in trajectories],
        config,
        anchor_states=anchor_states_of(trajectories, config),
        turn_rewards=turn_rewards_of(trajectories),
    )


def test_registry_lists_every_estimator_and_refuses_duplicates() -> None:
    assert set(estimator_names()) == {"grpo", "iapo", "call_credit", "gigpo", "turn_reward", "info_gain"}
    assert get_estimator("iapo").needs == {"influence_graphs"}
    with pytest.raises(ValueError, match="unknown estimator 'nope'"):
        get_estimator("nope")
    with pytest.raises(ValueError, match="credit estimator must be one of"):
        CreditConfig(estimator="nope")

    class Again(Estimator):
        name = "iapo"

    with pytest.raises(ValueError, match="already registered"):
        register_estimator(Again)

    class Unknown(Estimator):
        name = "needs_magic"
        needs = frozenset({"magic"})

    with pytest.raises(ValueError, match="unknown inputs"):
        register_estimator(Unknown)
    assert "needs_magic" not in estimator_names()


def test_gigpo_mean_norm_by_hand() -> None:
    # a and b share the first state (same prompt) and, with the same first reply, the second one
    # too; c's second state differs; d is alone in its uid
    batch = [
        _trajectory("a", "u", 1.0, "Which order?", "Refunded."),
        _trajectory("b", "u", 0.0, "Which order?", "Sorry."),
        _trajectory("c", "u", 0.0, "Hello!", "Done."),
        _trajectory("d", "v", 1.0, "Hi", "Ok"),
    ]
    credit = _credit(batch, CreditConfig(estimator="gigpo"))
    mean_u = 1.0 / 3.0
    episode = [1 - mean_u, -mean_u, -mean_u, 1.0]  # mean_norm: no std division; a group of one: R
    # R_i = gamma^(T-1-i) R: a (0.95, 1), b and c (0, 0), d (0.95, 1)
    first_mean = GAMMA / 3.0  # state 0 shared by a, b, c
    second_mean = 1.0 / 2.0  # state 1 shared by a, b only
    expected = [
        [episode[0] + (GAMMA - first_mean), episode[0] + (1.0 - second_mean)],
        [episode[1] + (0.0 - first_mean), episode[1] + (0.0 - second_mean)],
        [episode[2] + (0.0 - first_mean), episode[2] + 0.0],
        [episode[3] + 0.0, episode[3] + 0.0],
    ]
    for row, values in enumerate(expected):
        assert credit.advantages_of(row) == pytest.approx(values, abs=1e-6)
    assert credit.additive and credit.weights_of(0) == [1.0, 1.0]
    matched = credit.extras["anchor_matched"]
    assert float(matched.sum()) / 8 == pytest.approx(5 / 8)  # a0 b0 c0 a1 b1


def test_gigpo_mean_std_norm_weight_gamma_and_state_reach_the_math() -> None:
    batch = [
        _trajectory("a", "u", 1.0, "Which order?", "Refunded."),
        _trajectory("b", "u", 0.0, "Which order?", "Sorry."),
    ]
    config = CreditConfig(
        estimator="gigpo", gigpo=GiGPOConfig(mode="mean_std_norm", step_advantage_w=0.5, gamma=0.8, eps=1e-3)
    )
    credit = _credit(batch, config)
    sigma_episode = math.sqrt(0.5)  # torch.std of (1, 0)
    episode = 0.5 / (sigma_episode + 1e-6)  # the episode advantage keeps GRPO's epsilon
    step0 = (0.8 - 0.4) / (math.sqrt(((0.8 - 0.4) ** 2) * 2) + 1e-3)  # state 0: R = (0.8, 0)
    step1 = (1.0 - 0.5) / (math.sqrt(0.5) + 1e-3)  # state 1: R = (1, 0)
    assert credit.advantages_of(0) == pytest.approx([episode + 0.5 * step0, episode + 0.5 * step1], abs=1e-5)
    assert credit.advantages_of(1) == pytest.approx([-episode - 0.5 * step0, -episode - 0.5 * step1], abs=1e-5)
    # last_observation: the second actions' observations are both "it is #W1" -> matched even
    # after different first replies
    other = [
        _trajectory("a", "u", 1.0, "Which order?", "Refunded."),
        _trajectory("c", "u", 0.0, "Hello!", "Done."),
    ]
    prefix = _credit(other, CreditConfig(estimator="gigpo"))
    coarse = _credit(other, CreditConfig(estimator="gigpo", gigpo=GiGPOConfig(state="last_observation")))
    assert prefix.extras["anchor_matched"][:, 1].tolist() == [0.0, 0.0]
    assert coarse.extras["anchor_matched"][:, 1].tolist() == [1.0, 1.0]


def test_turn_reward_leave_one_out_by_hand() -> None:
    batch = [
        _trajectory("a", "u", 0.0, "Which order?", "Refunded.", turn_rewards=[1.0, 0.0]),
        _trajectory("b", "u", 0.0, "Which order?", "Sorry.", turn_rewards=[0.0, 1.0]),
        _trajectory("c", "u", 0.0, "Hello!", "Done.", turn_rewards=[0.0, 0.0]),
        _trajectory("d", "v", 1.0, "Hi", "Ok"),  # no turn rewards: plain GRPO credit
    ]
    credit = _credit(batch, CreditConfig(estimator="turn_reward", turn_reward=TurnRewardConfig(lambda_turn=2.0)))
    # G (gamma 1): a (1, 0), b (1, 1), c (0, 0). Action 0: one state for all three (others' mean);
    # action 1: a and b share a state (each other's G), c falls back to the turn index (a, b)
    assert credit.advantages_of(0) == pytest.approx([2 * (1 - 0.5), 2 * (0 - 1)])
    assert credit.advantages_of(1) == pytest.approx([2 * (1 - 0.5), 2 * (1 - 0)])
    assert credit.advantages_of(2) == pytest.approx([2 * (0 - 1), 2 * (0 - 0.5)])
    assert credit.advantages_of(3) == pytest.approx([1.0, 1.0])  # its own group: A_tau = R
    discounted = _credit(batch, CreditConfig(estimator="turn_reward", turn_reward=TurnRewardConfig(gamma=0.5)))
    # gamma 0.5: G_a0 = 1, G_b0 = 0.5, G_c0 = 0 -> a0: 1 - (0.5 + 0) / 2
    assert discounted.advantages_of(0)[0] == pytest.approx(1 - 0.25)


def test_turn_reward_is_grpo_without_turn_rewards() -> None:
    batch = [_trajectory("a", "u", 1.0, "x", "y"), _trajectory("b", "u", 0.0, "x", "z")]
    turn = _credit(batch, CreditConfig(estimator="turn_reward"))
    grpo = _credit(batch, CreditConfig(estimator="grpo"))
    assert torch.equal(turn.action_advantage, grpo.action_advantage)


def test_malformed_turn_rewards_name_the_trajectory() -> None:
    with pytest.raises(ValueError, match=r"trajectory 'a'.*2 actions"):
        turn_rewards_of([_trajectory("a", "u", 1.0, "x", "y", turn_rewards=[1.0])])
    with pytest.raises(ValueError, match=r"turn_rewards\[1\] must be finite"):
        turn_rewards_of([_trajectory("a", "u", 1.0, "x", "y", turn_rewards=[1.0, float("nan")])])


def test_route_cli_runs_gigpo_and_turn_reward_on_the_examples(tmp_path: Path, capsys) -> None:
    examples = sorted((Path(__file__).parents[2] / "examples").glob("*.jsonl"))
    rollouts = next(p for p in examples if "rollout" in p.name)
    for estimator in ("gigpo", "turn_reward"):
        out = tmp_path / f"{estimator}.jsonl"
        assert cli_main(["route", "--input", str(rollouts), "--out", str(out), "--estimator", estimator]) == 0
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert lines and all(line["estimator"] == estimator for line in lines)
        assert all(math.isfinite(a["advantage"]) for line in lines for a in line["actions"])
    assert "anchor match rate" in capsys.readouterr().out


def test_yaml_credit_node_equals_the_dataclass_defaults() -> None:
    from omegaconf import OmegaConf

    node = OmegaConf.load(Path(__file__).parents[2] / "verl_credit/config/credit_trainer.yaml").credit
    values = {k: OmegaConf.to_container(node[k]) for k in ("iapo", "call_credit", "gigpo", "turn_reward")}
    values["epsilon"] = node.epsilon
    assert CreditConfig.from_mapping(values, estimator="grpo") == CreditConfig(estimator="grpo")
