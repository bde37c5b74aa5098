"""verl-credit's estimators in verl's legacy advantage-estimator registry -- as guards.

A registered estimator only receives ``token_level_rewards, response_mask, index, config``
(verl 0.9.1's ``compute_advantage``): no transcript, no graph. Dependency-aware credit therefore cannot run
there. Every credit estimator of ``verl_credit.estimators`` (``iapo``, ``call_credit``, ``gigpo``, ...,
plug-ins included; not ``grpo``, which is verl's own) is registered anyway, so that a run which
selects one through the stock path (``trainer.v1.trainer_mode=sync`` or ``trainer.use_v1=false``)
fails with a message that says what to set, instead of verl's generic "unknown estimator". A name
verl itself already registers is left to verl.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

from verl_credit.verl.settings import credit_estimators, wrong_trainer_message

__all__ = ["GUARDS", "register_guards"]

#: estimator name -> the guard registered for it in verl's registry
GUARDS: dict[str, Callable[..., NoReturn]] = {}


def _refuse(estimator: str) -> Callable[..., NoReturn]:
    def compute_advantage(
        token_level_rewards: Any = None, response_mask: Any = None, config: Any = None, index: Any = None, **kwargs: Any
    ) -> NoReturn:
        raise ValueError(wrong_trainer_message(estimator))

    compute_advantage.__name__ = f"compute_{estimator}_advantage_needs_credit_trainer"
    compute_advantage.__qualname__ = compute_advantage.__name__
    return compute_advantage


def register_guards() -> dict[str, Callable[..., NoReturn]]:
    """Register a guard for every credit estimator verl does not know; idempotent."""
    for name in credit_estimators():
        if name in GUARDS or name in ADV_ESTIMATOR_REGISTRY:
            continue
        GUARDS[name] = register_adv_est(name)(_refuse(name))
    return GUARDS


register_guards()
