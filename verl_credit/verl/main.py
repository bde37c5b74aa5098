"""Hydra entry point: ``python -m verl_credit.main [overrides...]``.

Composes ``verl_credit/config/credit_trainer.yaml`` (verl's ``ppo_trainer`` + the ``credit``
node), validates the ``credit`` node and the trainer selection *before* Ray or any worker
starts (a bad value exits with status 2 and one line naming the key), then runs verl's own
``run_ppo`` with verl's V1 TaskRunner; the ``verl.plugins`` entry point registers
``credit_sync`` / ``credit_agent`` inside every Ray actor.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from verl_credit.verl.settings import CreditSettings, check_trainer_selection, load_settings

__all__ = ["CONFIG_DIR", "CONFIG_NAME", "main", "run", "validate"]

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "config")
CONFIG_NAME = "credit_trainer"


def validate(config: DictConfig) -> CreditSettings:
    """Everything checkable without workers: the ``credit`` node (``CreditConfig.from_mapping``
    and the runtime settings) and that a credit estimator runs under the credit trainer.

    Raises:
        ValueError: naming the offending key.
    """
    settings = load_settings(config)
    check_trainer_selection(config)
    return settings


def run(config: DictConfig, task_runner_class: Any = None) -> None:
    """Validate, then train exactly like ``verl.trainer.main_ppo.main``."""
    validate(config)
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=task_runner_class or TaskRunnerV1)


@hydra.main(config_path=CONFIG_DIR, config_name=CONFIG_NAME, version_base=None)
def _hydra_main(config: DictConfig) -> None:
    try:
        validate(config)
    except ValueError as exc:
        print(f"verl_credit.main: error: {exc}", file=sys.stderr)
        sys.exit(2)
    run(config)


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
