"""The demo service world: an evolving-state retail back office with a scripted customer.

Registered as environment ``"service"`` (``build_environment("service")``); see ``env.py``.
"""

from verl_credit.envs.service.env import ServiceEnvironment, ServiceEpisode
from verl_credit.envs.service.tasks import VARIANTS, ServiceTask, build_task, expected_database

__all__ = ["VARIANTS", "ServiceEnvironment", "ServiceEpisode", "ServiceTask", "build_task", "expected_database"]
