"""CALL-CREDIT role classifier and causal call graph (docs/design.md section 2.2).

Every model call (assistant action) of a coding agent gets a role:

* ``IG`` information gathering (read / view / search / list / inspect),
* ``AE`` action execution (edit / write / create / apply a patch / change state),
* ``RV`` result verification (tests, type checks, linters, builds).

Signals, strongest first:

1. **tool type**: the tool's name (Claude Code ``Read``/``Edit``/..., Codex ``shell``/``apply_patch``,
   OpenHands ``str_replace_editor`` by its ``command``, SWE-agent ``open``/``edit``/...,
   Qwen Code ``read_file``/``replace``/..., sandbox ``run_tests``...); unknown names by their words
   (``mcp__fs__read_text_file`` -> read -> IG);
2. **shell command line** for shell tools: each simple command is classified by its program and
   flags (``cat``/``ls``/``grep``/``rg``/``find``/``head``/``tail`` -> IG; ``sed -i``, a redirection
   into a file, ``tee``, ``git apply``, ``patch`` -> AE; ``pytest``, ``python -m unittest``,
   ``make test``, ``npm test``, ``go test``, ``cargo test``, ``tox`` -> RV). In a pipeline only the
   first command counts (later ones are filters) unless a later one writes a file. Across ``&&``,
   ``;``, ``||``: reads that accompany an edit or a test do not change the role; an edit *and* a
   test in one command line is ambiguous;
3. **content** of the result, only when 1-2 did not decide: test-runner output -> RV; a diff or a
   write confirmation -> AE; line-numbered file contents -> IG. A program run the command line
   cannot classify (``python script.py``, ``node x.js``) is RV when its output holds test results
   or a traceback, or when it runs a script an earlier call of the trajectory wrote (a
   reproduction, a hand-written test). Reproduction / check scripts by name (``reproduce.py``,
   ``check_fix.py``) and ``python -c`` probes are RV whatever they print (a probe that only looks
   something up -- ``__file__``, ``inspect.getsource`` -- is IG); builds and type checks
   (``make``, ``gcc``, ``cargo build``, ``mypy``, ``tsc``) are RV.

Scaffolds that write their commands in the message text (a fenced block, SWE-agent 0.x's
``open``/``edit N:M``/..., AutoCodeRover's ``search_class(...)`` and patch blocks, OpenHands CodeAct
``<execute_bash>``) are read like tool calls (:mod:`verl_credit.annotate.text_commands`): same
roles, paths and graph; their result is the next observation.

A call without tool calls (plain reasoning / answer) and a call whose only tools are planning tools
(``TodoWrite``, ``update_plan``, ``think``, ``submit``...) inherits the role of the next call, else IG.
Calls the rules cannot decide (``python script.py``, ``node x.js``, an edit and a test in one
command, no evidence at all) are flagged ``ambiguous``; their role for the math is the candidate
that the **position prior** prefers (after a read: IG before AE before RV; after an edit: RV, then
AE; after a test: AE, then IG), or what an optional :class:`RoleClassifier` (LLM) says.

Causal edges by content reference, across any distance (:func:`build_call_graph`). What a
call *mentions* are the concrete paths of its arguments and result: a glob (``find -name "*.py"``,
``grep --include="*.py"``) names no file, the bare names ``ls DIR`` prints are read inside
``DIR``, and a read that returned nothing (an empty result, "no matches", "No such file") supplies
nothing. What an edit *writes* are its targets (``cp SRC DEST`` writes ``DEST`` only; a script or
``python -c`` program that rewrites files writes the project paths it quotes).


* ``IG -> AE``: the AE call edits a path (or a symbol it defines or changes: a ``def``/``class``
  name of its old or new text, not a builtin, keyword, exception or test-framework name, nor a
  file's stem) that appeared in the IG call's arguments or result;
* ``AE -> RV``: the RV call runs after the AE call and before the next AE call that touches the
  same files, or the RV output names a path the AE edited; the edit of a script the trajectory
  runs (a scratch reproduction) links only to the runs that execute it;
* ``RV -> AE``: a later AE call (before the next RV call, whose output supersedes this one) edits
  a path named in the RV call's failure output (self-correction).

A failed edit (the editor refused it, ``sed`` or ``patch`` failed, the heredoc broke, a non-zero
exit) edits nothing: no edge into or out of it, and it hides no later test run from the edit
before it. Every edge names its unit: an edit whose files are unknown links to no test.

Path matching is by path components: ``src/app.py`` matches ``/repo/src/app.py`` and ``app.py``
(a bare name matches any file of that name); globs (``lib/*.pm``) match with ``fnmatch``.

Module layout: :mod:`verl_credit.annotate.shell` parses and classifies shell command lines (signal 2)
and holds the role vocabulary; :mod:`verl_credit.annotate.call_paths` extracts and matches paths and
symbols and reads test outcomes; this module holds the per-tool rules (signal 1), the content signal
(3), :func:`classify_call`, :func:`analyze_calls` / :class:`CallFacts`, the graph, and the optional
LLM classifier. Names of the other two modules that callers import from here are re-exported.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from verl_credit.annotate.call_paths import (
    _IDENTIFIER,
    _argument_paths,
    _edit_paths,
    _edited_symbols,
    _matching,
    _string_values,
    edit_failed,
    extract_paths,
    is_glob,
    listing_directory,
    paths_match,
    qualify_listing,
    returned_nothing,
    rv_outcome,
)
from verl_credit.annotate.shell import (
    _NO_ROLE,
    AE,
    ALL_ROLES,
    IG,
    RV,
    RoleDecision,
    ShellAnalysis,
    SimpleCommand,
    _ambiguous,
    _combine,
    _decided,
    _words,
    classify_shell_command,
    classify_simple_command,
    executed_scripts,
    parse_shell,
    shell_script_of,
)
from verl_credit.annotate.text_commands import (
    OpenFileTracker,
    parse_text_commands,
    strip_scaffold_status,
    update_open_file,
)
from verl_credit.call_graph import CallEdge, CallGraph
from verl_credit.trajectory import Action, Observation, ToolCall, Trajectory

__all__ = [
    "AE",
    "ALL_ROLES",
    "IG",
    "RV",
    "CallDescription",
    "CallFacts",
    "OpenAIRoleClassifier",
    "RoleClassifier",
    "RoleDecision",
    "ShellAnalysis",
    "SimpleCommand",
    "analyze_calls",
    "build_call_graph",
    "call_graph_from_facts",
    "classify_call",
    "classify_content",
    "classify_shell_command",
    "classify_simple_command",
    "classify_tool_call",
    "extract_paths",
    "failures_ignored",
    "parse_shell",
    "paths_match",
    "rv_outcome",
    "shell_script_of",
]


# ---------------------------------------------------------------------------------------------
# Tool names
# ---------------------------------------------------------------------------------------------


# "python" is SWE-agent's `python script.py` action.
SHELL_TOOLS = _words(
    "bash shell execute_bash run_shell_command exec_command local_shell terminal run_command run_terminal_cmd "
    "execute_command container_exec bash_tool sh cmd run_bash python"
)
EDITOR_TOOLS = _words("str_replace_editor str_replace_based_edit_tool text_editor file_editor edit_tool")
PLANNING_TOOLS = _words(
    "todowrite todo_write todoread todo_read update_plan think exit_plan_mode save_memory finish submit "
    "attempt_completion ask_followup_question task agent plan"
)
IG_TOOLS = _words(
    "read read_file read_many_files view view_file open open_file goto scroll_up scroll_down search search_dir "
    "search_file search_file_content search_files find_file find grep glob ls list_dir list_directory list_files cat "
    "webfetch web_fetch websearch web_search google_web_search notebookread codebase_search file_search browse "
    # AutoCodeRover's search API
    "search_class search_class_in_file search_method search_method_in_file search_method_in_class search_code "
    "search_code_in_file get_code_around_line"
)
AE_TOOLS = _words(
    "edit multiedit write write_file create create_file apply_patch str_replace replace insert edit_file notebookedit "
    "delete_file move_file rename_file patch search_replace write_patch"
)
RV_TOOLS = _words("run_tests run_test pytest test run_pytest run_unit_tests run_checks")

_IG_WORDS = _words(
    "read open view search grep find ls list glob get fetch show cat lookup query inspect describe tree stat info"
)
_AE_WORDS = _words(
    "edit write create update apply patch replace insert delete remove move rename modify commit push append put"
)
_RV_WORDS = _words("test tests pytest verify check lint typecheck validate")

_EDITOR_COMMANDS = {
    "view": IG,
    **dict.fromkeys(("create", "str_replace", "insert", "undo_edit", "write", "delete", "rename"), AE),
}


def _name_words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


# ---------------------------------------------------------------------------------------------
# Content signals
# ---------------------------------------------------------------------------------------------

_TEST_OUTPUT = re.compile(
    r"(\b\d+ (passed|failed|errors?)\b.*\bin [\d.]+s\b|={3,} .*(passed|failed|error).* ={3,}|^Ran \d+ tests? in|"
    r"^FAILED \(|^(FAILED|PASSED|ERROR) [\w/.-]+::|^--- (FAIL|PASS): |^(ok|FAIL)\s+\S+\s+[\d.]+s|"
    r"test result: (ok|FAILED)\.|^Tests?:\s+\d+ (passed|failed)|^Test Suites: |^\s*Test Files\s+\d+|"
    r"tests finished: \d+ passed|^collected \d+ items?)",
    re.MULTILINE,
)
_DIFF_OUTPUT = re.compile(r"(^diff --git |^--- \S+.*\n\+\+\+ \S+|^@@ -\d+(,\d+)? \+\d+(,\d+)? @@)", re.MULTILINE)
_WRITE_OUTPUT = re.compile(
    r"(has been (updated|edited|written|created)|file created successfully|successfully (created|modified|wrote|"
    r"updated|edited)|updated the following files|applied \d+ edits?|file updated\.|wrote \d+ (bytes|lines))",
    re.IGNORECASE,
)
_LINE_NUMBERED = re.compile(r"^\s*\d+[\t:│|]", re.MULTILINE)
#: what a program run prints when it verifies something: a traceback or exception line, an
#: assertion failure, test-runner output, or hand-written test verdicts
_SCRIPT_RESULT = re.compile(
    r"Traceback \(most recent call last\)|^\s*(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Warning): |"
    r"^\s*(?:[a-z_]\w*\.)+[A-Z]\w*: |AssertionError|"
    r"\b\d+ (?:passed|failed)\b|^Ran \d+ tests? in |^(?:OK|FAILED)(?: \(.*\))?\s*$|"
    r"\b(?i:(?:all )?tests? (?:passed|failed|succeeded))\b|^\s*(?:PASS(?:ED)?|FAIL(?:ED)?)(?:[: ]|$)|[✓✗✔✘✅❌]",
    re.MULTILINE,
)


def classify_content(result: str) -> RoleDecision:
    """Content signal of a tool result (used only when the tool type did not decide)."""
    if not result or not result.strip():
        return _ambiguous("empty result")
    signals = []
    if _TEST_OUTPUT.search(result):
        signals.append((RV, "test-runner output"))
    if _DIFF_OUTPUT.search(result) or _WRITE_OUTPUT.search(result):
        signals.append((AE, "diff or write confirmation in the result"))
    if not signals and len(_LINE_NUMBERED.findall(result)) >= 2:
        signals.append((IG, "line-numbered file contents"))
    if len(signals) == 1:
        return _decided(*signals[0])
    if signals:
        return _ambiguous("conflicting content signals", [r for r, _ in signals])
    return _ambiguous("no content signal")


# ---------------------------------------------------------------------------------------------
# Tool calls and model calls
# ---------------------------------------------------------------------------------------------


def _python_tool_script(arguments: Mapping[str, Any]) -> str:
    """SWE-agent's ``python`` action: ``{"script": "reproduce.py"}`` -> ``python reproduce.py``."""
    command = arguments.get("command")
    if isinstance(command, str) and command.strip():
        return command if command.lstrip().startswith("python") else f"python {command}"
    return f"python {arguments.get('script') or arguments.get('path') or ''}".strip()


