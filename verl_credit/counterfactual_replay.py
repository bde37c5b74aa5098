"""Counterfactual replay of model calls: what a replay needs and how a step runs them.

* :class:`ReplayEnvironment` -- an environment that re-executes a finished trajectory with one
  call's tool call replaced (``verl_credit.envs.coding.CodingEnvironment.replay``);
* :class:`EditProposer` -- proposes the alternative of a call; built by name
  (:func:`build_edit_proposer`; ``remove``, the default, drops the call);
* :func:`run_replays` -- a step's replays, concurrently, each with a time limit; failures are
  returned (and counted by the trainer), never raised.

The effect ``Delta_k = R(tau) - R(tau')`` of each replay feeds the tensor math of
``verl_credit.credit_math.call_adjustments`` (counterfactual calibration, IG down-weighting).
"""

from __future__ import annotations

import asyncio
import importlib
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from verl_credit.trajectory import Trajectory

__all__ = [
    "EDIT_PROPOSERS",
    "AlternativeEdit",
    "CounterfactualResult",
    "EditProposer",
    "RemoveCallProposer",
    "ReplayEnvironment",
    "ReplayFailure",
    "ReplayRequest",
    "build_edit_proposer",
    "edit_proposer_factory",
    "register_edit_proposer",
    "run_replays",
]


@runtime_checkable
class ReplayEnvironment(Protocol):
    """An environment that re-executes a finished trajectory with one call's tool call replaced.

    ``replacement_arguments`` are the new arguments of the call's (first) tool call, or ``None`` to
    drop it; the return value (or awaitable) is the reward ``R(tau')`` of the replayed trajectory.
    ``verl_credit.envs.coding.CodingEnvironment.replay`` implements it.
    """

    def replay(
        self,
        trajectory_messages: Sequence[Mapping[str, Any]],
        call_index: int,
        replacement_arguments: Mapping[str, Any] | None,
    ) -> float | Awaitable[float]: ...


@dataclass(frozen=True)
class AlternativeEdit:
    """A counterfactual for one AE call: new tool-call arguments (``None``: drop the call)."""

    arguments: Mapping[str, Any] | None
    source: str = ""  # e.g. "second-best sample"


@runtime_checkable
class EditProposer(Protocol):
    """Proposes the alternative edit of call ``call_index`` (``None``: no alternative, skip it)."""

    def propose(self, trajectory: Trajectory, call_index: int) -> AlternativeEdit | None: ...


@dataclass(frozen=True)
class CounterfactualResult:
    """One replay: ``delta = reward - counterfactual_reward`` (``Delta_k = R(tau) - R(tau')``)."""

    row: int
    call_index: int
    trajectory_id: str
    original_arguments: Mapping[str, Any] | None
    alternative: AlternativeEdit
    reward: float
    counterfactual_reward: float

    @property
    def delta(self) -> float:
        return self.reward - self.counterfactual_reward


class RemoveCallProposer:
    """``remove``: the alternative of a call is *not making it* (its first tool call is dropped):
    "what if this edit (or read) had not been made". Model-free; calls without a tool call have no
    alternative (``None``)."""

    def propose(self, trajectory: Trajectory, call_index: int) -> AlternativeEdit | None:
        if not trajectory.actions[call_index].tool_calls:
            return None
        return AlternativeEdit(None, source="remove")


#: edit proposers by name (``credit.call_credit.counterfactual.proposer``)
EDIT_PROPOSERS: dict[str, Callable[[], EditProposer]] = {"remove": RemoveCallProposer}


def register_edit_proposer(name: str) -> Callable[[Callable[[], EditProposer]], Callable[[], EditProposer]]:
    """Register a proposer factory (a class without constructor arguments) under ``name``."""

    def decorator(factory: Callable[[], EditProposer]) -> Callable[[], EditProposer]:
        existing = EDIT_PROPOSERS.get(name)
        if existing is not None and existing is not factory:
            raise ValueError(f"edit proposer {name!r} is already registered to {existing}")
        EDIT_PROPOSERS[name] = factory
        return factory

    return decorator


def edit_proposer_factory(name: str) -> Callable[[], EditProposer]:
    """The factory registered as ``name``, or the class at ``package.module:Class`` (not built).

    Raises:
        ValueError: unknown name or import failure.
    """
    factory = EDIT_PROPOSERS.get(name)
    if factory is None and ":" in name:
        module, _, attribute = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot import edit proposer {name!r}: {exc}") from None
    if factory is None:
        raise ValueError(
            f"unknown edit proposer {name!r}; registered: {sorted(EDIT_PROPOSERS)} (or give package.module:Class)"
        )
    return factory


def build_edit_proposer(name: str) -> EditProposer:
    """An instance of :func:`edit_proposer_factory`'s factory.

    Raises:
        ValueError: unknown name, import failure, or an object without ``propose``.
    """
    proposer = edit_proposer_factory(name)()
    if not isinstance(proposer, EditProposer):
        raise ValueError(f"edit proposer {name!r} has no propose(trajectory, call_index) method")
    return proposer


@dataclass(frozen=True)
class ReplayRequest:
    """One call to replay: its place in the batch, its trajectory, the alternative and ``R(tau)``."""

    row: int
    call_index: int
    trajectory: Trajectory
    alternative: AlternativeEdit
    reward: float


@dataclass(frozen=True)
class ReplayFailure:
    """A replay that raised, timed out or returned a non-finite reward (counted, never raised)."""

    row: int
    call_index: int
    error: str


async def run_replays(
    requests: Sequence[ReplayRequest],
    replay: Callable[[ReplayRequest], Awaitable[float]],
    concurrency: int = 4,
    timeout: float = 300.0,
) -> tuple[list[CounterfactualResult], list[ReplayFailure]]:
    """Run ``replay`` (which returns ``R(tau')``) for every request, ``concurrency`` at a time, each
    limited to ``timeout`` seconds. Results and failures keep the order of ``requests``."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    gate = asyncio.Semaphore(concurrency)

    async def one(request: ReplayRequest) -> CounterfactualResult | ReplayFailure:
        async with gate:
            try:
                value = float(await asyncio.wait_for(replay(request), timeout))
            except TimeoutError:
                return ReplayFailure(request.row, request.call_index, f"replay timed out after {timeout} s")
            except Exception as exc:  # a replay never stops training; the caller counts it
                return ReplayFailure(request.row, request.call_index, f"{type(exc).__name__}: {exc}")
        if not math.isfinite(value):
            return ReplayFailure(request.row, request.call_index, f"replay returned {value}")
        action = request.trajectory.actions[request.call_index]
        original = dict(action.tool_calls[0].arguments) if action.tool_calls else None
        return CounterfactualResult(
            request.row,
            request.call_index,
            request.trajectory.id,
            original,
            request.alternative,
            request.reward,
            value,
        )

    outcomes = await asyncio.gather(*(one(request) for request in requests))
    results = [o for o in outcomes if isinstance(o, CounterfactualResult)]
    failures = [o for o in outcomes if isinstance(o, ReplayFailure)]
    return results, failures
