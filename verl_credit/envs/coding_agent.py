"""A scripted coding agent for the coding sandbox: read -> edit -> test, with controlled mistakes.

Used by the tests (known-good and known-bad trajectories with real tool results) and by the
coding learning-benchmark arm (``verl_credit.bench.coding_arm``), which drives the same
:class:`TranscriptRecorder` with choices made by a policy.

Variants of :func:`plan_calls`:

* ``correct``      read the target file, apply the reference fix, run the tests, answer;
* ``wrong_edit``   the same, with a plausible wrong fix (default: the task's first wrong edit);
* ``skip_tests``   the reference fix without running the tests;
* ``extra_reads``  list the repository, read a distractor and the visible test, search for the
                   symbol, then do what ``correct`` does (useless reads for credit diagnostics);
* ``self_correct`` a wrong fix that fails the visible tests, run them, fix it, run them again.

Every model call is one assistant message with at most one tool call; the final answer is a
message without a tool call. Transcripts are OpenAI chat messages (docs/design.md section 8).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_credit.envs.base import Environment, ToolResult
from verl_credit.envs.coding.environment import SYSTEM_PROMPT
from verl_credit.envs.coding.sandbox import CodingSandbox
from verl_credit.envs.coding.task_spec import CodingTask, FileEdit, load_task

__all__ = [
    "VARIANTS",
    "PlannedCall",
    "ScriptedEpisode",
    "TranscriptRecorder",
    "plan_calls",
    "run_scripted_agent",
    "run_scripted_agent_async",
    "switch_edit",
]

VARIANTS: tuple[str, ...] = ("correct", "wrong_edit", "skip_tests", "extra_reads", "self_correct")
FINAL_ANSWER = "I fixed the bug described in the task."


@dataclass(frozen=True)
class PlannedCall:
    """One model call: a tool call (``name`` + ``arguments``) or, with ``name=None``, a plain answer."""

    name: str | None
    arguments: Mapping[str, Any] = field(default_factory=dict)
    content: str = ""


@dataclass
class ScriptedEpisode:
    messages: list[dict[str, Any]]
    reward: float
    results: list[ToolResult]


class TranscriptRecorder:
    """Builds the chat transcript of an episode while its tool calls are executed.

    ``execute(name, arguments) -> ToolResult`` runs a call (a sandbox, a cache, an environment).
    """

    def __init__(self, task: CodingTask, execute: Callable[[str, Mapping[str, Any]], ToolResult]) -> None:
        self.task = task
        self.execute = execute
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task.statement},
        ]
        self.results: list[ToolResult] = []
        self._next_id = 0

    def step(self, call: PlannedCall) -> ToolResult | None:
        """Append one model call (and its tool result); returns the result (None for an answer)."""
        if call.name is None:
            self.messages.append({"role": "assistant", "content": call.content or FINAL_ANSWER})
            return None
        call_id = f"call_{self._next_id}"
        self._next_id += 1
        arguments = dict(call.arguments)
        self.messages.append(
            {
                "role": "assistant",
                "content": call.content,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": json.dumps(arguments)},
                    }
                ],
            }
        )
        result = self.execute(call.name, arguments)
        self.results.append(result)
        self.messages.append({"role": "tool", "tool_call_id": call_id, "name": call.name, "content": result.content})
        return result


def switch_edit(task: CodingTask, current: FileEdit, wanted: FileEdit) -> FileEdit:
    """The edit that turns the site rewritten by ``current`` into ``wanted`` (same path and ``old``)."""
    if (current.path, current.old) != (wanted.path, wanted.old):
        raise ValueError(
            f"task {task.name}: edits of different sites cannot be switched ({current.path}, {wanted.path})"
        )
    return FileEdit(wanted.path, current.new, wanted.new)


def plan_calls(task: CodingTask, variant: str, wrong_edit: str | None = None) -> list[PlannedCall]:
    """The model calls of a scripted episode (see the module docstring)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown scripted-agent variant {variant!r}; variants: {VARIANTS}")
    reads = [PlannedCall("read_file", {"path": path}) for path in dict.fromkeys(e.path for e in task.solution)]
    fix = [PlannedCall("edit_file", edit.to_arguments()) for edit in task.solution]
    test = PlannedCall("run_tests", {})
    answer = PlannedCall(None, content=FINAL_ANSWER)
    if variant == "correct":
        return [*reads, *fix, test, answer]
    if variant == "skip_tests":
        return [*reads, *fix, answer]
    if variant == "extra_reads":
        extra = [
            PlannedCall("list_dir", {"path": "."}),
            *(PlannedCall("read_file", {"path": path}) for path in task.distractors[:1]),
            *(PlannedCall("read_file", {"path": path}) for path in task.visible_tests[:1]),
            PlannedCall("search", {"pattern": task.symbol or task.target}),
        ]
        return [*extra, *reads, *fix, test, answer]
    if variant == "wrong_edit":
        wrong = task.wrong_edit(wrong_edit) if wrong_edit else task.wrong_edits[0]
        return [*reads, *(PlannedCall("edit_file", e.to_arguments()) for e in wrong.edits), test, answer]
    # self_correct: a wrong edit the visible tests catch, then the switch to the reference fix
    wrong = task.wrong_edit(wrong_edit) if wrong_edit else next(w for w in task.wrong_edits if not w.visible_passes)
    first, reference = wrong.edits[0], task.solution[0]
    repair = switch_edit(task, first, reference)
    return [
        *reads,
        PlannedCall("edit_file", first.to_arguments()),
        test,
        PlannedCall("edit_file", repair.to_arguments(), content="The tests still fail; correcting my edit."),
        test,
        answer,
    ]


def run_scripted_agent(
    task: CodingTask | str, variant: str, *, wrong_edit: str | None = None, **sandbox_options: Any
) -> ScriptedEpisode:
    """Play one scripted episode in a fresh :class:`CodingSandbox`; returns transcript and reward."""
    spec = task if isinstance(task, CodingTask) else load_task(task)
    with CodingSandbox(spec, **sandbox_options) as sandbox:
        recorder = TranscriptRecorder(spec, sandbox.call)
        for call in plan_calls(spec, variant, wrong_edit):
            recorder.step(call)
        reward = sandbox.reward()
    return ScriptedEpisode(recorder.messages, reward, recorder.results)


async def run_scripted_agent_async(
    env: Environment, task: str, variant: str, *, wrong_edit: str | None = None
) -> ScriptedEpisode:
    """The same episode through the agent-loop :class:`Environment` interface (``build_environment("coding")``)."""
    start = await env.start({"task": task})
    spec = load_task(task)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": start.system_prompt},
        {"role": "user", "content": start.first_user_message},
    ]
    results: list[ToolResult] = []
    for index, call in enumerate(plan_calls(spec, variant, wrong_edit)):
        if call.name is None:
            messages.append({"role": "assistant", "content": call.content or FINAL_ANSWER})
            turn = await env.user_turn(messages)
            if turn.done:
                break
            continue
        call_id = f"call_{index}"
        function = {"name": call.name, "arguments": json.dumps(dict(call.arguments))}
        messages.append(
            {
                "role": "assistant",
                "content": call.content,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )
        result = await env.call_tool(call.name, call.arguments)
        results.append(result)
        messages.append({"role": "tool", "tool_call_id": call_id, "name": call.name, "content": result.content})
    reward = await env.reward()
    return ScriptedEpisode(messages, reward, results)