def _name_signal(name: str, arguments: Mapping[str, Any]) -> RoleDecision:
    lowered = name.lower()
    if lowered in PLANNING_TOOLS:
        return RoleDecision(None, False, f"planning tool {name}")
    if lowered in EDITOR_TOOLS:
        command = str(arguments.get("command", ""))
        role = _EDITOR_COMMANDS.get(command)
        return _decided(role, f"{name} {command}") if role else _ambiguous(f"{name} with command {command!r}")
    if lowered in SHELL_TOOLS:
        script = shell_script_of(arguments) if lowered != "python" else _python_tool_script(arguments)
        if script is None:
            return _ambiguous(f"{name} without a command")
        decision = classify_shell_command(script)
        return RoleDecision(
            decision.role,
            decision.ambiguous,
            f"{name}: {decision.reason}",
            decision.candidates,
            decision.conflict,
            decision.runs_program,
        )
    if lowered in AE_TOOLS:
        return _decided(AE, f"edit tool {name}")
    if lowered in RV_TOOLS:
        return _decided(RV, f"test tool {name}")
    if lowered in IG_TOOLS:
        return _decided(IG, f"read tool {name}")
    words = set(_name_words(name.split("__")[-1] if "__" in name else name))
    hits = {role for role, vocab in ((IG, _IG_WORDS), (AE, _AE_WORDS), (RV, _RV_WORDS)) if words & vocab}
    if len(hits) == 1:
        role = hits.pop()
        return _decided(role, f"tool name {name} ({role} words)")
    if hits:
        return _ambiguous(f"tool name {name} has words of several roles", hits)
    return _ambiguous(f"unknown tool {name}")


