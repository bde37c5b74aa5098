"""Shell command lines of coding-agent tool calls (docs/design.md section 2.2): parsing and role rules.

The role vocabulary (``IG`` / ``AE`` / ``RV``) and :class:`RoleDecision` live here because the shell
rules are where decisions start; :mod:`verl_credit.annotate.roles` builds on them.

* :func:`parse_shell` splits a command line into statements (``&&`` / ``;`` / ``||`` / newline) of
  pipelines of :class:`SimpleCommand` (argv, output redirections, heredoc bodies);
* :func:`classify_simple_command` gives one command its role by program and flags (``cat``/``grep``
  -> IG; ``sed -i``, a redirection into a file, ``tee``, ``git apply`` -> AE; ``pytest`` under any
  name or interpreter options, ``python -m django test``, ``runtests.py``, ``tox``, ``nox``,
  ``coverage run -m pytest``, ``make test``, ``npm test``, ``go test`` -> RV; ``python script.py``
  -> ambiguous, a program run whose output may decide; a ``python -c`` / script program that
  rewrites project files -> AE). A read whose output is saved into an artifact (``git diff >
  patch.txt``, the submission; ``grep ... > hits.txt``) keeps its role: it edits nothing;
* :func:`classify_shell_command` combines them: in a pipeline only the first command counts (later
  ones are filters, ``xargs`` runs its command) unless a later one writes a file; across statements
  reads that accompany an edit or a test do not change the role, nor do package installs that
  accompany a test or a run; an edit *and* a test is ambiguous; a script the command line writes
  only to run it (``cat > t.py <<EOF ... EOF && python t.py``) takes the role of the run; the
  harness's submission step (``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT ...``) has no role;
* :func:`parse_shell` keeps quoted newlines (``python -c "..."`` over several lines), line
  continuations and ``find -exec ... \\;`` inside their command;
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
    "executed_scripts",
    "is_artifact",
    "parse_shell",
    "program_edits_files",
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
    runs_program: bool = False  # undecided because it runs a program (``python script.py``): its output may decide

    @property
    def no_role(self) -> bool:
        return self.role is None and not self.ambiguous


def _decided(role: str, reason: str) -> RoleDecision:
    return RoleDecision(role, False, reason, (role,))


def _ambiguous(
    reason: str, candidates: Iterable[str] = ALL_ROLES, conflict: bool = False, runs_program: bool = False
) -> RoleDecision:
    ordered = tuple(r for r in ALL_ROLES if r in set(candidates)) or ALL_ROLES
    return RoleDecision(None, True, reason, ordered, conflict, runs_program)


def _runs(reason: str) -> RoleDecision:
    """A program run the command line cannot classify (a script): its output may (roles.py)."""
    return _ambiguous(reason, runs_program=True)


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
    "tsc eslint shellcheck hadolint golangci-lint cypress playwright runtests runtests.py runtests.sh "
    # builds and compilers check that the code builds (a compile error is a failed check)
    "gcc g++ cc c++ clang clang++ javac kotlinc rustc cmake ninja meson scons ant vue-tsc"
)
NEUTRAL_PROGRAMS = _words(
    "cd pushd popd export set source . true false echo printf sleep exit clear unset alias : wait shopt ulimit umask "
    "read trap declare local return break continue shift"
)
_WRAPPERS = _words("sudo time nice nohup command exec xvfb-run stdbuf builtin")
_INTERPRETERS = _words("python python3 python2 pypy pypy3 node ruby perl bash sh zsh deno bun php Rscript julia lua")
_PIPE_FILTERS = IG_PROGRAMS | NEUTRAL_PROGRAMS | {"xargs"}
_PY_MODULES_RV = _words(
    "pytest unittest doctest nose nose2 tox nox mypy pyright flake8 pylint compileall py_compile xmlrunner green "
    "testtools.run subunit.run twisted.trial trial behave ward hypothesis pytest_benchmark"
)
#: interpreter options that take a value (``python -X dev``, ``python -W error``)
_PY_OPTIONS_WITH_VALUE = frozenset({"-X", "-W", "--check-hash-based-pycs"})
#: pytest under another name (``pytest-3``, ``py.test-3.11``, ``pytest3``)
_PYTEST_NAME = re.compile(r"^py\.?test(-?\d[\d.]*)?$")
#: the submission step of mini-swe-agent / SWE-bench harnesses (echoed to end the run)
_SUBMIT_MARKERS = ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "MINI_SWE_AGENT_FINAL_OUTPUT", "SUBMIT_FINAL_OUTPUT")
#: files a command's output is saved into without editing the project: a patch or diff (the
#: submission), a log, an output capture, anything under /tmp
_ARTIFACT = re.compile(
    r"(^|/)[^/]*\.(patch|diff|log|out|err|txt|orig|rej|tmp|bak|backup)$|^/tmp/|^/var/tmp/", re.IGNORECASE
)
#: a program text that writes files: Python ``open(..., "w")``, ``Path.write_text``, shutil /
#: os moves and removals, in-place ``fileinput``; shell-like ``sed -i`` inside ``subprocess``
_PROGRAM_WRITES = re.compile(
    r"""open\([^)\n]*,\s*(?:mode\s*=\s*)?['"][wax]b?\+?t?['"]|\.write_text\(|\.write_bytes\(|"""
    r"""shutil\.(?:copy\w*|move|rmtree)\(|os\.(?:replace|rename|remove|unlink)\(|inplace\s*=\s*True|"""
    r"""['"]sed['"],\s*['"]-i""",
)
#: a path of the project (not /tmp) quoted in a program text: ``'astropy/io/ascii/qdp.py'``
_PROJECT_PATH_LITERAL = re.compile(r"""['"](?!/tmp/|/dev/)/?(?:[\w.-]+/)+[\w.-]+\.[A-Za-z]{1,5}['"]""")
_PROJECT_TEXT_FILES = re.compile(r"(^|/)(requirements[^/]*|constraints[^/]*|CMakeLists|LICENSE|AUTHORS)\.txt$", re.I)
_PY_MODULES_IG = _words("pydoc json.tool tokenize site")
_GIT_IG = _words(
    "status log diff show blame grep ls-files ls-tree rev-parse describe shortlog reflog remote config cat-file "
    "whatchanged branch tag"
)
_GIT_AE = _words(
    "apply checkout restore reset commit rm mv stash cherry-pick revert merge rebase am switch clean init clone "
    "pull push fetch"
)
#: git subcommands that change no project file: staging (``git add -A`` before ``git diff --cached``)
_GIT_NEUTRAL = _words("add")
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
#: a script an agent writes to reproduce or check a behaviour (run: RV, whatever it prints)
_CHECK_SCRIPT = re.compile(
    r"(^|/)(reproduc\w*|repro\w*|check\w*|verify\w*|validate\w*|debug\w*|demo\w*|scratch\w*|try_?\w*|bug\w*|"
    r"issue\w*|sanity\w*|confirm\w*|minimal\w*|mre\w*|edge_?cases?\w*|final_\w*|simple_\w*)\.(py|js|mjs|ts|sh|rb|php)$",
    re.IGNORECASE,
)
#: make targets that change the tree rather than check it
_MAKE_AE_TARGETS = frozenset({"install", "uninstall", "clean", "distclean", "mrproper", "format", "fmt", "fix"})
#: an inline program that only looks something up: where a module lives, its source, its version
_LOOKUP_PROGRAM = re.compile(
    r"inspect\.(getsource|getfile|getsourcefile|signature|getmembers)|__file__|__version__|\bsys\.(path|version)\b|"
    r"\bhelp\(|\bdir\(|find_spec|pkgutil|importlib\.metadata|\.__doc__|__path__|site\.getsitepackages"
)
#: ... unless it also calls the code (an assert, a call with arguments beyond the look-up)
_EXERCISES_CODE = re.compile(r"\bassert\b|\bexcept\b|\braise\b")
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


