"""From an estimator's ``needs`` to its inputs, and the inputs that come straight from a trajectory.

:func:`gather_needs` is the one step from ``Estimator.needs`` to the fields of
``EstimatorInputs``: each consumer (the offline pipeline, the rollout's annotation, the trainer's
step, the offline check of a training run) passes what it can provide, one callable per need,
and gets the fields the estimator asked for -- no consumer tests a need itself.

The rest reads anchor states, per-turn rewards and (offline) per-action information gains from
trajectories (no annotator); shared by the offline pipeline and the trainer."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from verl_credit.anchor_states import anchor_states
from verl_credit.estimators.registry import NEEDS

if TYPE_CHECKING:
    from verl_credit.config import CreditConfig
    from verl_credit.trajectory import Trajectory

__all__ = [
    "INFORMATION_GAINS_KEY",
    "NEED_FIELDS",
    "TURN_REWARDS_KEY",
    "TURN_REWARD_LIMIT",
    "anchor_states_of",
    "check_information_gains",
    "check_turn_rewards",
    "gather_needs",
    "information_gains_of",
    "turn_reward_problem",
    "turn_rewards_of",
]

#: the rollout-record field (and agent-loop payload key) of per-action environment rewards
TURN_REWARDS_KEY = "turn_rewards"
#: the largest turn reward in magnitude. With it, every credit term stays finite even in float32
#: (whose largest value is 3.4e38): a turn return ``G_i`` of T actions is at most ``T * 1e18``
#: (gamma <= 1), ``G_i - b_i`` at most twice that, and ``lambda_turn`` (or ``step_advantage_w``)
#: at most ``config_rules.MAX_WEIGHT = 1e6``, so the turn term of a trajectory of up to 1e11
#: actions is below 1e36.
TURN_REWARD_LIMIT = 1e18
#: the rollout-record field of per-action information gains (``info_gain``): one number or null per
#: action, the gain of the feedback after that action (``verl_credit.credit_math.info_gain`` eq. 1)
INFORMATION_GAINS_KEY = "information_gains"


#: the ``EstimatorInputs`` field each need fills
NEED_FIELDS: dict[str, str] = {need: need for need in NEEDS} | {"influence_graphs": "graphs"}
T = TypeVar("T")


def gather_needs(
    needs: Iterable[str],
    providers: Mapping[str, Callable[[], T]],
    *,
    estimator: str,
    where: str,
    partial: bool = False,
) -> dict[str, T]:
    """Call the provider of each need in ``needs``, in :data:`~verl_credit.estimators.registry.NEEDS`
    order (a provider may use what an earlier one made); providers of needs not asked for are not
    called.

    Args:
        needs: what the estimator needs (``Estimator.needs``).
        providers: need -> a callable that returns its value (for async consumers, a coroutine).
        estimator, where: the estimator's and the consumer's names, for the error.
        partial: ``True`` when the consumer provides only some needs (e.g. what a rollout
            annotates); ``False``: a need without a provider is an error.

    Returns:
        ``EstimatorInputs`` field name (:data:`NEED_FIELDS`) -> the provider's value.

    Raises:
        ValueError: ``partial`` is false and ``where`` cannot provide a need (naming both).
    """
    wanted = set(needs)
    gathered: dict[str, T] = {}
    for need in NEEDS:
        if need not in wanted:
            continue
        provider = providers.get(need)
        if provider is None:
            if partial:
                continue
            raise ValueError(
                f"the {estimator} estimator needs {need}, which {where} cannot provide (it provides "
                f"{', '.join(n for n in NEEDS if n in providers)})"
            )
        gathered[NEED_FIELDS[need]] = provider()
    return gathered


def anchor_states_of(trajectories: Sequence[Trajectory], config: CreditConfig) -> list[list[str]]:
    """Per-action anchor states (``credit.gigpo.state``) of each trajectory."""
    return [anchor_states(trajectory, config.gigpo.state) for trajectory in trajectories]


def turn_reward_problem(value: Any, num_actions: int) -> str | None:
    """What is wrong with a record's ``turn_rewards`` (``None``: absent or fine): not a list, the
    wrong length, an entry that is not a finite number or lies beyond :data:`TURN_REWARD_LIMIT`."""
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        return f"{TURN_REWARDS_KEY} must be a list of numbers, got {type(value).__name__}"
    if len(value) != num_actions:
        return f"{TURN_REWARDS_KEY} has {len(value)} entries for {num_actions} actions"
    for position, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int | float):
            return f"{TURN_REWARDS_KEY}[{position}] must be a number, got {item!r}"
        try:
            number = float(item)
        except OverflowError:  # an int beyond float
            number = math.inf
        if not math.isfinite(number):
            return f"{TURN_REWARDS_KEY}[{position}] must be finite, got {item!r}"
        if abs(number) > TURN_REWARD_LIMIT:
            return (
                f"{TURN_REWARDS_KEY}[{position}] is {number:g}: a turn reward must lie within "
                f"+-{TURN_REWARD_LIMIT:g} (a larger one overflows the credit)"
            )
    return None


def check_turn_rewards(value: Any, num_actions: int, where: str) -> list[float] | None:
    """``value`` as one finite reward per action, ``None`` when absent; ``ValueError`` naming
    ``where`` when it is malformed (:func:`turn_reward_problem`)."""
    problem = turn_reward_problem(value, num_actions)
    if problem is not None:
        raise ValueError(f"{where}: {problem}")
    return None if value is None else [float(item) for item in value]


def turn_rewards_of(trajectories: Sequence[Trajectory]) -> list[list[float] | None]:
    """The ``turn_rewards`` field of each trajectory's record (``None`` where it has none)."""
    return [
        check_turn_rewards(t.extra.get(TURN_REWARDS_KEY), t.num_actions, f"trajectory {t.id!r}") for t in trajectories
    ]


def check_information_gains(value: Any, num_actions: int, where: str) -> list[float | None] | None:
    """``value`` as one finite gain or ``None`` per action, ``None`` when absent; ``ValueError``
    naming ``where`` when it is malformed (not a list, wrong length, not a finite number or null)."""
    if value is None:
        return None
    key = INFORMATION_GAINS_KEY
    if not isinstance(value, list | tuple):
        raise ValueError(f"{where}: {key} must be a list of numbers or nulls, got {type(value).__name__}")
    if len(value) != num_actions:
        raise ValueError(f"{where}: {key} has {len(value)} entries for {num_actions} actions")
    gains: list[float | None] = []
    for position, item in enumerate(value):
        if item is None:
            gains.append(None)
            continue
        if isinstance(item, bool) or not isinstance(item, int | float) or not math.isfinite(float(item)):
            raise ValueError(f"{where}: {key}[{position}] must be a finite number or null, got {item!r}")
        gains.append(float(item))
    return gains


def information_gains_of(trajectories: Sequence[Trajectory]) -> list[list[float | None] | None]:
    """The ``information_gains`` field of each trajectory's record (``None`` where it has none)."""
    return [
        check_information_gains(t.extra.get(INFORMATION_GAINS_KEY), t.num_actions, f"trajectory {t.id!r}")
        for t in trajectories
    ]