def classify_tool_call(name: str, arguments: Mapping[str, Any], result: str = "") -> RoleDecision:
    """Role of one tool call: tool-type / command-line signal, then the content signal.

    A program run the command line cannot classify (``python script.py``, ``node x.js``,
    ``python -c ...``) is RV when its output holds test results or a traceback (it checks
    behaviour: a reproduction, a hand-written test).
    """
    decision = _name_signal(name, arguments)
    if not decision.ambiguous or decision.conflict:
        return decision
    if decision.runs_program and RV in decision.candidates:
        found = _SCRIPT_RESULT.search(result or "")
        if found is not None:
            what = "a traceback" if "Error" in found.group(0) or "Traceback" in found.group(0) else "test results"
            return _decided(RV, f"{decision.reason}; its output holds {what}")
    content = classify_content(result)
    if not content.ambiguous and content.role in decision.candidates:
        return _decided(content.role, f"{decision.reason}; content: {content.reason}")  # type: ignore[arg-type]
    return decision


def _results_by_call(action: Action, observations: Sequence[Observation]) -> list[str]:
    """The result text of each of ``action``'s tool calls: by the trajectory's pairing
    (``Observation.call_position``: the nearest preceding unanswered call of the result's id),
    else by id, else in order."""
    count = len(action.tool_calls)
    results = [""] * count
    filled = [False] * count
    unpaired = []
    for observation in observations:
        if observation.role != "tool" or observation.source_action not in (action.index, None):
            continue
        position = observation.call_position
        if observation.source_action == action.index and position is not None and 0 <= position < count:
            if not filled[position]:
                results[position], filled[position] = observation.content, True
            continue
        unpaired.append(observation)
    for observation in unpaired:
        position = next(
            (k for k, c in enumerate(action.tool_calls) if not filled[k] and c.id and c.id == observation.tool_call_id),
            None,
        )
        if position is None:
            position = next((k for k in range(count) if not filled[k]), None)
        if position is not None:
            results[position], filled[position] = observation.content, True
    return results