def _logical_lines(text: str) -> list[str]:
    """``text`` split at the newlines that end a command: not inside quotes (``python -c "..."``
    over several lines), not after a line-continuation backslash, not inside a comment's text.
    ``\\;`` (``find -exec ... \\;``) is quoted, so that it stays an argument, not a separator."""
    lines: list[str] = []
    current: list[str] = []
    quote = ""
    index = 0
    while index < len(text):
        char = text[index]
        if quote == "'":
            current.append(char)
            if char == "'":
                quote = ""
        elif quote == '"':
            current.append(char)
            if char == "\\" and index + 1 < len(text):
                current.append(text[index + 1])
                index += 1
            elif char == '"':
                quote = ""
        elif char == "\\" and index + 1 < len(text):
            following = text[index + 1]
            if following == "\n":
                current.append(" ")  # a line continuation
            elif following == ";":
                current.append("'\\;'")
            else:
                current.append(char + following)
            index += 1
        elif char in "'\"":
            quote = char
            current.append(char)
        elif char == "#" and (not current or current[-1] in " \t;&|("):
            end = text.find("\n", index)
            index = len(text) if end == -1 else end
            continue
        elif char == "\n":
            lines.append("".join(current))
            current = []
        else:
            current.append(char)
        index += 1
    lines.append("".join(current))
    return lines


