"""CALL-CREDIT role classifier and causal call graph (DESIGN.md section 2.2).

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
   write confirmation -> AE; line-numbered file contents -> IG. A bare traceback decides nothing
   (a reproduction script prints one before the fix, too).

A call without tool calls (plain reasoning / answer) and a call whose only tools are planning tools
(``TodoWrite``, ``update_plan``, ``think``, ``submit``...) inherits the role of the next call, else IG.
Calls the rules cannot decide (``python script.py``, ``node x.js``, an edit and a test in one
command, no evidence at all) are flagged ``ambiguous``; their role for the math is the candidate
that the **position prior** prefers (after a read: IG before AE before RV; after an edit: RV, then
AE; after a test: AE, then IG), or what an optional :class:`RoleClassifier` (LLM) says.

Causal edges by content reference, across any distance (:func:`build_call_graph`):

* ``IG -> AE``: the AE call edits a path (or a distinctive symbol) that appeared in the IG call's
  arguments or result;
* ``AE -> RV``: the RV call runs after the AE call and before the next AE call that touches the
  same files, or the RV output names a path the AE edited;
* ``RV -> AE``: a later AE call (before the next RV call, whose output supersedes this one) edits
  a path named in the RV call's failure output (self-correction).

Path matching is by path components: ``src/app.py`` matches ``/repo/src/app.py`` and ``app.py``
(a bare name matches any file of that name); globs (``lib/*.pm``) match with ``fnmatch``.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from verl_credit.call_graph import CallEdge, CallGraph
from verl_credit.trajectory import Action, Observation, ToolCall, Trajectory

__all__ = [
    "AE",
    "IG",
    "RV",
    "CallFacts",
    "OpenAIRoleClassifier",
    "RoleClassifier",
    "RoleDecision",
    "analyze_calls",
    "build_call_graph",
    "call_graph_from_facts",
    "classify_call",
    "classify_shell_command",
    "classify_tool_call",
    "extract_paths",
    "failures_ignored",
    "paths_match",
    "rv_outcome",
]

IG, AE, RV = "IG", "AE", "RV"
ALL_ROLES: tuple[str, ...] = (IG, AE, RV)


@dataclass(frozen=True)
class RoleDecision:
    """What the rules say about one tool call, one shell command, or one whole model call.

    ``role`` is the decided role, or ``None`` when the rules could not decide (``ambiguous``) or
    the call carries no role at all (planning tools, plain text: ``ambiguous`` False, the call
    inherits). ``candidates`` are the roles still possible for an ambiguous decision.
    """

    role: str | None
    ambiguous: bool
    reason: str
    candidates: tuple[str, ...] = ()
    conflict: bool = False  # ambiguous because decided parts disagree (an edit and a test): content cannot settle it

    @property
    def no_role(self) -> bool:
        return self.role is None and not self.ambiguous


def _decided(role: str, reason: str) -> RoleDecision:
    return RoleDecision(role, False, reason, (role,))


def _ambiguous(reason: str, candidates: Iterable[str] = ALL_ROLES, conflict: bool = False) -> RoleDecision:
    ordered = tuple(r for r in ALL_ROLES if r in set(candidates)) or ALL_ROLES
    return RoleDecision(None, True, reason, ordered, conflict)


_NO_ROLE = RoleDecision(None, False, "no tool call")

# ---------------------------------------------------------------------------------------------
# Tool names
# ---------------------------------------------------------------------------------------------


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


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
    "webfetch web_fetch websearch web_search google_web_search notebookread codebase_search file_search"
)
AE_TOOLS = _words(
    "edit multiedit write write_file create create_file apply_patch str_replace replace insert edit_file notebookedit "
    "delete_file move_file rename_file patch search_replace"
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
# Shell command lines
# ---------------------------------------------------------------------------------------------

IG_PROGRAMS = _words(
    "cat ls ll grep egrep fgrep rg ag ack find fd head tail less more wc tree nl file stat du df pwd which whereis "
    "type realpath readlink sort uniq cut diff cmp jq yq xxd od hexdump strings column bat locate printenv uname "
    "whoami ps lsof awk sed man zcat tr basename dirname id env"
)
AE_PROGRAMS = _words(
    "patch apply_patch mv cp rm rmdir mkdir touch ln chmod chown truncate dd unzip tee ed install black isort autopep8 "
    "gofmt rustfmt prettier yapf"
)
RV_PROGRAMS = _words(
    "pytest py.test tox nox jest mocha vitest ava karma phpunit rspec ctest nosetests trial mypy pyright flake8 pylint "
    "tsc eslint shellcheck hadolint golangci-lint cypress playwright runtests runtests.py runtests.sh"
)
NEUTRAL_PROGRAMS = _words(
    "cd pushd popd export set source . true false echo printf sleep exit clear unset alias : wait shopt ulimit umask"
)
_WRAPPERS = _words("sudo time nice nohup command exec xvfb-run stdbuf builtin")
_INTERPRETERS = _words("python python3 python2 pypy pypy3 node ruby perl bash sh zsh deno bun php Rscript julia lua")
_PIPE_FILTERS = IG_PROGRAMS | NEUTRAL_PROGRAMS | {"xargs"}
_PY_MODULES_RV = _words("pytest unittest doctest nose nose2 tox nox mypy pyright flake8 pylint compileall py_compile")
_PY_MODULES_IG = _words("pydoc json.tool tokenize site")
_GIT_IG = _words(
    "status log diff show blame grep ls-files ls-tree rev-parse describe shortlog reflog remote config cat-file "
    "whatchanged branch tag"
)
_GIT_AE = _words(
    "apply checkout restore reset commit add rm mv stash cherry-pick revert merge rebase am switch clean init clone "
    "pull push fetch"
)
_BUILD_TOOLS_RV = {
    "go": {"test", "vet", "build"},
    "cargo": {"test", "check", "build", "clippy", "nextest", "bench"},
    "mvn": {"test", "verify", "package", "compile"},
    "gradle": {"test", "check", "build"},
    "./gradlew": {"test", "check", "build"},
    "gradlew": {"test", "check", "build"},
    "dotnet": {"test", "build"},
    "swift": {"test", "build"},
    "mix": {"test", "compile"},
    "stack": {"test", "build"},
    "cabal": {"test", "build"},
    "bazel": {"test", "build"},
    "deno": {"test", "check", "lint"},
    "bun": {"test"},
    "rake": {"test", "spec"},
}
_BUILD_TOOLS_AE = {
    "cargo": {"fmt", "add", "remove", "update"},
    "go": {"get", "fmt", "generate"},
    "mix": {"format", "deps.get"},
    "dotnet": {"add", "new"},
}
_PKG_MANAGERS = frozenset({"npm", "yarn", "pnpm"})
_PKG_AE = frozenset({"install", "i", "add", "remove", "uninstall", "ci", "update", "upgrade", "link"})
_TEST_SCRIPT = re.compile(
    r"(^|/)(test_[\w.-]*|[\w.-]*_test|[\w-]*tests?|runtests)(\.py|\.sh|\.js|\.ts)?$", re.IGNORECASE
)
_TEST_TARGET = re.compile(
    r"^(test|tests|check|lint|typecheck|build|all|ci|unit|e2e|integration)([:-].*)?$", re.IGNORECASE
)
_FD_REDIRECT = re.compile(r"^\d*$")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")


@dataclass
class SimpleCommand:
    """One simple command of a command line: its argv, its output redirections, its heredoc body."""

    argv: list[str]
    writes: list[str] = field(default_factory=list)  # files written by > / >> / &>
    heredoc: str = ""


@dataclass
class ShellAnalysis:
    """A command line parsed into statements (``&&``/``;``/``||``/newline) of pipelines."""

    statements: list[list[SimpleCommand]]
    parse_error: bool = False


def _split_heredocs(script: str) -> tuple[str, list[str]]:
    """Remove heredoc bodies from a script. Returns the command text and the bodies, in order."""
    lines = script.split("\n")
    kept: list[str] = []
    bodies: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        kept.append(line)
        index += 1
        for match in _HEREDOC.finditer(line):
            marker = match.group(2)
            body: list[str] = []
            while index < len(lines) and lines[index].strip() != marker:
                body.append(lines[index])
                index += 1
            index += 1  # the marker line
            bodies.append("\n".join(body))
    return "\n".join(kept), bodies


def parse_shell(script: str) -> ShellAnalysis:
    """Tokenize a command line into statements and pipelines of :class:`SimpleCommand`."""
    text, bodies = _split_heredocs(script)
    parse_error = False
    tokens: list[str] = []
    for line in text.split("\n"):
        if not line.strip():
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens.extend(list(lexer))
        except ValueError:  # unbalanced quotes
            parse_error = True
            tokens.extend(line.split())
        tokens.append(";")
    statements: list[list[SimpleCommand]] = []
    pipeline: list[SimpleCommand] = []
    current = SimpleCommand([])
    body_iter = iter(bodies)
    position = 0

    def close_command() -> None:
        nonlocal current
        if current.argv or current.writes:
            pipeline.append(current)
        current = SimpleCommand([])

    def close_statement() -> None:
        nonlocal pipeline
        close_command()
        if pipeline:
            statements.append(pipeline)
        pipeline = []

    while position < len(tokens):
        token = tokens[position]
        if token in ("&&", "||", ";", "&", ";;", "(", ")", "{", "}"):
            close_statement()
        elif token in ("|", "|&"):
            close_command()
        elif token in (">", ">>", "&>", ">|", "&>>", ">&"):
            target = tokens[position + 1] if position + 1 < len(tokens) else ""
            fd = (
                current.argv[-1] if current.argv and _FD_REDIRECT.match(current.argv[-1]) and current.argv[-1] else None
            )
            if fd is not None:
                current.argv.pop()
            position += 1
            if (
                token == ">&"
                or target.startswith("&")
                or target.isdigit()
                or target in ("/dev/null", "/dev/stderr", "/dev/stdout")
            ):
                pass  # fd duplication / discarding output
            elif fd in ("2",) and token in (">", ">>"):
                pass  # stderr into a log file is not an edit of the code
            else:
                current.writes.append(target)
        elif token in ("<<", "<<-"):
            position += 1  # the marker
            current.heredoc = next(body_iter, "")
        elif token in ("<", "<<<", "<&"):
            position += 1
        else:
            current.argv.append(token)
        position += 1
    close_statement()
    return ShellAnalysis(statements, parse_error)


def _strip_wrappers(argv: list[str]) -> list[str]:
    """Drop ``FOO=bar`` assignments, ``sudo``/``time``/``timeout N``/``env`` and runner prefixes."""
    args = list(argv)
    while args:
        head = args[0]
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", head) or head in _WRAPPERS:
            args.pop(0)
        elif head == "env" and len(args) > 1:
            args.pop(0)
        elif head == "timeout" and len(args) > 2:
            args = args[2:]
        elif head in ("npx", "pnpx", "bunx") or (
            head in ("uv", "poetry", "pipenv", "pdm", "hatch") and len(args) > 1 and args[1] == "run"
        ):
            args = args[2:] if head not in ("npx", "pnpx", "bunx") else args[1:]
            while args and args[0].startswith("-"):
                args.pop(0)
        elif head in ("bundle",) and len(args) > 1 and args[1] == "exec":
            args = args[2:]
        else:
            break
    return args


def _positional(args: Sequence[str]) -> list[str]:
    return [a for a in args if not a.startswith("-")]


def _classify_python(args: list[str]) -> RoleDecision:
    """``python ...`` by its module or script (``args`` excludes the interpreter)."""
    rest = [a for a in args if a not in ("-u", "-B", "-O", "-OO", "-q", "-E", "-s", "-I") and not a.startswith("-W")]
    if not rest:
        return _ambiguous("interactive interpreter")
    if rest[0] == "-m" and len(rest) > 1:
        module = rest[1]
        if module in _PY_MODULES_RV or module.startswith("pytest"):
            return _decided(RV, f"python -m {module}")
        if module == "pip":
            sub = rest[2] if len(rest) > 2 else ""
            return _decided(AE, "pip install") if sub in ("install", "uninstall") else _decided(IG, f"pip {sub}")
        if module in ("black", "isort", "autopep8", "yapf"):
            return _check_or_format(module, rest[2:])
        if module in ("ruff",):
            return _classify_ruff(rest[2:])
        if module in _PY_MODULES_IG:
            return _decided(IG, f"python -m {module}")
        return _ambiguous(f"python -m {module}")
    if rest[0] in ("-c", "-"):
        return _ambiguous("inline python program")
    script = rest[0]
    base = script.rsplit("/", 1)[-1]
    if base == "manage.py" and len(rest) > 1 and rest[1] == "test":
        return _decided(RV, "manage.py test")
    if base == "setup.py" and len(rest) > 1 and rest[1] == "test":
        return _decided(RV, "setup.py test")
    if _TEST_SCRIPT.search(script):
        return _decided(RV, f"test script {script}")
    return _ambiguous(f"python script {script}")


def _check_or_format(program: str, args: Sequence[str]) -> RoleDecision:
    if any(a in ("--check", "--diff", "-c", "--check-only") for a in args):
        return _decided(RV, f"{program} --check")
    return _decided(AE, f"formatter {program}")


def _classify_ruff(args: Sequence[str]) -> RoleDecision:
    positional = _positional(args)
    if positional and positional[0] == "format":
        return _check_or_format("ruff format", args)
    if "--fix" in args:
        return _decided(AE, "ruff --fix")
    return _decided(RV, "ruff check")


def classify_simple_command(command: SimpleCommand) -> RoleDecision:
    """Role of one simple command (program + flags + redirections); ``no_role`` for ``cd`` etc.

    A redirection into a file makes the command AE, except for a verification command whose
    output goes to a log (``pytest > out.txt`` stays RV).
    """
    decision = _classify_argv(command)
    if command.writes and decision.role != RV:
        return _decided(AE, f"redirection into {command.writes[0]}")
    return decision


def _classify_argv(command: SimpleCommand) -> RoleDecision:
    argv = _strip_wrappers(command.argv)
    if not argv:
        return _NO_ROLE
    program = argv[0]
    base = program.rsplit("/", 1)[-1]
    args = argv[1:]
    if base in ("sed", "perl", "ruby") and any(re.match(r"^-[a-zA-Z]*i", a) for a in args):
        return _decided(AE, f"{base} -i (in-place edit)")
    if base == "awk" and "inplace" in args:
        return _decided(AE, "awk -i inplace")
    if base == "tee":
        return _decided(AE, "tee into a file") if _positional(args) else _NO_ROLE
    if base in NEUTRAL_PROGRAMS:
        return _NO_ROLE
    if base in ("python", "python3", "python2", "pypy", "pypy3") or re.match(r"^python3\.\d+$", base):
        return _classify_python(args)
    if base in ("pip", "pip3", "uv", "poetry", "pipenv", "conda"):
        sub = _positional(args)[:1]
        if sub and sub[0] in ("install", "uninstall", "add", "remove", "sync", "lock", "update", "create"):
            return _decided(AE, f"{base} {sub[0]}")
        if sub and sub[0] in ("show", "list", "freeze", "search", "info", "env", "tree", "check"):
            return _decided(IG, f"{base} {sub[0]}")
        return _ambiguous(f"{base} {' '.join(sub)}")
    if base == "git":
        sub = _positional(args)[:1]
        if sub and sub[0] in _GIT_IG:
            return _decided(IG, f"git {sub[0]}")
        if sub and sub[0] in _GIT_AE:
            return _decided(AE, f"git {sub[0]}")
        return _ambiguous(f"git {' '.join(sub)}")
    if base in ("ruff",):
        return _classify_ruff(args)
    if base in ("black", "isort", "autopep8", "yapf", "gofmt", "rustfmt", "prettier"):
        if base == "gofmt":
            return _decided(AE, "gofmt -w") if "-w" in args else _decided(IG, "gofmt (prints)")
        if base == "prettier":
            return (
                _decided(AE, "prettier --write")
                if "--write" in args or "-w" in args
                else _decided(RV, "prettier --check")
            )
        return _check_or_format(base, args)
    if base == "eslint":
        return _decided(AE, "eslint --fix") if "--fix" in args else _decided(RV, "eslint")
    if base in _PKG_MANAGERS:
        positional = _positional(args)
        sub = positional[0] if positional else ""
        if sub in ("test", "t") or (sub == "run" and len(positional) > 1 and _TEST_TARGET.match(positional[1])):
            return _decided(RV, f"{base} {' '.join(positional[:2])}")
        if base == "yarn" and sub and _TEST_TARGET.match(sub):
            return _decided(RV, f"yarn {sub}")
        if sub in _PKG_AE:
            return _decided(AE, f"{base} {sub}")
        if sub in ("ls", "list", "view", "info", "outdated", "why"):
            return _decided(IG, f"{base} {sub}")
        return _ambiguous(f"{base} {' '.join(positional[:2])}")
    if base in ("make", "gmake"):
        targets = [a for a in _positional(args) if "=" not in a]
        if not targets or all(_TEST_TARGET.match(t) for t in targets):
            return _decided(RV, f"make {' '.join(targets)}".strip())
        return _ambiguous(f"make {' '.join(targets)}")
    if base in _BUILD_TOOLS_RV or base in _BUILD_TOOLS_AE or program in _BUILD_TOOLS_RV:
        sub = _positional(args)[:1]
        key = program if program in _BUILD_TOOLS_RV else base
        if sub and sub[0] in _BUILD_TOOLS_RV.get(key, set()):
            return _decided(RV, f"{base} {sub[0]}")
        if sub and sub[0] in _BUILD_TOOLS_AE.get(key, set()):
            return _decided(AE, f"{base} {sub[0]}")
        return _ambiguous(f"{base} {' '.join(sub)}")
    if base == "apply_patch":
        return _decided(AE, "apply_patch")
    if base in RV_PROGRAMS or (_TEST_SCRIPT.search(program) and "/" in program) or base in ("runtests.py", "runtests"):
        return _decided(RV, f"test runner {base}")
    if base in AE_PROGRAMS:
        return _decided(AE, f"{base} changes files")
    if base in IG_PROGRAMS:
        return _decided(IG, f"{base} reads")
    if base in _INTERPRETERS:
        script = _positional(args)[:1]
        if script and _TEST_SCRIPT.search(script[0]):
            return _decided(RV, f"test script {script[0]}")
        return _ambiguous(f"{base} {' '.join(script) or 'inline program'}")
    return _ambiguous(f"unknown program {base}")


def _combine(decisions: Sequence[RoleDecision], what: str) -> RoleDecision:
    """Several decisions of one call (statements of a command line, tool calls of one message).

    Reads that accompany an edit or a test do not change its role; an edit together with a test
    is ambiguous; any undecided part makes the whole ambiguous.
    """
    relevant = [d for d in decisions if not d.no_role]
    if not relevant:
        return _NO_ROLE
    undecided = [d for d in relevant if d.ambiguous]
    roles = {d.role for d in relevant if d.role is not None}
    if undecided:
        candidates = set(roles)
        for d in undecided:
            candidates.update(d.candidates)
        return _ambiguous("; ".join(d.reason for d in undecided), candidates, any(d.conflict for d in undecided))
    reason = "; ".join(dict.fromkeys(d.reason for d in relevant))
    if len(roles) == 1:
        return _decided(roles.pop(), reason)
    if roles == {IG, AE}:
        return _decided(AE, f"{what}: edit with reads ({reason})")
    if roles == {IG, RV}:
        return _decided(RV, f"{what}: tests with reads ({reason})")
    return _ambiguous(f"{what} mixes edits and tests ({reason})", roles - {IG}, conflict=True)


def _xargs_command(args: Sequence[str]) -> list[str]:
    """The command ``xargs`` runs: its arguments after xargs' own options."""
    rest = list(args)
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option in ("-n", "-I", "-P", "-L", "-d", "-s", "-E", "-a") and rest:
            rest.pop(0)
    return rest


