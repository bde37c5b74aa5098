"""Paths, symbols and test outcomes of coding-agent calls (docs/design.md section 2.2).

What the causal call graph matches on:

* :func:`extract_paths`: path-like tokens of a text (known extensions, ``Makefile``, ``.env``...)
  plus the targets of patch / diff headers;
* :func:`paths_match`: path matching by components: ``src/app.py`` matches ``/repo/src/app.py`` and
  ``app.py`` (a bare name matches any file of that name); globs (``lib/*.pm``) match with ``fnmatch``;
* the files an edit writes (editor arguments, patch headers, shell redirections and file arguments
  of editing programs) and the distinctive symbols it replaces;
* :func:`rv_outcome`: ``"pass"`` / ``"fail"`` / ``None`` for a test, type-check, lint or build output;
* :func:`is_glob` (a pattern such as ``*.py`` is not a path a call *mentions*: ``find -name "*.py"``
  names no file) and :func:`returned_nothing` (an empty result, a "no output" / "no matches"
  notice, or only "No such file" errors: such a read supplies nothing).
"""

from __future__ import annotations

import builtins
import fnmatch
import keyword
import re
from collections.abc import Iterable, Mapping
from typing import Any

from verl_credit.annotate.shell import (
    _PROJECT_PATH_LITERAL,
    _python_invocation,
    _strip_wrappers,
    _words,
    parse_shell,
    program_edits_files,
)
from verl_credit.trajectory import ToolCall

__all__ = [
    "edit_failed",
    "extract_paths",
    "is_glob",
    "listing_directory",
    "paths_match",
    "qualify_listing",
    "returned_nothing",
    "rv_outcome",
]

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


def is_glob(path: str) -> bool:
    """A wildcard pattern (``*.py``, ``src/**/*.ts``, ``test_?.py``, ``[ab].c``), not one file."""
    return any(c in path for c in "*?[")


# harness wrappers around command output (mini-swe-agent, some gateways)
_OUTPUT_WRAPPER = re.compile(
    r"<(returncode|exit_code)>\s*-?\d+\s*</\1>|</?(?:returncode|output|stdout|stderr|exit_code|warning)>"
)
_NOTHING_LINES = re.compile(
    r"^(?:\(no output\)|\[no output\]|no output\.?|\(empty\)|"
    r"your command ran successfully and did not produce any output\.?|"
    r"no (?:matches|results|files|occurrences) found\b.*|found 0 (?:matches|files|results)\b.*|0 matches\.?|"
    r"(?:exit[ _]code|return[ _]?code|returncode)\s*[:=]?\s*-?\d+\.?|"
    r"command (?:completed|finished|exited)\b.*code \d+\.?|"
    r"(?:[\w.+-]+: )+(?:.*: )?"
    r"(?:no such file or directory|is a directory|permission denied|cannot access.*|cannot open.*)|"
    r"(?:error: )?(?:the )?(?:path|file|directory) .* (?:does not exist|not found)\b.*|"
    r"(?:file|directory) .* not found\.?)$",
    re.IGNORECASE,
)


def returned_nothing(result: str) -> bool:
    """True when a tool result carries no content: empty (after harness wrappers such as
    ``<returncode>1</returncode><output></output>``), a "no output" / "no matches found" notice,
    an exit-code line, or only errors saying the file or path does not exist."""
    text = _OUTPUT_WRAPPER.sub("\n", result or "")
    return all(_NOTHING_LINES.match(line.strip()) for line in text.splitlines() if line.strip())


def listing_directory(script: str) -> str | None:
    """The directory an ``ls DIR`` command line lists (one ``ls`` with one operand, maybe piped
    into filters), whose output names its files relative to ``DIR``; ``None`` otherwise."""
    statements = [p for p in parse_shell(script).statements if _strip_wrappers(p[0].argv)[:1] != ["cd"]]
    if len(statements) != 1:
        return None
    argv = _strip_wrappers(statements[0][0].argv)
    if not argv or argv[0].rsplit("/", 1)[-1] not in ("ls", "ll", "tree"):
        return None
    operands = [a for a in argv[1:] if not a.startswith("-")]
    if len(operands) != 1 or is_glob(operands[0]) or _PATH.fullmatch(operands[0].rstrip("/")):
        return None
    directory = _normalize_path(operands[0])
    return directory if directory not in ("", ".") else None


def qualify_listing(paths: Iterable[str], directory: str | None) -> set[str]:
    """Bare file names of an ``ls DIR`` output as ``DIR/name`` (other paths unchanged)."""
    if directory is None:
        return set(paths)
    return {p if "/" in p else f"{directory}/{p}" for p in paths}


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


#: names that never identify what an edit changes: builtins and keywords, test-framework names,
#: generic method names
_NOT_SYMBOLS = (
    frozenset(dir(builtins))
    | frozenset(keyword.kwlist)
    | frozenset(
        """self cls setUp tearDown setUpClass tearDownClass setUpModule tearDownModule TestCase pytest fixture
    parametrize mock patch main run test tests init call args kwargs value result data
    unittest conftest""".split()
    )
)