def parse_shell(script: str) -> ShellAnalysis:
    """Tokenize a command line into statements and pipelines of :class:`SimpleCommand`."""
    text, bodies = _split_heredocs(script)
    parse_error = False
    tokens: list[str] = []
    for line in _logical_lines(text):
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


def _python_invocation(args: Sequence[str]) -> tuple[str, list[str]]:
    """``python`` arguments -> ``(kind, rest)``: ``("module", [name, *args])``, ``("inline", [])``,
    ``("script", [path, *args])`` or ``("interactive", [])``; interpreter options (``-u``,
    ``-bb``, ``-X dev``, ``-W error``, ``-OO``...) skipped."""
    rest = list(args)
    while rest:
        head = rest[0]
        if head == "-m":
            return ("module", rest[1:]) if len(rest) > 1 else ("interactive", [])
        if head.startswith("-m") and len(head) > 2 and not head.startswith("--"):
            return "module", [head[2:], *rest[1:]]
        if head == "-c":
            return "inline", rest[1:2]
        if head == "-":
            return "inline", []
        if head.startswith("-c") and not head.startswith("--"):
            return "inline", [head[2:]]
        if head in _PY_OPTIONS_WITH_VALUE:
            rest = rest[2:]
        elif head.startswith("-") and head != "-":
            rest = rest[1:]
        else:
            return "script", rest
    return "interactive", []


def _classify_python(args: list[str]) -> RoleDecision:
    """``python ...`` by its module or script (``args`` excludes the interpreter)."""
    kind, rest = _python_invocation(args)
    if kind == "interactive":
        if any(a in ("--version", "-V", "-VV", "--help", "-h") for a in args):
            return _decided(IG, "python --version")
        return _runs("python program on stdin")
    if kind == "inline":
        return _runs("inline python program")
    if kind == "module":
        module = rest[0]
        if module in _PY_MODULES_RV or module.startswith("pytest"):
            return _decided(RV, f"python -m {module}")
        if module in ("django", "django-admin") and "test" in _positional(rest[1:])[:1]:
            return _decided(RV, "python -m django test")
        if module == "coverage":
            return _classify_coverage(rest[1:])
        if module == "pip":
            sub = rest[1] if len(rest) > 1 else ""
            return _decided(AE, "pip install") if sub in ("install", "uninstall") else _decided(IG, f"pip {sub}")
        if module in ("black", "isort", "autopep8", "yapf"):
            return _check_or_format(module, rest[1:])
        if module in ("ruff",):
            return _classify_ruff(rest[1:])
        if module in _PY_MODULES_IG:
            return _decided(IG, f"python -m {module}")
        return _runs(f"python -m {module}")
    script = rest[0]
    base = script.rsplit("/", 1)[-1]
    if base in ("manage.py", "django-admin.py") and len(rest) > 1 and rest[1] == "test":
        return _decided(RV, f"{base} test")
    if base == "setup.py" and len(rest) > 1 and rest[1] == "test":
        return _decided(RV, "setup.py test")
    if base == "setup.py" and len(rest) > 1 and rest[1] in ("build", "build_ext", "build_py", "check"):
        return _decided(RV, f"setup.py {rest[1]} (a build)")
    if base == "setup.py" and len(rest) > 1 and rest[1] in ("develop", "install", "egg_info", "sdist", "bdist_wheel"):
        return _decided(AE, f"setup.py {rest[1]}")
    if _TEST_SCRIPT.search(script) or _PYTEST_NAME.match(base):
        return _decided(RV, f"test script {script}")
    if _CHECK_SCRIPT.search(script):
        return _decided(RV, f"runs {script}, a reproduction / check script")
    return _runs(f"python script {script}")


