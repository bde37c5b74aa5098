"""Shell command lines of coding-agent tool calls (DESIGN.md section 2.2): parsing and role rules.

The role vocabulary (``IG`` / ``AE`` / ``RV``) and :class:`RoleDecision` live here because the shell
rules are where decisions start; :mod:`verl_credit.annotate.roles` builds on them.

* :func:`parse_shell` splits a command line into statements (``&&`` / ``;`` / ``||`` / newline) of
  pipelines of :class:`SimpleCommand` (argv, output redirections, heredoc bodies);
* :func:`classify_simple_command` gives one command its role by program and flags (``cat``/``grep``
  -> IG; ``sed -i``, a redirection into a file, ``tee``, ``git apply`` -> AE; ``pytest``,
  ``make test``, ``npm test``, ``go test`` -> RV; ``python script.py`` -> ambiguous);
* :func:`classify_shell_command` combines them: in a pipeline only the first command counts (later
  ones are filters, ``xargs`` runs its command) unless a later one writes a file; across statements
  reads that accompany an edit or a test do not change the role, an edit *and* a test is ambiguous;
* :func:`shell_script_of` finds the command line in a shell tool call's arguments.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AE",
    "ALL_ROLES",
    "IG",
    "RV",
    "RoleDecision",
    "ShellAnalysis",
    "SimpleCommand",
    "classify_shell_command",
    "classify_simple_command",
    "parse_shell",
    "shell_script_of",
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


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


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