def _classify_calls(calls: Sequence[ToolCall], results: Sequence[str]) -> RoleDecision:
    if not calls:
        return _NO_ROLE
    decisions = [classify_tool_call(c.name, c.arguments, r) for c, r in zip(calls, results, strict=True)]
    return _combine(decisions, "tool calls")


def _classify_with_results(action: Action, results: Sequence[str]) -> RoleDecision:
    return _classify_calls(action.tool_calls, results)


def classify_call(action: Action, observations: Sequence[Observation]) -> tuple[str | None, bool, str]:
    """Rule role of one model call from its tool calls and their results.

    Args:
        action: the call (assistant message).
        observations: its tool results (observations attributed to other actions are ignored).

    Returns:
        ``(role, ambiguous, reason)``: ``role`` is ``IG``/``AE``/``RV`` when the rules decide,
        ``None`` when they cannot (``ambiguous`` True) or when the call has no role of its own
        (no tool call or planning tools only: ``ambiguous`` False; it inherits the next call's
        role in :func:`build_call_graph`).
    """
    decision = _classify_with_results(action, _results_by_call(action, observations))
    return decision.role, decision.ambiguous, decision.reason


# ---------------------------------------------------------------------------------------------
# Call facts and the graph
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallFacts:
    """Everything the graph and the diagnostics need to know about one model call.

    ``role`` is the role used by the math (rules, inheritance, position prior or LLM);
    ``ambiguous`` is True when the rules alone did not decide; ``source`` says which of
    ``rules`` / ``inherited`` / ``prior`` / ``llm`` / ``default`` set the role.
    """

    index: int
    role: str
    ambiguous: bool
    reason: str
    source: str
    edited_paths: frozenset[str] = frozenset()
    mentioned_paths: frozenset[str] = frozenset()
    edited_symbols: frozenset[str] = frozenset()
    mentioned_identifiers: frozenset[str] = frozenset()  # every identifier of its arguments and results
    rv_status: str | None = None  # "pass" | "fail" | None (RV calls only)
    failure_paths: frozenset[str] = frozenset()
    summary: str = ""
    executed_paths: frozenset[str] = frozenset()  # scripts and test files the call runs as programs
    failed_edit: bool = False  # an AE call whose edit did not happen (it edits nothing)
    from_text: bool = False  # its commands were read from the message text (no native tool call)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "role": self.role,
            "ambiguous": self.ambiguous,
            "reason": self.reason,
            "source": self.source,
            "edited_paths": sorted(self.edited_paths),
            "rv_status": self.rv_status,
            "failure_paths": sorted(self.failure_paths),
            "summary": self.summary,
            "executed_paths": sorted(self.executed_paths),
            "failed_edit": self.failed_edit,
            "from_text": self.from_text,
        }