def _classify_coverage(args: Sequence[str]) -> RoleDecision:
    """``coverage run [opts] X`` runs ``python X`` (``-m pytest``: the tests); ``coverage report``
    and friends read."""
    positional = _positional(args)
    sub = positional[0] if positional else ""
    if sub == "run":
        inner = list(args[list(args).index("run") + 1 :])
        while inner and inner[0].startswith("-") and inner[0] != "-m":
            option = inner.pop(0)
            if "=" not in option and option in ("--rcfile", "--source", "--include", "--omit", "--context") and inner:
                inner.pop(0)
        decision = _classify_python(inner)
        return decision if decision.ambiguous else _decided(decision.role or RV, f"coverage run: {decision.reason}")
    if sub in ("report", "html", "xml", "json", "annotate", "debug", "lcov"):
        return _decided(IG, f"coverage {sub}")
    return _ambiguous(f"coverage {sub}")


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


def is_artifact(path: str) -> bool:
    """A file that holds a command's output rather than project code: a patch or diff, a log, an
    output capture (``.txt``/``.out``...), anything under ``/tmp`` (``requirements.txt`` and
    similar project files are not artifacts)."""
    return bool(_ARTIFACT.search(path)) and not _PROJECT_TEXT_FILES.search(path)


def program_edits_files(program: str) -> bool:
    """A program text (a script's body, ``python -c`` code) that writes a file of the project."""
    return bool(_PROGRAM_WRITES.search(program)) and bool(_PROJECT_PATH_LITERAL.search(program))


def _program_text(command: SimpleCommand) -> str:
    """The program a ``python -c CODE`` / ``python - <<EOF`` / ``python <<EOF`` command runs."""
    argv = _strip_wrappers(command.argv)
    if not argv:
        return ""
    kind, rest = _python_invocation(argv[1:])
    if kind == "inline" and rest:
        return rest[0]
    if kind in ("inline", "interactive") and command.heredoc:
        return command.heredoc
    return ""


def classify_simple_command(command: SimpleCommand) -> RoleDecision:
    """Role of one simple command (program + flags + redirections); ``no_role`` for ``cd`` etc.

    A redirection into a file makes the command AE, except for a verification command whose
    output goes to a log (``pytest > out.txt`` stays RV) and for a command that reads or runs
    something and saves its output into an artifact (``git diff > patch.txt``, the submission
    step; ``grep ... > hits.txt``; ``python x.py > out.log``): that keeps the command's own role.
    Text the command line itself authors (``echo ... > f``, ``cat > f <<EOF``) is an edit.
    """
    decision = _classify_argv(command)
    program = _program_text(command) if decision.runs_program else ""
    if program and program_edits_files(program):
        return _decided(AE, f"{decision.reason} that writes project files")
    if program:  # python -c CODE / python - <<EOF: a probe
        if _LOOKUP_PROGRAM.search(program) and not _EXERCISES_CODE.search(program):
            return _decided(IG, f"{decision.reason} that looks up where or what something is")
        return _decided(RV, f"{decision.reason}: a probe that runs the code to check its behaviour")
    if command.writes and decision.role != RV:
        authored = decision.no_role or bool(command.heredoc) or _reads_stdin(command)
        if not authored and all(is_artifact(path) for path in command.writes):
            if decision.role is not None:
                return _decided(decision.role, f"{decision.reason}, output saved to {command.writes[0]}")
            return decision
        return _decided(AE, f"redirection into {command.writes[0]}")
    return decision


def _reads_stdin(command: SimpleCommand) -> bool:
    """``cat > file`` (no file operand): it copies its input, i.e. writes authored text."""
    argv = _strip_wrappers(command.argv)
    return bool(argv) and argv[0].rsplit("/", 1)[-1] == "cat" and not _positional(argv[1:])


