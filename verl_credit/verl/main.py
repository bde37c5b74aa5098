"""Hydra entry point: ``python -m verl_credit.main [overrides...]``.

Composes ``verl_credit/config/credit_trainer.yaml`` (verl's ``ppo_trainer`` + the ``credit``
node), validates the ``credit`` node, the trainer selection, the annotation cache's location and
the experiment logger's credentials *before* Ray or any worker starts (a bad value exits with
status 2 and one line naming the key), then runs verl's own ``run_ppo`` with verl's V1
TaskRunner; the ``verl.plugins`` entry point registers ``credit_sync`` / ``credit_agent`` inside
every Ray actor.
"""

from __future__ import annotations

import logging
import netrc
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import hydra
from omegaconf import DictConfig, OmegaConf

from verl_credit.verl.settings import (
    MOUNTS_PATH,
    CreditSettings,
    check_cache_location,
    check_trainer_selection,
    load_settings,
)

__all__ = ["CONFIG_DIR", "CONFIG_NAME", "WANDB_LOGGERS", "check_logger", "main", "run", "validate"]

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "config")
CONFIG_NAME = "credit_trainer"
#: ``trainer.logger`` backends that call ``wandb.init`` (``tracking`` is verl's deprecated alias)
WANDB_LOGGERS = ("wandb", "tracking")
#: ``WANDB_MODE`` values that need no API key
_WANDB_KEYLESS_MODES = ("offline", "disabled", "dryrun")

logger = logging.getLogger(__name__)


def validate(
    config: DictConfig,
    *,
    environ: Mapping[str, str] | None = None,
    mounts_path: str | os.PathLike[str] = MOUNTS_PATH,
) -> CreditSettings:
    """Everything checkable without workers: the ``credit`` node (``CreditConfig.from_mapping``
    and the runtime settings), that a credit estimator runs under the credit trainer, where the
    annotation cache lives (:func:`verl_credit.verl.settings.check_cache_location`; a warning is
    logged for a single-node cache on a network filesystem) and that a ``wandb`` logger has
    credentials (:func:`check_logger`).

    ``environ`` (default ``os.environ``) and ``mounts_path`` (default ``/proc/mounts``) are for tests.

    Raises:
        ValueError: naming the offending key.
    """
    settings = load_settings(config)
    check_trainer_selection(config)
    warning = check_cache_location(config, mounts_path=mounts_path)
    if warning:
        logger.warning("verl_credit.main: %s", warning)
    check_logger(config, environ=environ)
    check_environment_options(settings)
    return settings


def check_environment_options(settings: CreditSettings) -> None:
    """Build ``credit.env.name`` with ``credit.env.options`` once, starting nothing: every
    environment checks its own options in its constructor, and a bad one (an unknown key, a string
    where a switch belongs) then fails here, before any worker, instead of in every episode.

    Raises:
        ValueError: naming ``credit.env.options`` and the option.
    """
    if not settings.env.name:
        return
    from verl_credit.envs.base import build_environment

    try:
        build_environment(str(settings.env.name), **dict(settings.env.options))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"credit.env.options (environment {settings.env.name!r}): {exc}") from exc


def check_logger(config: Any, *, environ: Mapping[str, str] | None = None) -> None:
    """Fail before Ray when ``trainer.logger`` includes ``wandb`` but ``wandb.init`` would find no
    credentials (it would fail only after every worker is built): accepted are ``WANDB_API_KEY``,
    a netrc entry (``$NETRC`` or ``~/.netrc``, as ``wandb login`` writes it) for the API host
    (``WANDB_BASE_URL``'s, default ``api.wandb.ai``), or ``WANDB_MODE`` offline/disabled.

    Raises:
        ValueError: naming ``trainer.logger`` and how to fix it.
    """
    trainer = config.get("trainer") if "trainer" in config else None
    loggers = (trainer or {}).get("logger")
    if loggers is None:
        return
    if OmegaConf.is_config(loggers):
        loggers = OmegaConf.to_container(loggers, resolve=True)
    names = [loggers] if isinstance(loggers, str) else list(loggers or ())
    if not any(str(name) in WANDB_LOGGERS for name in names):
        return
    env = os.environ if environ is None else environ
    if env.get("WANDB_MODE", "").strip().lower() in _WANDB_KEYLESS_MODES:
        return
    if env.get("WANDB_DISABLED", "").strip().lower() in ("true", "1", "yes"):
        return
    if env.get("WANDB_API_KEY", "").strip():
        return
    host = urlparse(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    home = env.get("HOME") or os.path.expanduser("~")
    netrc_path = Path(env["NETRC"]) if env.get("NETRC") else Path(home) / ".netrc"
    if _netrc_has_password(netrc_path, host):
        return
    raise ValueError(
        f"trainer.logger={names} includes wandb, but no W&B credentials were found: WANDB_API_KEY is not set, "
        f"{netrc_path} has no entry for {host} (`wandb login` writes one) and WANDB_MODE is not offline or "
        f"disabled; wandb.init would fail only after all workers are built. Set WANDB_API_KEY, run `wandb login`, "
        f"set WANDB_MODE=offline, or log to the console only: trainer.logger='[console]' "
        f"(recipes: leave LOGGER unset)"
    )


def _netrc_has_password(path: Path, host: str) -> bool:
    """Whether the netrc file at ``path`` has a ``machine host`` entry with a password."""
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def run(config: DictConfig, task_runner_class: Any = None) -> None:
    """Validate, then train exactly like ``verl.trainer.main_ppo.main``."""
    validate(config)
    _train(config, task_runner_class)


def _train(config: DictConfig, task_runner_class: Any = None) -> None:
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
    _train(config)


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