@dataclass(frozen=True)
class CallDescription:
    """What an LLM role classifier sees of one ambiguous call."""

    index: int
    content: str
    tool_calls: tuple[tuple[str, str], ...]  # (name, raw arguments)
    results: tuple[str, ...]
    candidates: tuple[str, ...]
    rule_reason: str


@runtime_checkable
class RoleClassifier(Protocol):
    """Decides the role of a call the rules flagged ambiguous (``None``: no opinion)."""

    def classify(self, call: CallDescription) -> str | None: ...


def _prior_role(candidates: Sequence[str], previous: str | None) -> str:
    """Position prior (IG -> AE -> RV): the preferred candidate given the previous call's role."""
    order = {None: (IG, AE, RV), IG: (IG, AE, RV), AE: (RV, AE, IG), RV: (AE, IG, RV)}[previous]
    for role in order:
        if role in candidates:
            return role
    return IG


def _summary(call: ToolCall) -> str:
    script = shell_script_of(call.arguments) if call.name.lower() in SHELL_TOOLS else None
    text = script if script is not None else call.raw_arguments
    text = " ".join(text.split())
    return f"{call.name}({text[:120]})"


def _calls_and_results(trajectory: Trajectory) -> tuple[list[tuple[ToolCall, ...]], list[list[str]], list[bool]]:
    """Per action: the calls it makes, their result texts, and whether the calls were read from the
    message text (:mod:`verl_credit.annotate.text_commands`: only in a trajectory that makes no
    native tool call; the result of a text command is the observations up to the next action)."""
    actions = trajectory.actions
    if any(action.tool_calls for action in actions):
        observations_of: dict[int, list[Observation]] = {}
        for observation in trajectory.observations:
            if observation.source_action is not None:
                observations_of.setdefault(observation.source_action, []).append(observation)
        calls = [a.tool_calls for a in actions]
        results = [
            [strip_scaffold_status(r) for r in _results_by_call(a, observations_of.get(a.index, []))] for a in actions
        ]
        return calls, results, [False] * len(actions)
    following: dict[int, list[str]] = {}
    for observation in trajectory.observations:
        if observation.role in ("user", "tool") and observation.after_action >= 1:
            following.setdefault(observation.after_action - 1, []).append(observation.content)
    tracker = OpenFileTracker()
    calls, results, from_text = [], [], []
    for action in actions:
        parsed = tuple(parse_text_commands(action.content, tracker))
        output = strip_scaffold_status("\n".join(following.get(action.index, [])))
        update_open_file(tracker, "\n".join(following.get(action.index, [])))
        calls.append(parsed)
        results.append([output] * len(parsed))
        from_text.append(bool(parsed))
    return calls, results, from_text


def _script_of(call: ToolCall) -> str | None:
    if call.name.lower() in SHELL_TOOLS:
        return shell_script_of(call.arguments) if call.name.lower() != "python" else _python_tool_script(call.arguments)
    return None