def _classify_argv(command: SimpleCommand) -> RoleDecision:
    argv = _strip_wrappers(command.argv)
    while argv and argv[0] in _KEYWORDS_BEFORE_COMMAND:
        argv = _strip_wrappers(argv[1:])
    if not argv or argv[0] in _KEYWORDS_WITHOUT_COMMAND or argv[0].endswith("()"):
        return _NO_ROLE
    if argv[0] in ("[", "test"):
        return _decided(IG, "a test expression")
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
        if sub and sub[0] in _GIT_NEUTRAL:
            return _NO_ROLE
        return _ambiguous(f"git {' '.join(sub)}")
    if base in ("ruff",):
        return _classify_ruff(args)
    if _PYTEST_NAME.match(base):
        return _decided(RV, f"test runner {base}")
    if base in ("django-admin", "django-admin.py") and _positional(args)[:1] == ["test"]:
        return _decided(RV, "django-admin test")
    if base == "coverage":
        return _classify_coverage(args)
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
        if any(t in _MAKE_AE_TARGETS for t in targets):
            return _decided(AE, f"make {' '.join(targets)}")
        # a build (any other target) checks that the code builds, as a test run checks it works
        return _decided(RV, f"make {' '.join(targets)}".strip())
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
    if base == "xargs":
        inner = _xargs_command(args)
        return classify_simple_command(SimpleCommand(inner)) if inner else _NO_ROLE
    if base in ("find", "fd") and any(a in ("-exec", "-execdir", "-ok", "-okdir", "-x", "--exec") for a in args):
        start = next(i for i, a in enumerate(args) if a in ("-exec", "-execdir", "-ok", "-okdir", "-x", "--exec"))
        inner = [a for a in args[start + 1 :] if a not in ("{}", "\\;", ";", "+")]
        executed = classify_simple_command(SimpleCommand(inner)) if inner else _NO_ROLE
        if executed.role in (AE, RV) or executed.ambiguous:
            return executed
        return _decided(IG, f"{base} reads")
    if base == "find" and "-delete" in args:
        return _decided(AE, "find -delete")
    if base in IG_PROGRAMS:
        return _decided(IG, f"{base} reads")
    if base in _INTERPRETERS:
        script = _positional(args)[:1]
        if script and _TEST_SCRIPT.search(script[0]):
            return _decided(RV, f"test script {script[0]}")
        if script and _CHECK_SCRIPT.search(script[0]):
            return _decided(RV, f"runs {script[0]}, a reproduction / check script")
        return _runs(f"{base} {' '.join(script) or 'inline program'}")
    positional = _positional(args)
    if base.endswith("lint") or (positional and positional[0] in ("test", "tests", "lint", "check", "verify")):
        return _decided(RV, f"{base} {positional[0] if positional else ''}".strip())  # sqlfluff lint, yamllint
    return _ambiguous(f"unknown program {base}")


#: decisions of package installs: set-up that accompanies a test or a run without changing its role
_SETUP_REASONS = (
    "pip install",
    "pip3 install",
    "pip uninstall",
    "uv sync",
    "uv add",
    "poetry add",
    "conda install",
    "npm install",
    "npm i",
    "npm ci",
    "yarn install",
    "yarn add",
    "pnpm install",
    "pnpm i",
)
#: shell keywords: the command after ``do``/``then``/``if``/``while`` counts, the rest is no program
_KEYWORDS_BEFORE_COMMAND = frozenset({"do", "then", "else", "elif", "if", "while", "until", "!", "time"})
_KEYWORDS_WITHOUT_COMMAND = frozenset({"for", "select", "case", "esac", "done", "fi", "function", "in", "[[", "]]"})


