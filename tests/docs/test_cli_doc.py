"""docs/cli.md against the ``verl-credit`` argparse parser (``scripts/docs_cli.py``).

The document must be what the generator renders now and must name every option string of every
subcommand in that subcommand's section; the last tests show that the check fails on a flag or a
subcommand the document does not name.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_cli", ROOT / "scripts" / "docs_cli.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_cli"] = module
    spec.loader.exec_module(module)
    return module


docs_cli = _load_script()


@pytest.fixture(scope="module")
def doc() -> str:
    return docs_cli.DOC_PATH.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return docs_cli.build_parser()


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    return next(sub for sub_name, sub, _ in docs_cli.subcommands(parser) if sub_name == name)


def test_the_document_is_what_the_generator_renders(doc: str) -> None:
    assert doc == docs_cli.render(), "docs/cli.md is stale: run python scripts/docs_cli.py"


def test_every_subcommand_has_a_section(doc: str, parser: argparse.ArgumentParser) -> None:
    sections = docs_cli.command_sections(doc)
    progs = [command.prog for command, _ in docs_cli.commands(parser)]
    assert {"verl-credit", "verl-credit route", "verl-credit bench learning"} <= set(progs)
    assert list(sections) == progs


def test_every_option_string_of_every_subcommand_is_documented(doc: str, parser: argparse.ArgumentParser) -> None:
    commands = [command for command, _ in docs_cli.commands(parser)]
    options = [option for command in commands for action in command._actions for option in action.option_strings]
    assert "--info-gate-temperature" in options and "--dump-dir" in options
    assert docs_cli.missing_options(doc, parser) == []


def test_an_undocumented_flag_is_reported(doc: str) -> None:
    parser = docs_cli.build_parser()
    _subparser(parser, "route").add_argument("--extra-flag", type=int, default=3, help="a flag the doc lacks")
    assert docs_cli.missing_options(doc, parser) == ["verl-credit route --extra-flag"]
    rendered = docs_cli.render_parser(parser)
    assert (
        "| `--extra-flag` | `EXTRA_FLAG` | `3` | a flag the doc lacks |"
        in docs_cli.command_sections(rendered)["verl-credit route"]
    )
    assert docs_cli.missing_options(rendered, parser) == []


def test_an_undocumented_subcommand_is_reported(doc: str) -> None:
    parser = docs_cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    subparsers.add_parser("newcmd", help="a command the doc lacks").add_argument("--knob")
    assert docs_cli.missing_options(doc, parser) == ["verl-credit newcmd"]
    assert docs_cli.missing_options(docs_cli.render_parser(parser), parser) == []


def test_the_terminal_width_does_not_change_the_rendering(
    parser: argparse.ArgumentParser, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    narrow = docs_cli.render_parser(parser)
    monkeypatch.setenv("COLUMNS", "200")
    assert docs_cli.render_parser(parser) == narrow


def test_check_exits_1_naming_a_stale_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cli.md"
    monkeypatch.setattr(docs_cli, "DOC_PATH", path)
    monkeypatch.setattr(docs_cli, "render", lambda: "fresh\n")
    path.write_text("stale\n", encoding="utf-8")
    assert docs_cli.main(["--check"]) == 1
    assert f"{path} is stale" in capsys.readouterr().err
    assert docs_cli.main([]) == 0
    assert path.read_text(encoding="utf-8") == "fresh\n"
    assert docs_cli.main(["--check"]) == 0
