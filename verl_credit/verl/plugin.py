"""Target of the ``verl.plugins`` entry point: registers verl-credit in every process that
imports verl (driver, TaskRunner actor, agent-loop workers).

``pyproject.toml`` declares ``[project.entry-points."verl.plugins"] verl_credit =
"verl_credit.verl.plugin"``; ``verl/__init__.py`` loads every such entry point. It swallows load
errors at DEBUG level, so this module prints a failure loudly to stderr (with the traceback)
before re-raising -- a registration that silently did not happen would only show up later as
"Unknown trainer 'credit_sync'" inside a Ray actor.

Registered:
    advantage estimators ``iapo``, ``call_credit``, ... every credit estimator (guards: they explain what to set)
    trainer mode          ``credit_sync``           (CreditTrainerSync)
    agent loop            ``credit_agent``          (CreditAgentLoop)
and a start-up check: verl's ``validate_config`` (called by ``verl.trainer.main_ppo`` before Ray
starts) first rejects a credit estimator selected without the credit trainer.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

__all__ = ["register"]

_MARK = "_verl_credit_checked"


def _wrap_validate_config() -> None:
    """Put ``settings.check_trainer_selection`` in front of verl's ``validate_config``.

    ``verl.trainer.main_ppo`` binds ``validate_config`` with ``from verl.utils.config import``
    after ``import verl`` has loaded this plugin, so it binds the wrapper. The original runs
    unchanged after the check.
    """
    import verl.utils.config as verl_config

    original = verl_config.validate_config
    if getattr(original, _MARK, False):
        return

    from verl_credit.verl.settings import check_trainer_selection

    def validate_config(config: Any, *args: Any, **kwargs: Any) -> Any:
        check_trainer_selection(config)
        return original(config, *args, **kwargs)

    setattr(validate_config, _MARK, True)
    validate_config.__doc__ = original.__doc__
    verl_config.validate_config = validate_config


def register() -> None:
    # First the CPU platform (a no-op unless VERL_PLATFORM=cpu): importing the trainer below
    # already asks verl for the platform, which must then be registered.
    # Imported for their registrations: @register("credit_agent"), register_adv_est guards for
    # every credit estimator (iapo, call_credit, ...), @register_trainer("credit_sync").
    import verl_credit.verl.agent_loop
    import verl_credit.verl.cpu.register
    import verl_credit.verl.estimators
    import verl_credit.verl.trainer  # noqa: F401

    _wrap_validate_config()


try:
    register()
except BaseException:
    print(
        f"[verl_credit] ERROR: the verl plugin failed to register (pid {os.getpid()}); "
        "trainer mode 'credit_sync', agent loop 'credit_agent' and the credit estimators' guards are NOT available:\n"
        + traceback.format_exc(),
        file=sys.stderr,
        flush=True,
    )
    raise
