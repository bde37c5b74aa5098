"""Groups of scripted-agent rollouts in the service world, as rollouts-JSONL records (docs/design.md section 8)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from verl_credit.envs.service.agent import MACROS, Episode, LinearSoftmaxPolicy, run_episode
from verl_credit.envs.service.env import ServiceEpisode
from verl_credit.trajectory import Trajectory

__all__ = ["Rollout", "episode_record", "sample_groups"]


@dataclass
class Rollout:
    """One sampled rollout: its record, the parsed trajectory and the agent's ground truth."""

    record: dict[str, Any]
    trajectory: Trajectory
    episode: Episode


def episode_record(episode: Episode, trajectory_id: str, uid: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The rollouts-JSONL line of an episode; ``ground_truth`` is an extra key (ignored by the
    annotators) with the actions the outcome really depended on and the mistakes."""
    return {
        "id": trajectory_id,
        "uid": uid,
        "reward": episode.reward,
        "messages": episode.messages,
        "graph": None,
        "task": spec,
        "ground_truth": {
            "macros": [MACROS[m] for m in episode.macros],
            "causal": [i for i, flag in enumerate(episode.causal) if flag],
            "mistakes": [i for i, flag in enumerate(episode.mistakes) if flag],
        },
    }


def sample_groups(
    groups: int,
    group_size: int,
    seed: int = 0,
    variant: str = "mixed",
    policy: LinearSoftmaxPolicy | None = None,
) -> list[Rollout]:
    """``groups`` tasks (``variant``, task seeds derived from ``seed``) x ``group_size`` rollouts each,
    from the stochastic scripted agent (``policy``, default: the prior). Deterministic in ``seed``."""
    if groups < 1 or group_size < 1:
        raise ValueError(f"groups and group_size must be >= 1, got {groups} and {group_size}")
    agent = policy or LinearSoftmaxPolicy()
    rng = np.random.default_rng(seed)
    rollouts = []
    for group in range(groups):
        spec = {"variant": variant, "seed": seed * 1000 + group}
        uid = f"{variant}-{spec['seed']}"
        for sample in range(group_size):
            episode = run_episode(ServiceEpisode(spec), lambda phi, turn: agent.sample(phi, rng))
            record = episode_record(episode, f"{uid}/{sample}", uid, spec)
            trajectory = Trajectory.from_record(record)
            record["action_token_lengths"] = trajectory.action_lengths
            rollouts.append(Rollout(record, trajectory, episode))
    return rollouts
