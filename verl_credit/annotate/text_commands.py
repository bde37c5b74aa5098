"""Commands a coding agent writes in its message text, read as tool calls (docs/design.md section 2.2).

Scaffolds without native tool calls put the command in the assistant text and get its output back
as the next (user) message. The role classifier and the call graph read such a command exactly as
the equivalent tool call (same name, same arguments), so the same work gets the same roles, paths
and edges whichever way it was written:

* **OpenHands CodeAct**: ``<execute_bash>CMD</execute_bash>`` -> ``bash`` (the SWE-agent command
  language below applies inside it), ``<execute_ipython>CODE</execute_ipython>`` -> its
  AgentSkills call (``open_file``, ``edit_file_by_replace``, ``create_file``, ``search_dir``, ...)
  or a ``python`` run of the code, ``<execute_browse>`` -> ``browse``; the function-call text form
  ``<function=NAME><parameter=KEY>VALUE</parameter>...</function>`` -> the call ``NAME`` itself;
* **AutoCodeRover**: API calls ``search_class("X")``, ``search_method_in_file("m", "a/b.py")``,
  ``search_code(...)``, ``get_code_around_line(...)`` -> one read call each, its file operands as
  ``path``; a patch block ``<file>P</file> <original>...</original> <patched>...</patched>`` ->
  ``write_patch`` of ``P``;
* **a fenced block** (```` ```bash ````, ```` ```sh ````, or no language; the *last* one of the message,
  which is what SWE-agent and mini-swe-agent execute) -> ``bash`` of its text, except that
* **the SWE-agent 0.x command language** is recognised in any shell text: ``open P [N]``,
  ``goto N``, ``scroll_down`` / ``scroll_up`` (a read of the open file), ``create P``,
  ``edit N:M`` ... ``end_of_edit`` (an edit of the open file), ``search_dir T [D]``,
  ``search_file T [F]``, ``find_file N [D]``, ``submit``, and the ``str_replace_editor`` text form.
  The open file is tracked across the trajectory from ``open`` / ``create`` and from the
  ``[File: P ...]`` / ``(Open file: P)`` lines of the observations.

A message with no recognisable command yields no call (it keeps the rule for messages without
tool calls: it inherits the next call's role). Text commands are read only in trajectories that
make no native tool call (a scaffold uses one form or the other): a tool-calling agent's final
answer that shows a command to the user is not a call.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from verl_credit.trajectory import ToolCall

__all__ = ["OpenFileTracker", "parse_text_commands", "strip_scaffold_status", "update_open_file"]

_FUNCTION_CALL = re.compile(r"<function=([\w.-]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([\w.-]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_CODEACT = re.compile(r"<execute_(bash|ipython|browse)>(.*?)(?:</execute_\1>|\Z)", re.DOTALL)
_FENCE_LINE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[ \t]*$")
_SHELL_FENCES = frozenset({"bash", "sh", "shell", "console", "zsh", ""})
_ACR_API = re.compile(
    r"\b(search_class_in_file|search_class|search_method_in_file|search_method_in_class|search_method|"
    r"search_code_in_file|search_code|get_code_around_line)\s*\(([^()\n]*)\)"
)
_ACR_PATCH = re.compile(r"<file>\s*(.*?)\s*</file>\s*<original>(.*?)</original>\s*<patched>(.*?)</patched>", re.DOTALL)
_QUOTED = re.compile(r"""(['"])(.*?)(?<!\\)\1""")
_FILE_HEADER = re.compile(r"^\[File: (\S+?)(?: \(\d+ lines total\))?\]|\(Open file: (\S+?)\)", re.MULTILINE)
#: AgentSkills functions of OpenHands' IPython tool: name -> (tool name, argument names in order)
_AGENT_SKILLS = {
    "open_file": ("open", ("path", "line_number")),
    "goto_line": ("goto", ("line_number",)),
    "scroll_down": ("scroll_down", ()),
    "scroll_up": ("scroll_up", ()),
    "search_dir": ("search_dir", ("search_term", "dir")),
    "search_file": ("search_file", ("search_term", "path")),
    "find_file": ("find_file", ("file_name", "dir")),
    "create_file": ("create", ("path",)),
    "edit_file_by_replace": ("str_replace", ("path", "old_str", "new_str")),
    "edit_file": ("edit", ("path",)),
    "insert_content_at_line": ("insert", ("path", "line_number", "new_str")),
    "append_file": ("insert", ("path", "new_str")),
}
_SKILL_CALL = re.compile(r"\b(" + "|".join(_AGENT_SKILLS) + r")\s*\(")
_SWE_EDIT = re.compile(r"^edit\s+\d+(?::\d+)?\s*(?:<<-?\s*['\"]?(\w+)['\"]?)?\s*$")


@dataclass
class OpenFileTracker:
    """The file SWE-agent's windowed editor has open (``None`` until one is opened)."""

    path: str | None = None


def update_open_file(tracker: OpenFileTracker, observation: str) -> None:
    """The open file an observation reports (``[File: P (N lines total)]``, ``(Open file: P)``)."""
    for match in _FILE_HEADER.finditer(observation or ""):
        path = match.group(1) or match.group(2)
        if path and path not in ("n/a", "None"):
            tracker.path = path


#: the status lines SWE-agent appends to every observation: they name the open file, which the
#: call neither read nor searched
_STATUS_LINE = re.compile(r"^\((?:Open file|Current directory): [^\n]*\)[ \t]*$|^bash-\$[ \t]*$", re.MULTILINE)


def strip_scaffold_status(observation: str) -> str:
    """An observation without SWE-agent's ``(Open file: P)`` / ``(Current directory: D)`` /
    ``bash-$`` status lines."""
    if "(Open file:" not in observation and "bash-$" not in observation:
        return observation
    return _STATUS_LINE.sub("", observation).strip("\n")


def _call(name: str, arguments: dict[str, object]) -> ToolCall:
    return ToolCall(None, name, dict(arguments), json.dumps(arguments, sort_keys=True), True)


def _split_words(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError:
        return line.split()


def _swe_agent_command(text: str, tracker: OpenFileTracker) -> ToolCall | None:
    """The SWE-agent 0.x command a shell text is, or ``None`` when it is an ordinary command line."""
    stripped = text.strip()
    if not stripped:
        return None
    first, _, rest = stripped.partition("\n")
    words = _split_words(first)
    if not words:
        return None
    head = words[0]
    if head == "open" and len(words) >= 2:
        tracker.path = words[1]
        return _call("open", {"path": words[1]})
    if head in ("goto", "scroll_down", "scroll_up") and len(words) <= 2:
        return _call(head, {"path": tracker.path} if tracker.path else {})
    if head == "create" and len(words) == 2:
        tracker.path = words[1]
        return _call("create", {"path": words[1]})
    if head == "edit" and _SWE_EDIT.match(first.strip()):
        body = rest
        for marker in ("end_of_edit", _SWE_EDIT.match(first.strip()).group(1) or ""):  # type: ignore[union-attr]
            if marker:
                body = re.split(rf"^\s*{re.escape(marker)}\s*$", body, maxsplit=1, flags=re.MULTILINE)[0]
        return _call("edit", {"path": tracker.path or "", "new_str": body.rstrip("\n")})
    if head in ("search_dir", "find_file") and len(words) >= 2:
        key = "search_term" if head == "search_dir" else "file_name"
        arguments: dict[str, object] = {key: words[1]}
        if len(words) >= 3:
            arguments["dir"] = words[2]
        return _call(head, arguments)
    if head == "search_file" and len(words) >= 2:
        path = words[2] if len(words) >= 3 else tracker.path
        return _call("search_file", {"search_term": words[1], **({"path": path} if path else {})})
    if head == "submit" and len(words) == 1:
        return _call("submit", {})
    if head == "str_replace_editor" and len(words) >= 3:
        arguments = {"command": words[1], "path": words[2]}
        options = words[3:]
        for position in range(0, len(options) - 1):
            if options[position].startswith("--"):
                arguments[options[position][2:]] = options[position + 1]
        return _call("str_replace_editor", arguments)
    return None


def _shell_calls(text: str, tracker: OpenFileTracker) -> list[ToolCall]:
    command = _swe_agent_command(text, tracker)
    if command is not None:
        return [command]
    return [_call("bash", {"command": text.strip()})] if text.strip() else []


def _literal_arguments(text: str) -> list[str]:
    """The quoted string operands of a call written in text (``f("a", 'b')`` -> ``["a", "b"]``)."""
    return [m.group(2) for m in _QUOTED.finditer(text)]


def _ipython_calls(code: str) -> list[ToolCall]:
    calls = []
    for match in _SKILL_CALL.finditer(code):
        name, keys = _AGENT_SKILLS[match.group(1)]
        operands = _literal_arguments(code[match.end() : match.end() + 4000].split("\n)", 1)[0])
        calls.append(_call(name, dict(zip(keys, operands, strict=False))))
    if calls:
        return calls
    if not code.strip():
        return []
    if code.strip().startswith(("%pip", "!pip")):
        return [_call("bash", {"command": code.strip().lstrip("%!")})]
    return [_call("bash", {"command": f"python - <<'IPYTHON'\n{code.strip()}\nIPYTHON"})]


def _acr_calls(text: str) -> list[ToolCall]:
    calls = []
    for match in _ACR_PATCH.finditer(text):
        calls.append(
            _call("write_patch", {"path": match.group(1), "old_str": match.group(2), "new_str": match.group(3)})
        )
    for match in _ACR_API.finditer(text):
        operands = _literal_arguments(match.group(2))
        arguments: dict[str, object] = {"query": operands[0] if operands else match.group(2)}
        files = [o for o in operands[1:] if "." in o or "/" in o]
        if files:
            arguments["path"] = files[0]
        calls.append(_call(match.group(1), arguments))
    return calls


def parse_text_commands(text: str, tracker: OpenFileTracker | None = None) -> list[ToolCall]:
    """The calls one assistant message writes in its text (module docstring), in order; ``[]``
    when it writes none. ``tracker`` carries the SWE-agent open file between messages."""
    if not text:
        return []
    tracker = tracker if tracker is not None else OpenFileTracker()
    functions = list(_FUNCTION_CALL.finditer(text))
    if functions:
        calls = []
        for match in functions:
            arguments = {m.group(1): m.group(2) for m in _PARAMETER.finditer(match.group(2))}
            if match.group(1) in ("execute_bash", "bash") and isinstance(arguments.get("command"), str):
                calls.extend(_shell_calls(arguments["command"], tracker))
            else:
                calls.append(_call(match.group(1), arguments))
        return calls
    blocks = list(_CODEACT.finditer(text))
    if blocks:
        calls = []
        for match in blocks:
            kind, body = match.group(1), match.group(2)
            if kind == "bash":
                calls.extend(_shell_calls(body, tracker))
            elif kind == "ipython":
                calls.extend(_ipython_calls(body))
            else:
                calls.append(_call("browse", {"command": body.strip()}))
        return calls
    acr = _acr_calls(text)
    if acr:
        return acr
    shell_blocks = [body for language, body in _fenced_blocks(text) if language.lower() in _SHELL_FENCES]
    if shell_blocks:
        return _shell_calls(shell_blocks[-1], tracker)
    return []


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of each closed fenced block, read line by line (a fence line opens a
    block outside one and closes the block it is in), so that the closing fence of a ``python``
    block is never taken for the opening of another one."""
    if "```" not in text:
        return []
    blocks: list[tuple[str, str]] = []
    language: str | None = None
    body: list[str] = []
    for line in text.split("\n"):
        match = _FENCE_LINE.match(line)
        if match is None:
            if language is not None:
                body.append(line)
            continue
        if language is None:
            language, body = match.group(1), []
        elif not match.group(1):
            blocks.append((language, "\n".join(body)))
            language = None
        else:
            language, body = match.group(1), []  # an opening fence inside an unclosed block: start over
    return blocks