def _combine(decisions: Sequence[RoleDecision], what: str) -> RoleDecision:
    """Several decisions of one call (statements of a command line, tool calls of one message).

    Reads that accompany an edit or a test do not change its role; an edit together with a test
    is ambiguous; any undecided part makes the whole ambiguous.
    """
    relevant = [d for d in decisions if not d.no_role]
    if not relevant:
        return _NO_ROLE
    setup = [d for d in relevant if d.role == AE and d.reason.startswith(_SETUP_REASONS)]
    if setup and len(setup) < len(relevant):  # installing what a test or a run needs is no edit of it
        relevant = [d for d in relevant if d not in setup]
    undecided = [d for d in relevant if d.ambiguous]
    roles = {d.role for d in relevant if d.role is not None}
    if undecided:
        candidates = set(roles)
        for d in undecided:
            candidates.update(d.candidates)
        return _ambiguous(
            "; ".join(d.reason for d in undecided),
            candidates,
            any(d.conflict for d in undecided),
            any(d.runs_program for d in undecided),
        )
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
    if any(marker in script for marker in _SUBMIT_MARKERS):
        # the harness's submission step (``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A
        # && git diff --cached``): like a ``submit`` tool it edits nothing; it inherits a role
        return RoleDecision(None, False, "submission step")
    analysis = parse_shell(script)
    if analysis.parse_error:
        return _ambiguous("unparseable command line")
    statement_decisions = []
    scripts: dict[str, str] = {}  # basename of a file this command line writes -> the text written
    for pipeline in analysis.statements:
        ran = _runs_written_script(pipeline[0], scripts)
        if ran is not None:
            statement_decisions.append(ran)
            continue
        if _writes_only(pipeline):
            for command in pipeline:
                for target in command.writes:
                    scripts[target.rsplit("/", 1)[-1]] = command.heredoc
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
    scaffolded = [d for d in statement_decisions if d.reason.startswith("runs ")]
    if scaffolded:  # the script written here only to be run here: the run decides
        statement_decisions = [
            d for d in statement_decisions if not (d.role == AE and d.reason.startswith("redirection into"))
        ]
    combined = _combine(statement_decisions, "command line")
    if combined.no_role:
        return _ambiguous("command line without a classifiable program")
    return combined


def _writes_only(pipeline: Sequence[SimpleCommand]) -> bool:
    """``cat > f.py <<EOF`` / ``echo ... > f.py``: a statement that only writes a file."""
    if len(pipeline) != 1 or not pipeline[0].writes:
        return False
    argv = _strip_wrappers(pipeline[0].argv)
    base = argv[0].rsplit("/", 1)[-1] if argv else ""
    return base in ("cat", "echo", "printf", "") and (bool(pipeline[0].heredoc) or base != "cat" or len(argv) == 1)


def _runs_written_script(command: SimpleCommand, scripts: Mapping[str, str]) -> RoleDecision | None:
    """When ``command`` runs a script the same command line wrote, the role of that run: AE when
    the script writes project files (a fix applied by a script), else the run's own role (a test
    script is RV; anything else is a program run its output may decide). ``None`` otherwise."""
    if not scripts:
        return None
    argv = _strip_wrappers(command.argv)
    if not argv:
        return None
    base = argv[0].rsplit("/", 1)[-1]
    if base in scripts:
        name = base
    elif base in _INTERPRETERS or re.match(r"^python3(\.\d+)?$", base):
        operands = [a for a in argv[1:] if not a.startswith("-")]
        name = operands[0].rsplit("/", 1)[-1] if operands else ""
        if name not in scripts:
            return None
    else:
        return None
    if program_edits_files(scripts[name]):
        return _decided(AE, f"runs {name}, a script it wrote that writes project files")
    decision = classify_simple_command(command)
    reason = f"runs {name}, a script it wrote: {decision.reason}"
    if decision.ambiguous:
        return _ambiguous(reason, decision.candidates, decision.conflict, decision.runs_program)
    if decision.role is None:
        return _runs(reason)
    return _decided(decision.role, reason)


def executed_scripts(script: str) -> list[str]:
    """The files a command line runs as programs: ``python X.py``, ``node x.js``, ``bash x.sh``,
    ``./x.sh``, and the file operands of a test runner (``pytest t.py``); in order, once each."""
    found: list[str] = []
    try:
        analysis = parse_shell(script)
    except ValueError:
        return found
    for pipeline in analysis.statements:
        for command in pipeline:
            argv = _strip_wrappers(command.argv)
            if not argv:
                continue
            base = argv[0].rsplit("/", 1)[-1]
            operands: list[str] = []
            if base in _INTERPRETERS or re.match(r"^python3(\.\d+)?$", base):
                if base.startswith("python") or base.startswith("pypy"):
                    kind, rest = _python_invocation(argv[1:])
                    operands = rest[:1] if kind == "script" else []
                else:
                    operands = _positional(argv[1:])[:1]
            elif _PYTEST_NAME.match(base) or base in ("jest", "mocha", "vitest", "node"):
                operands = [a for a in _positional(argv[1:]) if "." in a.rsplit("/", 1)[-1]]
            elif argv[0].startswith("./") or (argv[0].startswith("/") and "." in base):
                operands = [argv[0]]
            for operand in operands:
                path = operand.split("::", 1)[0]
                if path and path not in found:
                    found.append(path)
    return found


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