def analyze_calls(trajectory: Trajectory, classifier: RoleClassifier | None = None) -> list[CallFacts]:
    """Roles (with inheritance, position prior, optional LLM) and content facts for every call."""
    calls_per_action, results_per_action, from_text = _calls_and_results(trajectory)
    decisions = [_classify_calls(c, r) for c, r in zip(calls_per_action, results_per_action, strict=True)]
    scripts_per_action = [[_script_of(c) for c in calls] for calls in calls_per_action]

    # 0. a program run the command line alone cannot classify is a check when it runs a script an
    #    earlier call of this trajectory wrote (a reproduction, a hand-written test)
    written: set[str] = set()
    for i, decision in enumerate(decisions):
        if decision.ambiguous and decision.runs_program and not decision.conflict and written:
            runs = {p for script in scripts_per_action[i] if script for p in executed_scripts(script)}
            ran = _matching(runs, written)
            if ran is not None:
                decisions[i] = _decided(RV, f"{decision.reason}; runs {ran}, a script written earlier")
        if decisions[i].role == AE:
            for call, result, script in zip(
                calls_per_action[i], results_per_action[i], scripts_per_action[i], strict=True
            ):
                written |= _edit_paths(call, result, script)

    count = len(decisions)
    roles: list[str | None] = [d.role for d in decisions]
    sources = ["rules" if d.role is not None else "" for d in decisions]
    ambiguous = [d.ambiguous for d in decisions]
    # 1. ambiguous calls: position prior (previous role in order), optionally an LLM.
    previous: str | None = None
    for i, decision in enumerate(decisions):
        if decision.ambiguous:
            chosen = None
            if classifier is not None:
                action = trajectory.actions[i]
                description = CallDescription(
                    i,
                    action.content,
                    tuple((c.name, c.raw_arguments) for c in calls_per_action[i]),
                    tuple(results_per_action[i]),
                    decision.candidates,
                    decision.reason,
                )
                chosen = classifier.classify(description)
                if chosen not in ALL_ROLES:
                    chosen = None
            if chosen is not None:
                roles[i], sources[i] = chosen, "llm"
            else:
                roles[i], sources[i] = _prior_role(decision.candidates, previous), "prior"
        if roles[i] is not None:
            previous = roles[i]
    # 2. calls without a role of their own inherit the next call's role, else IG.
    following: str | None = None
    following_ambiguous = False
    for i in range(count - 1, -1, -1):
        if roles[i] is None:
            if following is None:
                roles[i], sources[i] = IG, "default"
            else:
                roles[i], sources[i], ambiguous[i] = following, "inherited", following_ambiguous
        following, following_ambiguous = roles[i], ambiguous[i]

    facts = []
    for i, action in enumerate(trajectory.actions):
        role = roles[i]
        assert role is not None
        calls = calls_per_action[i]
        results = results_per_action[i]
        edited: set[str] = set()
        mentioned: set[str] = set()
        edited_symbols: set[str] = set()
        executed: set[str] = set()
        texts: list[str] = []
        output_paths: set[str] = set()
        failed = False
        for call, result, script in zip(calls, results, scripts_per_action[i], strict=True):
            result_paths = extract_paths(result)
            if script is not None:  # ls DIR names its files relative to DIR
                result_paths = qualify_listing(result_paths, listing_directory(script))
                executed |= set(executed_scripts(script))
            output_paths |= result_paths
            # a read that returned nothing supplies nothing; a glob (find -name "*.py") names no file
            if not (role == IG and returned_nothing(result)):
                mentioned |= {p for p in _argument_paths(call.arguments) | result_paths if not is_glob(p)}
                texts.append("\n".join(_string_values(call.arguments)))
                texts.append(result)
            if role == AE and sources[i] not in _NO_TOOL_SOURCES:
                paths = _edit_paths(call, result, script)
                edited |= paths
                edited_symbols |= _edited_symbols(call, paths)
        if role == AE and sources[i] not in _NO_TOOL_SOURCES and calls and all(edit_failed(r) for r in results):
            # the edit did not happen (a refused edit, a failed sed or patch, a broken heredoc)
            failed, edited, edited_symbols = True, set(), set()
        output = "\n".join(results)
        status = rv_outcome(output) if role == RV else None
        facts.append(
            CallFacts(
                index=i,
                role=role,
                ambiguous=ambiguous[i],
                reason=_fact_reason(decisions[i], sources[i], role) + (" (edit failed)" if failed else ""),
                source=sources[i],
                edited_paths=frozenset(edited),
                mentioned_paths=frozenset(mentioned),
                edited_symbols=frozenset(edited_symbols),
                mentioned_identifiers=frozenset(_IDENTIFIER.findall("\n".join(texts))),
                rv_status=status,
                failure_paths=frozenset(output_paths) if status == "fail" else frozenset(),
                summary="; ".join(_summary(c) for c in calls) or (action.content[:120] if action.content else ""),
                executed_paths=frozenset(executed),
                failed_edit=failed,
                from_text=from_text[i],
            )
        )
    return facts


def _fact_reason(decision: RoleDecision, source: str, role: str) -> str:
    if source == "inherited":
        return f"{decision.reason}: inherits {role} from the next call"
    if source == "default":
        return f"{decision.reason}: last call, IG by default"
    if source in ("prior", "llm"):
        return f"{decision.reason}: {role} by the {'position prior' if source == 'prior' else 'LLM classifier'}"
    return decision.reason


def _touch_same_files(a: frozenset[str], b: frozenset[str]) -> bool:
    """Two edits touch the same files (unknown file sets count as touching)."""
    if not a or not b:
        return True
    return _matching(a, b) is not None


