"""The inputs an estimator ``needs`` that come straight from a trajectory (no annotator):
anchor states and per-turn rewards. Shared by the offline pipeline and the trainer."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from verl_credit.anchor_states import anchor_states

if TYPE_CHECKING:
    from verl_credit.config import CreditConfig
    from verl_credit.trajectory import Trajectory

__all__ = ["TURN_REWARDS_KEY", "anchor_states_of", "check_turn_rewards", "turn_rewards_of"]

#: the rollout-record field (and agent-loop payload key) of per-action environment rewards
TURN_REWARDS_KEY = "turn_rewards"


def anchor_states_of(trajectories: Sequence[Trajectory], config: CreditConfig) -> list[list[str]]:
    """Per-action anchor states (``credit.gigpo.state``) of each trajectory."""
    return [anchor_states(trajectory, config.gigpo.state) for trajectory in trajectories]


def check_turn_rewards(value: Any, num_actions: int, where: str) -> list[float] | None:
    """``value`` as one finite reward per action, ``None`` when absent; ``ValueError`` naming
    ``where`` when it is malformed (not a list, wrong length, not a finite number)."""
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        raise ValueError(f"{where}: {TURN_REWARDS_KEY} must be a list of numbers, got {type(value).__name__}")
    if len(value) != num_actions:
        raise ValueError(f"{where}: {TURN_REWARDS_KEY} has {len(value)} entries for {num_actions} actions")
    rewards: list[float] = []
    for position, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise ValueError(f"{where}: {TURN_REWARDS_KEY}[{position}] must be a number, got {item!r}")
        number = float(item)
        if not math.isfinite(number):
            raise ValueError(f"{where}: {TURN_REWARDS_KEY}[{position}] must be finite, got {item!r}")
        rewards.append(number)
    return rewards


def turn_rewards_of(trajectories: Sequence[Trajectory]) -> list[list[float] | None]:
    """The ``turn_rewards`` field of each trajectory's record (``None`` where it has none)."""
    return [
        check_turn_rewards(t.extra.get(TURN_REWARDS_KEY), t.num_actions, f"trajectory {t.id!r}") for t in trajectories
    ]