def classify_shell_command(script: str) -> RoleDecision:
    """Role of a shell command line (see the module docstring)."""
    if not script or not script.strip():
        return _ambiguous("empty command")
    analysis = parse_shell(script)
    if analysis.parse_error:
        return _ambiguous("unparseable command line")
    statement_decisions = []
    for pipeline in analysis.statements:
        first = classify_simple_command(pipeline[0])
        later = []
        for command in pipeline[1:]:
            argv = _strip_wrappers(command.argv)
            base = argv[0].rsplit("/", 1)[-1] if argv else ""
            if command.writes or base == "tee":
                later.append(classify_simple_command(command))
            elif base == "xargs":
                inner = _xargs_command(argv[1:])
                later.append(classify_simple_command(SimpleCommand(inner)) if inner else _NO_ROLE)
            elif base not in _PIPE_FILTERS:
                later.append(classify_simple_command(command))
        decision = _combine([first, *later], "pipeline") if later else first
        statement_decisions.append(decision)
    combined = _combine(statement_decisions, "command line")
    if combined.no_role:
        return _ambiguous("command line without a classifiable program")
    return combined


def shell_script_of(arguments: Mapping[str, Any]) -> str | None:
    """The command line of a shell tool call (``command``/``cmd``/``script`` as a string, or a
    Codex argv such as ``["bash", "-lc", "..."]``)."""
    for key in ("command", "cmd", "script", "commands", "code", "input"):
        value = arguments.get(key)
        if isinstance(value, str) and value.strip():
            return value
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            if (
                value[0].rsplit("/", 1)[-1] in ("bash", "sh", "zsh")
                and len(value) >= 3
                and value[1] in ("-lc", "-c", "-ic")
            ):
                return value[2]
            if value[0] == "apply_patch":
                return "apply_patch <<'PATCH'\n" + "\n".join(value[1:]) + "\nPATCH"
            return shlex.join(value)
    return None


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
            decision.role, decision.ambiguous, f"{name}: {decision.reason}", decision.candidates, decision.conflict
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
    """Role of one tool call: tool-type / command-line signal, then the content signal."""
    decision = _name_signal(name, arguments)
    if not decision.ambiguous or decision.conflict:
        return decision
    content = classify_content(result)
    if not content.ambiguous and content.role in decision.candidates:
        return _decided(content.role, f"{decision.reason}; content: {content.reason}")  # type: ignore[arg-type]
    return decision