_NO_TOOL_SOURCES = ("inherited", "default")  # calls without tools of their own: they edit nothing


def _is_edit(fact: CallFacts) -> bool:
    """An AE call that edited something (not a failed edit, not a call that only inherited AE)."""
    return fact.role == AE and fact.source not in _NO_TOOL_SOURCES and not fact.failed_edit


def call_graph_from_facts(facts: Sequence[CallFacts]) -> CallGraph:
    """The causal edges of section 2.2 over analysed calls (see the module docstring).

    Every edge names its unit (a path or ``symbol:NAME``): an edit whose files are unknown, a
    failed edit and a call that only inherited AE get none. A script the trajectory runs as a
    program (a reproduction script, a scratch test) links from its edits only to the runs that
    execute it; the edits of other files link to the verifications after them as usual.
    """
    edges: list[CallEdge] = []
    edits = [f for f in facts if _is_edit(f)]
    rv_calls = [f for f in facts if f.role == RV]
    # IG -> AE: the edit touches a path (or a symbol it defines or changes) the read saw.
    for ae in edits:
        for ig in facts[: ae.index]:
            if ig.role != IG:
                continue
            unit = _matching(ae.edited_paths, ig.mentioned_paths)
            if unit is None:
                shared = sorted(ae.edited_symbols & ig.mentioned_identifiers)
                unit = f"symbol:{shared[0]}" if shared else None
            if unit is not None:
                edges.append(CallEdge(ig.index, ae.index, "IG->AE", unit))
    # AE -> RV: tests after the edit and before the next edit of the same files (or naming them);
    # a script's edit: only the runs that execute it, up to its next edit.
    for ae in edits:
        if not ae.edited_paths:
            continue
        later_runs = [f for f in facts[ae.index + 1 :] if f.executed_paths]
        scripts = frozenset(p for p in ae.edited_paths if any(_matching({p}, f.executed_paths) for f in later_runs))
        sources = ae.edited_paths - scripts
        for rv in rv_calls:
            if rv.index <= ae.index:
                continue
            between = [o for o in edits if ae.index < o.index < rv.index]
            ran = _matching(scripts, rv.executed_paths) if scripts else None
            if ran is not None:
                if not any(_matching({ran}, o.edited_paths) for o in between):
                    edges.append(CallEdge(ae.index, rv.index, "AE->RV", ran))
                continue
            if not sources:
                continue
            blocked = any(_touch_same_files(sources, o.edited_paths) for o in between)
            named = _matching(sources, rv.mentioned_paths)
            if not blocked or named is not None:
                edges.append(CallEdge(ae.index, rv.index, "AE->RV", named or sorted(sources)[0]))
    # RV -> AE: a later edit (before the next test run) of a path named in the failure output.
    for rv in rv_calls:
        if rv.rv_status != "fail" or not rv.failure_paths:
            continue
        for later in facts[rv.index + 1 :]:
            if later.role == RV:
                break
            if _is_edit(later):
                unit = _matching(later.edited_paths, rv.failure_paths)
                if unit is not None:
                    edges.append(CallEdge(rv.index, later.index, "RV->AE", unit))
    edges.sort(key=lambda e: (e.src, e.dst, e.kind))
    return CallGraph(
        roles=tuple(f.role for f in facts),
        ambiguous=tuple(f.ambiguous for f in facts),
        edges=tuple(edges),
    )


def build_call_graph(trajectory: Trajectory, classifier: RoleClassifier | None = None) -> CallGraph:
    """Roles and causal edges of one trajectory's calls (docs/design.md section 2.2)."""
    return call_graph_from_facts(analyze_calls(trajectory, classifier))


def call_graph_and_outcomes(
    trajectory: Trajectory, classifier: RoleClassifier | None = None
) -> tuple[CallGraph, list[str | None]]:
    """:func:`build_call_graph` and each call's verification outcome (``"pass"``/``"fail"``/``None``,
    for the RV reward) from one classifier pass."""
    facts = analyze_calls(trajectory, classifier)
    return call_graph_from_facts(facts), [fact.rv_status for fact in facts]


# ---------------------------------------------------------------------------------------------
# Optional LLM classifier for ambiguous calls
# ---------------------------------------------------------------------------------------------

ROLE_PROMPT = """You label one model call of a coding agent with its functional role.
IG (information gathering): reads, views, searches, lists, or runs something only to learn about the code or the bug.
AE (action execution): changes files or state: edits, writes, patches, creates, deletes, installs, migrates.
RV (result verification): checks a change: runs tests, type checks, linters, builds, or re-runs a reproduction
after a fix.
Answer with JSON {"role": "IG" | "AE" | "RV"}."""


