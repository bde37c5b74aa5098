"""``iapo`` / ``call_credit`` in verl's legacy advantage-estimator registry -- as guards.

A registered estimator only receives ``token_level_rewards, response_mask, index, config``
(verl 0.9.1's ``compute_advantage``): no transcript, no graph. Dependency-aware credit therefore cannot run
there. The names are registered anyway so that a run which selects them through the stock
path (``trainer.v1.trainer_mode=sync`` or ``trainer.use_v1=false``) fails with a message that
says what to set, instead of verl's generic "unknown estimator".
"""

from __future__ import annotations

from typing import Any, NoReturn

from verl.trainer.ppo.core_algos import register_adv_est

from verl_credit.verl.settings import wrong_trainer_message

__all__ = ["compute_call_credit_advantage", "compute_iapo_advantage"]


def _refuse(estimator: str) -> Any:
    def compute_advantage(
        token_level_rewards: Any = None, response_mask: Any = None, config: Any = None, index: Any = None, **kwargs: Any
    ) -> NoReturn:
        raise ValueError(wrong_trainer_message(estimator))

    compute_advantage.__name__ = f"compute_{estimator}_advantage_needs_credit_trainer"
    compute_advantage.__qualname__ = compute_advantage.__name__
    return compute_advantage


compute_iapo_advantage = register_adv_est("iapo")(_refuse("iapo"))
compute_call_credit_advantage = register_adv_est("call_credit")(_refuse("call_credit"))