def _results_by_call(action: Action, observations: Sequence[Observation]) -> list[str]:
    """The result text of each of ``action``'s tool calls (matched by id, else in order)."""
    mine = [o for o in observations if o.role == "tool" and o.source_action in (action.index, None)]
    by_id = {o.tool_call_id: o.content for o in mine if o.tool_call_id}
    unmatched = iter(
        [o.content for o in mine if not o.tool_call_id or o.tool_call_id not in {c.id for c in action.tool_calls}]
    )
    results = []
    for call in action.tool_calls:
        if call.id and call.id in by_id:
            results.append(by_id[call.id])
        else:
            results.append(next(unmatched, ""))
    return results


def _classify_with_results(action: Action, results: Sequence[str]) -> RoleDecision:
    if not action.tool_calls:
        return _NO_ROLE
    decisions = [classify_tool_call(c.name, c.arguments, r) for c, r in zip(action.tool_calls, results, strict=True)]
    return _combine(decisions, "tool calls")


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
# Paths, symbols, test outcomes
# ---------------------------------------------------------------------------------------------

_EXTENSIONS = (
    "py|pyi|pyx|ipynb|js|jsx|mjs|cjs|ts|tsx|vue|svelte|go|rs|java|kt|kts|scala|c|h|cc|cpp|cxx|hpp|hh|m|mm|cs|fs|rb|"
    "php|pl|pm|swift|dart|lua|r|jl|ex|exs|erl|hs|ml|clj|sol|sh|bash|zsh|ps1|sql|md|rst|txt|json|jsonl|yaml|yml|toml|"
    "cfg|ini|conf|env|lock|xml|html|htm|css|scss|less|gradle|mk|cmake|proto|graphql|tf|csv|patch|diff|sqlite|db"
)
_PATH = re.compile(
    rf"(?:~|\.{{1,2}})?/?(?:[\w.*@+-]+/)*[\w*@+-][\w.*@+-]*\.(?:{_EXTENSIONS})|"
    rf"(?:[\w.@+-]+/)*(?:Makefile|Dockerfile|Gemfile|Rakefile|Procfile|\.gitignore|\.env)"
)
_TOKEN = re.compile(r"[\w.*@+~/-]+")
_SPECIAL_FILES = ("Makefile", "Dockerfile", "Gemfile", "Rakefile", "Procfile")
_PATH_KEYS = (
    "file_path",
    "path",
    "absolute_path",
    "filename",
    "file",
    "target_file",
    "notebook_path",
    "paths",
    "dir",
    "directory",
    "dir_path",
)
_PATCH_HEADER = re.compile(
    r"^\*\*\* (?:Update|Add|Delete) File: (\S+)|^\*\*\* Move to: (\S+)|^\+\+\+ (?:b/)?(\S+)|"
    r"^--- (?:a/)?(\S+)|^patching file '?([^'\s]+)'?|^[MAD] (\S+)$|^\[File: (\S+)",
    re.MULTILINE,
)
_IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
_DEFINITION = re.compile(
    r"\b(?:def|class|fn|func|function|interface|struct|enum|trait|type)\s+([A-Za-z_][A-Za-z0-9_]*)"
)
_FAIL = re.compile(
    r"(\b[1-9]\d* (failed|errors?)\b|^FAILED\b|^FAIL\b|^--- FAIL|\bFAIL\s+\S|test result: FAILED|"
    r"^E\s{2,}|AssertionError|Traceback \(most recent call last\)|^error(\[E\d+\])?:|\berror TS\d+|"
    r"Found [1-9]\d* errors?|[Ee]xit [Cc]ode:? [1-9]|\"exit_code\": [1-9]|\u00d7 |\u276f .*\(\d+\)|FAILED \()",
    re.MULTILINE,
)
_PASS = re.compile(
    r"(\b\d+ passed\b|^OK\b|test result: ok\.|All checks passed|^PASS\b|^ok\s+\S|tests finished: \d+ passed|"
    r"Test Files\s+\d+ passed|\u2713|congratulations|Success: no issues|[Ee]xit [Cc]ode:? 0\b)",
    re.MULTILINE,
)