def _is_symbol(name: str, file_stems: set[str]) -> bool:
    """A defined name that can identify a change: not a builtin, keyword or test-framework name, not
    a dunder, not an exception class name, not a file's stem, at least 4 characters."""
    return (
        len(name) >= 4
        and name not in _NOT_SYMBOLS
        and not (name.startswith("__") and name.endswith("__"))
        and not name.endswith(("Error", "Exception", "Warning"))
        and name not in file_stems
    )


def _defined_symbols(text: str, file_stems: set[str]) -> set[str]:
    """Names ``text`` defines (``def x``, ``class X``, ``fn x``, ``func x``, ...) that are symbols."""
    return {name for name in _DEFINITION.findall(text or "") if _is_symbol(name, file_stems)}


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
    "sed perl ruby awk tee rm touch mv truncate black isort autopep8 prettier gofmt rustfmt chmod"
)
_GIT_FILE_COMMANDS = _words("checkout restore rm mv add")
#: programs that write only their last operand (the sources are read): a backup copy edits no source
_COPY_PROGRAMS = _words("cp install ln")


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
            if base in _COPY_PROGRAMS:  # cp SRC... DEST: only the destination is written
                operands = [a for a in argv[1:] if not a.startswith("-")]
                target = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-t", "--target-directory")), None)
                written = target or (operands[-1] if len(operands) > 1 else "")
                if written and _looks_like_file(written):
                    paths.add(_normalize_path(written))
            elif base in _FILE_ARG_PROGRAMS or (base == "git" and len(argv) > 1 and argv[1] in _GIT_FILE_COMMANDS):
                paths |= {_normalize_path(a) for a in argv[1:] if not a.startswith("-") and _looks_like_file(a)}
            if command.heredoc and base in ("apply_patch", "patch", "git"):
                paths |= _patch_targets(command.heredoc)
            program = command.heredoc or _inline_code(argv)
            if program and program_edits_files(program):  # a script or -c program that rewrites files
                paths |= {_normalize_path(m.group(0)[1:-1]) for m in _PROJECT_PATH_LITERAL.finditer(program)}
    paths |= _patch_targets(result)
    return {p for p in paths if p and p != "/dev/null"}


def _inline_code(argv: list[str]) -> str:
    """The code of ``python -c CODE`` (``""`` for anything else)."""
    base = argv[0].rsplit("/", 1)[-1] if argv else ""
    if not base.startswith("python"):
        return ""
    kind, rest = _python_invocation(argv[1:])
    return rest[0] if kind == "inline" and rest else ""


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


def _edited_symbols(call: ToolCall, edited_paths: Iterable[str] = ()) -> set[str]:
    """The symbols an edit defines or changes: the ``def``/``class``/... names in its old and new
    text (for a patch, in its changed and context lines), except names that identify nothing
    (:func:`_is_symbol`; a file's stem such as ``__init__`` of ``__init__.py`` included)."""
    texts = []
    for key in _EDIT_TEXT_KEYS:
        texts.extend(_string_values(call.arguments.get(key)))
    changed = []
    for text in texts:
        lines = text.split("\n")
        if any(line.startswith(("*** Begin Patch", "@@", "--- ")) for line in lines):
            changed.extend(
                line[1:] for line in lines if line[:1] in ("-", "+", " ") and not line.startswith(("---", "+++"))
            )
        else:
            changed.append(text)
    stems = {p.rsplit("/", 1)[-1].split(".", 1)[0] for p in edited_paths}
    return _defined_symbols("\n".join(changed), stems)


#: an edit that did not happen: the editor refused it, sed or patch failed, the heredoc broke, a
#: non-zero exit status
_EDIT_FAILED = re.compile(
    r"NOT been applied|[Nn]o replacement was performed|did not appear verbatim|[Nn]o changes (were )?made|"
    r"^sed: |sed: -e expression|^patch: \*\*\*\*|Hunk #\d+ FAILED|patch does not apply|error: patch failed|"
    r"corrupt patch|here-document at line \d+ delimited by end-of-file|unexpected EOF while looking for|"
    r"syntax error near unexpected token|[Cc]ommand not found|No such file or directory|Permission denied|"
    r"Traceback \(most recent call last\)|^(?:Error|ERROR)[:!]|<returncode>[1-9]\d*</returncode>|"
    r"\"?(?:exit_code|returncode)\"?: [1-9]|exit code [1-9]\d*\]|Invalid `\w+` parameter|"
    r"is not a valid (?:path|file|command)|"
    r"^usage: |file already exists",
    re.MULTILINE,
)


def edit_failed(result: str) -> bool:
    """True when an edit's result says it did not happen (see :data:`_EDIT_FAILED`)."""
    return bool(result) and bool(_EDIT_FAILED.search(result))
