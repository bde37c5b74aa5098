"""Counterfactual replay (docs/design.md section 4, "Counterfactual calibration").

Re-executes a finished trajectory's tool calls, in order, in a *fresh* sandbox of the same task,
with the tool call of one model call replaced (new arguments, optionally a new tool name) or
removed, and returns the reward of the resulting repository: ``Delta_k = R(tau) - R(tau')``.

Everything is replayed verbatim except ``run_tests`` calls (``skip_verification=True``, the
default): they never change the working tree, so skipping them only saves time. ``bash`` calls
are replayed because they can change files. Later calls see the counterfactual state: an edit
whose ``old`` text no longer matches fails, exactly as it would have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_credit.envs.base import ToolResult
from verl_credit.envs.coding.sandbox import CodingSandbox
from verl_credit.envs.coding.task_spec import CodingTask
from verl_credit.trajectory import Trajectory

__all__ = ["ReplayOutcome", "ReplayedCall", "replay_trajectory", "tool_calls_of"]

_VERIFICATION_TOOLS = frozenset({"run_tests"})


@dataclass(frozen=True)
class ReplayedCall:
    """One tool call in trajectory order: the model call (action) it belongs to and what it asked."""

    call_index: int  # 0-based action (assistant message) index
    position: int  # index of the tool call inside that action
    name: str
    arguments: Any  # dict when the model's JSON was valid, else the raw string


@dataclass(frozen=True)
class ReplayOutcome:
    reward: float
    results: tuple[tuple[ReplayedCall, ToolResult], ...]


def tool_calls_of(messages: Sequence[Mapping[str, Any]]) -> list[ReplayedCall]:
    """Every tool call of an OpenAI-format transcript, in order (raises ``TrajectoryError``)."""
    trajectory = Trajectory.from_messages([dict(m) for m in messages])
    calls = []
    for action in trajectory.actions:
        for position, call in enumerate(action.tool_calls):
            arguments = call.arguments if call.arguments_valid else call.raw_arguments
            calls.append(ReplayedCall(action.index, position, call.name, arguments))
    return calls


def replay_trajectory(
    task: CodingTask | str,
    messages: Sequence[Mapping[str, Any]],
    call_index: int,
    replacement_arguments: Mapping[str, Any] | None,
    *,
    tool_call_index: int = 0,
    replacement_name: str | None = None,
    skip_verification: bool = True,
    **sandbox_options: Any,
) -> ReplayOutcome:
    """Replay ``messages`` with call ``call_index``'s tool call replaced (``None``: removed).

    Args:
        task: the task the trajectory was played on.
        messages: the transcript (OpenAI chat format).
        call_index: 0-based index of the model call (assistant message) to change.
        replacement_arguments: the new arguments of its tool call, or ``None`` to drop the call.
        tool_call_index: which tool call of that model call (default: its first).
        replacement_name: a different tool for the replacement (default: the same tool).
        skip_verification: do not re-run ``run_tests`` calls (they cannot change the repository).
        sandbox_options: passed to :class:`CodingSandbox` (jail, limits, reward_mode, ...).

    Raises:
        ValueError: ``call_index`` is out of range or names a call without that tool call.
    """
    calls = tool_calls_of(messages)
    num_actions = sum(1 for m in messages if m.get("role") == "assistant")
    if not 0 <= call_index < num_actions:
        raise ValueError(f"call_index {call_index} is out of range for {num_actions} model calls")
    if not any(c.call_index == call_index and c.position == tool_call_index for c in calls):
        raise ValueError(f"model call {call_index} has no tool call #{tool_call_index} to replace")
    replayed: list[tuple[ReplayedCall, ToolResult]] = []
    with CodingSandbox(task, **sandbox_options) as sandbox:
        for call in calls:
            name, arguments = call.name, call.arguments
            if call.call_index == call_index and call.position == tool_call_index:
                if replacement_arguments is None:
                    continue
                name, arguments = replacement_name or call.name, dict(replacement_arguments)
            elif skip_verification and name in _VERIFICATION_TOOLS:
                continue
            result = (
                sandbox.call(name, arguments)
                if isinstance(arguments, Mapping)
                else ToolResult(f"Error: arguments of {name} are not a JSON object", is_error=True)
            )
            replayed.append((ReplayedCall(call.call_index, call.position, name, arguments), result))
        reward = sandbox.reward()
    return ReplayOutcome(reward, tuple(replayed))
