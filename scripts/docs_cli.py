"""Generate ``docs/cli.md``: every ``verl-credit`` subcommand with its usage and flags, from argparse.

The text comes from the parser itself (``verl_credit.cli.main.build_parser``, the ``verl-credit``
entry point of ``pyproject.toml``): each subcommand's description, its usage as ``-h`` prints it
at a terminal :data:`COLUMNS` wide, and each argument with its value, default and help.

:func:`render` builds the parser in a fresh interpreter: the parser's text depends on the
process that builds it (the estimator registry lists estimators in the order their modules were
first imported, and ``VERL_CREDIT_ESTIMATORS`` can add some), so a test process that imported
other modules first would see another order.

Usage::

    python scripts/docs_cli.py          # write docs/cli.md
    python scripts/docs_cli.py --check  # exit 1 when docs/cli.md is stale
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC_PATH = ROOT / "docs" / "cli.md"
#: the terminal width the usage lines are wrapped at
COLUMNS = 100
#: environment variables that change what the parser lists; unset while rendering
UNSET_VARIABLES = ("VERL_CREDIT_ESTIMATORS",)


@contextmanager
def fixed_width(columns: int = COLUMNS) -> Iterator[None]:
    """argparse wraps at ``$COLUMNS - 2``: fix it while formatting."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        yield
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def build_parser() -> argparse.ArgumentParser:
    """The ``verl-credit`` parser (imported here so that ``--help`` of this script stays fast)."""
    from verl_credit.cli.main import build_parser as build_cli_parser

    with fixed_width():
        return build_cli_parser()


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    """``(name, parser, one-line help)`` of each direct subcommand of ``parser``, in order."""
    found: list[tuple[str, argparse.ArgumentParser, str]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            found += [(name, sub, helps.get(name, "")) for name, sub in action.choices.items()]
    return found


def commands(parser: argparse.ArgumentParser) -> list[tuple[argparse.ArgumentParser, str]]:
    """``parser`` and every subcommand parser below it (depth first), with each one's help line."""
    found = [(parser, "")]
    for _, sub, summary in subcommands(parser):
        below = commands(sub)
        found += [(below[0][0], summary), *below[1:]]
    return found


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The documented arguments of one parser: all but the subcommand choice itself."""
    return [action for action in parser._actions if not isinstance(action, argparse._SubParsersAction)]


def argument_name(action: argparse.Action) -> str:
    """How an argument is written: its option strings, or a positional's name."""
    if action.option_strings:
        return ", ".join(f"`{option}`" for option in action.option_strings)
    return f"`{action.metavar or action.dest}`"


def _value_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    formatter = parser._get_formatter()
    default_metavar = action.dest.upper() if action.option_strings else action.dest
    value = formatter._format_args(action, default_metavar)
    return "" if not action.option_strings and f"`{value}`" == argument_name(action) else f"`{value}`"


def _default_text(action: argparse.Action) -> str:
    if action.required:
        return "required"
    default = action.default
    if default is None or default is argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
        return ""
    if isinstance(default, list | tuple):
        return f"`{' '.join(str(item) for item in default)}`" if default else ""
    return f"`{default}`" if default != "" else '`""`'


def _help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = parser._get_formatter()._expand_help(action) if action.help else ""
    text = " ".join(text.split())
    for group in parser._mutually_exclusive_groups:
        if action in group._group_actions:
            others = [argument_name(other) for other in group._group_actions if other is not action]
            rule = "exactly one of these is required" if group.required else "at most one of these"
            text += f" (not with {', '.join(others)}: {rule})"
    return text.strip()


def cell(text: str) -> str:
    """``text`` safe inside a markdown table cell (``<`` outside code spans is no HTML tag)."""
    parts = text.replace("|", "\\|").split("`")
    for index in range(0, len(parts), 2):
        parts[index] = parts[index].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def anchor(title: str) -> str:
    """The GitHub anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def render_parser(parser: argparse.ArgumentParser) -> str:
    """The text of ``docs/cli.md`` for ``parser``, formatted in this process."""
    with fixed_width():
        return _render(parser)


def _render(parser: argparse.ArgumentParser) -> str:
    listed = commands(parser)
    flags = sum(len(action.option_strings) for sub, _ in listed for action in arguments(sub))
    out = [
        "# Command-line reference",
        "",
        "<!-- Generated by scripts/docs_cli.py from the argparse parser of verl_credit/cli/; do not edit by",
        "hand: run `python scripts/docs_cli.py` (tests/docs fail when it is stale). -->",
        "",
        f"`{parser.prog}` is installed with the package (`[project.scripts]` of `pyproject.toml`:",
        "`verl_credit.cli.main:main`); `python -m verl_credit.cli.main` is the same command. Each subcommand",
        "is one module of `verl_credit/cli/`. Usage lines are wrapped as `-h` prints them at a terminal",
        f"{COLUMNS} columns wide. {len(listed) - 1} commands, {flags} option strings.",
    ]
    for command, summary in listed:
        out += ["", f"## `{command.prog}`", ""]
        if summary:
            out += [f"*{cell(summary[:1].upper() + summary[1:])}.*", ""]
        if command.description:
            out += [" ".join(command.description.split()), ""]
        out += ["```text", command.format_usage().rstrip(), "```"]
        below = subcommands(command)
        if below:
            out += ["", "| Command | What it does |", "| --- | --- |"]
            for name, sub, help_line in below:
                out.append(f"| [`{name}`](#{anchor(sub.prog)}) | {cell(help_line)} |")
        rows = arguments(command)
        if rows:
            out += ["", "| Argument | Value | Default | Help |", "| --- | --- | --- | --- |"]
            for action in rows:
                parts = (
                    argument_name(action),
                    _value_text(command, action),
                    _default_text(action),
                    _help_text(command, action),
                )
                out.append("| " + " | ".join(cell(part) for part in parts) + " |")
    return "\n".join(out) + "\n"


def render() -> str:
    """The text of ``docs/cli.md``, rendered in a fresh interpreter (see the module docstring)."""
    env = {name: value for name, value in os.environ.items() if name not in UNSET_VARIABLES}
    env["COLUMNS"] = str(COLUMNS)
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--stdout"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"rendering the CLI reference failed:\n{done.stderr}")
    return done.stdout


def command_sections(doc: str) -> dict[str, str]:
    """The text of each ``## `prog``` section of a document, by prog."""
    found: dict[str, str] = {}
    matches = list(re.finditer(r"^## `([^`]+)`$", doc, flags=re.MULTILINE))
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        found[match.group(1)] = doc[match.end() : following.start() if following else len(doc)]
    return found


def missing_options(doc: str, parser: argparse.ArgumentParser) -> list[str]:
    """``"<prog> <option>"`` for every option string (and positional) of every command that its
    section of ``doc`` does not name; ``"<prog>"`` for a command with no section."""
    found = command_sections(doc)
    missing: list[str] = []
    for command, _ in commands(parser):
        section = found.get(command.prog)
        if section is None:
            missing.append(command.prog)
            continue
        for action in arguments(command):
            names = action.option_strings or [action.metavar or action.dest]
            missing += [f"{command.prog} {name}" for name in names if f"`{name}`" not in section]
    return missing


def main(argv: list[str] | None = None) -> int:
    where = DOC_PATH.relative_to(ROOT) if DOC_PATH.is_relative_to(ROOT) else DOC_PATH
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help=f"exit 1 when {where} is stale")
    mode.add_argument(
        "--stdout", action="store_true", help="print the reference as this interpreter formats it (render() runs it)"
    )
    args = parser.parse_args(argv)
    if args.stdout:
        sys.stdout.write(render_parser(build_parser()))
        return 0
    text = render()
    if args.check:
        current: str | None = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else None
        if current != text:
            print(f"{where} is stale: run python scripts/docs_cli.py", file=sys.stderr)
            return 1
        print(f"{where} is up to date")
        return 0
    DOC_PATH.parent.mkdir(parents=True, exist_ok=True)
    DOC_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