#: completion budget of one role answer (``{"role": "IG"}`` with some whitespace)
ROLE_MAX_TOKENS = 32


class OpenAIRoleClassifier:
    """:class:`RoleClassifier` over an OpenAI-compatible chat-completions endpoint (e.g. vLLM).

    Off by default (``build_call_graph`` uses it only when passed). Temperature 0, JSON-schema
    constrained output. Transport errors, timeouts and 408/429/5xx answers are retried ``max_retries``
    times with backoff (:func:`verl_credit.openai_chat.post_chat_completion_sync`); an answer that is not
    ``{"role": <IG|AE|RV>}`` is not retried (temperature 0 repeats it). Any failure returns ``None``
    (the position prior then decides), is counted in :attr:`failures` and described in
    :attr:`last_error`. ``transport`` lets tests answer in-process; ``trust_env`` lets the client
    read ``HTTP(S)_PROXY`` (off by default).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 2,
        transport: Any = None,
        context_chars: int = 2000,
        backoff_s: float = 0.5,
        trust_env: bool = False,
    ) -> None:
        from verl_credit.openai_chat import RetryPolicy, make_client

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.retry = RetryPolicy(max_retries=max_retries, backoff_s=backoff_s)
        self.context_chars = context_chars
        self.failures = 0
        self.calls = 0
        self.last_error: str | None = None
        # in-cluster endpoint: HTTP(S)_PROXY is ignored unless trust_env
        self._client = make_client(timeout=timeout, headers=headers, transport=transport, trust_env=trust_env)

    def _request(self, call: CallDescription) -> dict[str, Any]:
        lines = [f"Call #{call.index}."]
        if call.content:
            lines.append(f"Assistant text: {call.content[: self.context_chars]}")
        for (name, arguments), result in zip(call.tool_calls, call.results, strict=False):
            lines.append(f"Tool call: {name}({arguments[: self.context_chars]})")
            lines.append(f"Result: {result[: self.context_chars]}")
        lines.append(f"Possible roles: {', '.join(call.candidates)}.")
        schema = {
            "type": "object",
            "properties": {"role": {"type": "string", "enum": list(call.candidates or ALL_ROLES)}},
            "required": ["role"],
            "additionalProperties": False,
        }
        return {
            "model": self.model,
            "temperature": 0,
            "messages": [{"role": "system", "content": ROLE_PROMPT}, {"role": "user", "content": "\n".join(lines)}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "call_role", "schema": schema}},
            # '{"role": "IG"}' is ~6 tokens; without a cap a model that loops on whitespace (free
            # whitespace is allowed by the grammar unless the server disables it) runs to the end
            # of the context and the request times out (seen on vLLM 0.31 + guidance)
            "max_tokens": ROLE_MAX_TOKENS,
        }

    def classify(self, call: CallDescription) -> str | None:
        from verl_credit.openai_chat import ChatCompletionError, message_content, post_chat_completion_sync

        self.calls += 1
        try:
            response = post_chat_completion_sync(self._client, self.url, self._request(call), retry=self.retry)
            role = json.loads(message_content(response))["role"]
        except ChatCompletionError as error:
            self.last_error = str(error) if str(error).startswith(self.url) else f"{self.url} {error}"
        except (KeyError, TypeError, ValueError) as error:  # not {"role": ...}: retrying at temperature 0 repeats it
            self.last_error = f"{self.url} answered no role: {type(error).__name__}: {error}"
        else:
            if role in ALL_ROLES:
                return role
            self.last_error = f"{self.url} answered role {role!r}, not one of {list(ALL_ROLES)}"
        self.failures += 1
        return None

    def close(self) -> None:
        self._client.close()


def failures_ignored(facts: Sequence[CallFacts]) -> list[bool | None]:
    """Per call: for a failing RV, True when no later edit answered it (no later AE edits a path its
    failure output named; when it named none, no later AE at all); ``None`` for other calls."""
    out: list[bool | None] = []
    for fact in facts:
        if fact.role != RV or fact.rv_status != "fail":
            out.append(None)
            continue
        later_edits = [f for f in facts[fact.index + 1 :] if _is_edit(f)]
        if fact.failure_paths:
            answered = any(_matching(f.edited_paths, fact.failure_paths) is not None for f in later_edits)
        else:
            answered = bool(later_edits)
        out.append(not answered)
    return out