def extract_paths(text: str) -> set[str]:
    """Path-like tokens of ``text`` (files with a known extension, ``Makefile``, ``.env``...) plus the
    targets named by patch / diff headers."""
    found = set()
    for token in _TOKEN.findall(text or ""):
        token = token.rstrip(".-")
        if ("." in token or token.endswith(_SPECIAL_FILES)) and _PATH.fullmatch(token):
            path = _normalize_path(token)
            if path:
                found.add(path)
    for path in _patch_targets(text or ""):
        if _PATH.fullmatch(path) or "/" in path:
            found.add(path)
    return found


def _normalize_path(path: str) -> str:
    path = path.strip().strip("'\"`,:;()[]")
    while path.startswith("./"):
        path = path[2:]
    return re.sub(r"/+", "/", path).rstrip("/")


def paths_match(a: str, b: str) -> bool:
    """True when one path is a component-suffix of the other (globs match with fnmatch)."""
    if not a or not b:
        return False
    if "*" in a or "*" in b:
        pattern, other = (a, b) if "*" in a else (b, a)
        parts_p, parts_o = pattern.split("/"), other.split("/")
        n = min(len(parts_p), len(parts_o))
        return fnmatch.fnmatchcase("/".join(parts_o[-n:]), "/".join(parts_p[-n:]))
    parts_a, parts_b = a.split("/"), b.split("/")
    n = min(len(parts_a), len(parts_b))
    return parts_a[-n:] == parts_b[-n:] and parts_a[-1] != ""


def _matching(paths: Iterable[str], others: Iterable[str]) -> str | None:
    others = list(others)
    for path in sorted(paths):
        for other in others:
            if paths_match(path, other):
                return path
    return None


def rv_outcome(text: str) -> str | None:
    """``"fail"`` / ``"pass"`` / ``None`` for a verification output (failure wins when both)."""
    if not text or not text.strip():
        return None
    if _FAIL.search(text):
        return "fail"
    if _PASS.search(text):
        return "pass"
    return None


def _string_values(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _string_values(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _string_values(v)]
    return []


def _argument_paths(arguments: Mapping[str, Any]) -> set[str]:
    """Paths named by path-valued argument keys (directories included) plus path tokens anywhere."""
    paths = set()
    for key in _PATH_KEYS:
        for value in _string_values(arguments.get(key)):
            if value.strip() and "\n" not in value:
                paths.add(_normalize_path(value))
    for value in _string_values(arguments):
        paths |= extract_paths(value)
    return {p for p in paths if p}


def _distinctive(identifier: str) -> bool:
    """Symbols worth matching: long enough and not a plain English word (has ``_`` or camelCase)."""
    return len(identifier) >= 4 and ("_" in identifier.strip("_") or bool(re.search(r"[a-z][A-Z]", identifier)))


def _symbols(text: str) -> set[str]:
    """Definitions (``def x``, ``class X``...) and distinctive identifiers of ``text``."""
    names = set(_DEFINITION.findall(text or ""))
    names |= {s for s in _IDENTIFIER.findall(text or "") if _distinctive(s)}
    return {n for n in names if len(n) >= 4}


_EDIT_TEXT_KEYS = (
    "old_string",
    "old_str",
    "old",
    "oldText",
    "search",
    "replacement",
    "new_string",
    "new_str",
    "new",
    "newText",
    "content",
    "file_text",
    "edits",
    "input",
    "patch",
    "insert_text",
)


_FILE_ARG_PROGRAMS = _words(
    "sed perl ruby awk tee rm touch mv cp truncate black isort autopep8 prettier gofmt rustfmt chmod ln"
)
_GIT_FILE_COMMANDS = _words("checkout restore rm mv add")


def _shell_edit_paths(script: str, result: str) -> set[str]:
    """Files a shell command line writes: redirection targets, file arguments of editing programs
    (``sed -i``, ``tee``, ``rm``, ``mv``...), patch headers of heredoc patches, and targets the
    output reports (``patching file X``, ``M X``)."""
    paths = set()
    for pipeline in parse_shell(script).statements:
        for command in pipeline:
            paths |= {_normalize_path(w) for w in command.writes}
            argv = _strip_wrappers(command.argv)
            if not argv:
                continue
            base = argv[0].rsplit("/", 1)[-1]
            if base in _FILE_ARG_PROGRAMS or (base == "git" and len(argv) > 1 and argv[1] in _GIT_FILE_COMMANDS):
                paths |= {_normalize_path(a) for a in argv[1:] if not a.startswith("-") and _looks_like_file(a)}
            if command.heredoc and base in ("apply_patch", "patch", "git"):
                paths |= _patch_targets(command.heredoc)
    paths |= _patch_targets(result)
    return {p for p in paths if p and p != "/dev/null"}


def _edit_paths(call: ToolCall, result: str, script: str | None) -> set[str]:
    """Files an AE tool call writes (best effort; empty when unknown)."""
    if script is not None:
        return _shell_edit_paths(script, result)
    paths = _argument_paths(call.arguments) - {""}
    for key in ("input", "patch"):
        value = call.arguments.get(key)
        if isinstance(value, str):  # a patch: its headers name the files, not every path it mentions
            paths = (paths - extract_paths(value)) | _patch_targets(value)
    if not paths:
        paths = _patch_targets(result) or extract_paths(result)
    return paths


def _looks_like_file(arg: str) -> bool:
    """A command-line argument that names a file (not a sed/perl expression, not a flag value)."""
    if not re.fullmatch(r"[\w.*@+~/-]+", arg) or arg.startswith("s/"):
        return False
    return bool(_PATH.fullmatch(arg)) or "/" in arg or "." in arg.strip(".")


def _patch_targets(text: str) -> set[str]:
    """Targets named by patch / diff headers, ``patching file X``, ``M X``, ``[File: X``."""
    found = set()
    for match in _PATCH_HEADER.finditer(text or ""):
        for group in match.groups():
            if group and group != "/dev/null":
                path = _normalize_path(group)
                if path:
                    found.add(path)
    return found


def _edited_symbols(call: ToolCall) -> set[str]:
    texts = []
    for key in _EDIT_TEXT_KEYS:
        texts.extend(_string_values(call.arguments.get(key)))
    removed = []
    for text in texts:
        lines = text.split("\n")
        if any(line.startswith(("*** Begin Patch", "@@", "--- ")) for line in lines):
            removed.extend(line[1:] for line in lines if line.startswith(("-", " ")) and not line.startswith("---"))
        else:
            removed.append(text)
    return _symbols("\n".join(removed))


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


def analyze_calls(trajectory: Trajectory, classifier: RoleClassifier | None = None) -> list[CallFacts]:
    """Roles (with inheritance, position prior, optional LLM) and content facts for every call."""
    observations_of: dict[int, list[Observation]] = {}
    for observation in trajectory.observations:
        if observation.source_action is not None:
            observations_of.setdefault(observation.source_action, []).append(observation)
    results_per_action = [_results_by_call(a, observations_of.get(a.index, [])) for a in trajectory.actions]
    decisions = [_classify_with_results(a, r) for a, r in zip(trajectory.actions, results_per_action, strict=True)]

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
                    tuple((c.name, c.raw_arguments) for c in action.tool_calls),
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
        results = results_per_action[i]
        edited: set[str] = set()
        mentioned: set[str] = set()
        edited_symbols: set[str] = set()
        texts: list[str] = []
        output_paths: set[str] = set()
        for call, result in zip(action.tool_calls, results, strict=True):
            script = shell_script_of(call.arguments) if call.name.lower() in SHELL_TOOLS else None
            result_paths = extract_paths(result)
            output_paths |= result_paths
            mentioned |= _argument_paths(call.arguments) | result_paths
            texts.append("\n".join(_string_values(call.arguments)))
            texts.append(result)
            if role == AE:
                edited |= _edit_paths(call, result, script)
                edited_symbols |= _edited_symbols(call)
        output = "\n".join(results)
        status = rv_outcome(output) if role == RV else None
        facts.append(
            CallFacts(
                index=i,
                role=role,
                ambiguous=ambiguous[i],
                reason=_fact_reason(decisions[i], sources[i], role),
                source=sources[i],
                edited_paths=frozenset(edited),
                mentioned_paths=frozenset(mentioned),
                edited_symbols=frozenset(edited_symbols),
                mentioned_identifiers=frozenset(_IDENTIFIER.findall("\n".join(texts))),
                rv_status=status,
                failure_paths=frozenset(output_paths) if status == "fail" else frozenset(),
                summary="; ".join(_summary(c) for c in action.tool_calls)
                or (action.content[:120] if action.content else ""),
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


def call_graph_from_facts(facts: Sequence[CallFacts]) -> CallGraph:
    """The causal edges of section 2.2 over analysed calls (see the module docstring)."""
    edges: list[CallEdge] = []
    ae_calls = [f for f in facts if f.role == AE]
    rv_calls = [f for f in facts if f.role == RV]
    # IG -> AE: the edit touches a path (or a distinctive symbol) the read saw.
    for ae in ae_calls:
        for ig in facts[: ae.index]:
            if ig.role != IG:
                continue
            unit = _matching(ae.edited_paths, ig.mentioned_paths)
            if unit is None:
                shared = sorted(ae.edited_symbols & ig.mentioned_identifiers)
                symbol = shared[0] if shared else None
                unit = f"symbol:{symbol}" if symbol else None
            if unit is not None:
                edges.append(CallEdge(ig.index, ae.index, "IG->AE", unit))
    # AE -> RV: tests after the edit and before the next edit of the same files (or naming them).
    for ae in ae_calls:
        for rv in rv_calls:
            if rv.index <= ae.index:
                continue
            blocked = any(
                ae.index < other.index < rv.index
                and other.source not in _NO_TOOL_SOURCES
                and _touch_same_files(ae.edited_paths, other.edited_paths)
                for other in ae_calls
            )
            named = _matching(ae.edited_paths, rv.mentioned_paths)
            if not blocked or named is not None:
                unit = named or (sorted(ae.edited_paths)[0] if ae.edited_paths else "")
                edges.append(CallEdge(ae.index, rv.index, "AE->RV", unit))
    # RV -> AE: a later edit (before the next test run) of a path named in the failure output.
    for rv in rv_calls:
        if rv.rv_status != "fail" or not rv.failure_paths:
            continue
        for later in facts[rv.index + 1 :]:
            if later.role == RV:
                break
            if later.role == AE:
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
    """Roles and causal edges of one trajectory's calls (DESIGN.md section 2.2)."""
    return call_graph_from_facts(analyze_calls(trajectory, classifier))


# ---------------------------------------------------------------------------------------------
# Optional LLM classifier for ambiguous calls
# ---------------------------------------------------------------------------------------------

ROLE_PROMPT = """You label one model call of a coding agent with its functional role.
IG (information gathering): reads, views, searches, lists, or runs something only to learn about the code or the bug.
AE (action execution): changes files or state: edits, writes, patches, creates, deletes, installs, migrates.
RV (result verification): checks a change: runs tests, type checks, linters, builds, or re-runs a reproduction
after a fix.
Answer with JSON {"role": "IG" | "AE" | "RV"}."""


class OpenAIRoleClassifier:
    """:class:`RoleClassifier` over an OpenAI-compatible chat-completions endpoint (e.g. vLLM).

    Off by default (``build_call_graph`` uses it only when passed). Temperature 0, JSON-schema
    constrained output. Transport errors, timeouts and 408/429/5xx answers are retried ``max_retries``
    times with backoff (:func:`verl_credit.openai_chat.post_chat_completion_sync`); an answer that is not
    ``{"role": <IG|AE|RV>}`` is not retried (temperature 0 repeats it). Any failure returns ``None``
    (the position prior then decides), is counted in :attr:`failures` and described in
    :attr:`last_error`. ``transport`` lets tests answer in-process.
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
    ) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.context_chars = context_chars
        self.failures = 0
        self.calls = 0
        self.last_error: str | None = None
        self._client = httpx.Client(timeout=timeout, headers=headers, transport=transport)

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
        }

    def classify(self, call: CallDescription) -> str | None:
        from verl_credit.openai_chat import ChatCompletionError, message_content, post_chat_completion_sync

        self.calls += 1
        try:
            response = post_chat_completion_sync(
                self._client, self.url, self._request(call), max_retries=self.max_retries, backoff_s=self.backoff_s
            )
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
        later_edits = [f for f in facts[fact.index + 1 :] if f.role == AE and f.source not in _NO_TOOL_SOURCES]
        if fact.failure_paths:
            answered = any(_matching(f.edited_paths, fact.failure_paths) is not None for f in later_edits)
        else:
            answered = bool(later_edits)
        out.append(not answered)
    return out
