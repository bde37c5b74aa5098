"""The front door stays true: README.md is short, every path it and docs/ name exists, no link leaves
the repository, no internal work-item number is cited, the two commands are the ones CI runs, and
the README's "Adding an estimator" example works through ``verl-credit route``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, ROOT / "BENCHMARKS.md", *DOCS]
#: top-level folders whose paths a document may name in backticks
TOP_LEVEL = ("verl_credit/", "recipes/", "scripts/", "tests/", "docs/", "docker/", "examples/", "benchmarks/", ".ci/")
#: a path with one of these is a pattern, not a file (``<model>``, ``{iapo,grpo}``, ``*.sh``, ``...``)
PATTERN_MARKS = ("<", ">", "{", "}", "*", "...", "$", "N/", "_N", "=")
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
#: "issue 24", "Issue 7", "issues 25 and 26": numbers of this project's own work items, which a user
#: cannot look up (a public tracker's "#7244" stays allowed)
WORK_ITEM = re.compile(r"\b[Ii]ssues? \d+")


def linked_paths(page: Path) -> list[tuple[str, Path]]:
    """``(as written, resolved)`` for every relative markdown link of ``page`` (anchors dropped)."""
    found = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        found.append((target, (page.parent / path).resolve()))
    return found


def named_paths(text: str) -> list[str]:
    """Repository paths written in backticks (first word of the span), patterns left out."""
    found = []
    for span in CODE_SPAN.findall(text):
        for word in span.split():
            word = word.rstrip(".,;:)")
            if word.startswith(TOP_LEVEL) and not any(mark in word for mark in PATTERN_MARKS):
                found.append(word.split(":", 1)[0])
    return found


def test_the_readme_is_under_300_lines() -> None:
    lines = README.read_text().count("\n")
    assert lines <= 300, f"README.md has {lines} lines; move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_linked_file_exists_inside_the_repository(page: Path) -> None:
    for target, path in linked_paths(page):
        assert path.is_relative_to(ROOT), f"{page.name}: link {target} leaves the repository"
        assert path.exists(), f"{page.name}: link {target} points to nothing"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_path_named_in_backticks_exists(page: Path) -> None:
    missing = [path for path in named_paths(page.read_text()) if not (ROOT / path).exists()]
    assert not missing, f"{page.name} names paths that do not exist: {sorted(set(missing))}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_no_page_cites_internal_work_items_or_files_outside_the_repository(page: Path) -> None:
    text = page.read_text()
    assert not WORK_ITEM.findall(text), f"{page.name} cites work-item numbers: {WORK_ITEM.findall(text)}"
    for outside in ("../shared", "VERL_NOTES", "CPU_TRAINING.md"):
        assert outside not in text, f"{page.name} refers to {outside}, which is not in the repository"


def test_the_path_finders_catch_what_they_are_for(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("see [x](../../outside.md), `verl_credit/nowhere.py` and `recipes/{a,b}/*.sh`; issue 12\n")
    assert [target for target, _ in linked_paths(page)] == ["../../outside.md"]
    assert named_paths(page.read_text()) == ["verl_credit/nowhere.py"]
    assert WORK_ITEM.findall(page.read_text()) == ["issue 12"]


def readme_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def test_the_two_readme_commands_are_the_ones_ci_runs() -> None:
    setup = next(block for block in readme_blocks("bash") if "verl-credit demo" in block).strip()
    tests = next(block for block in readme_blocks("bash") if block.strip().startswith("python -m pytest")).strip()
    ci = (ROOT / ".ci" / "run").read_text()
    # .ci/run may quieten pip (-q); the commands are otherwise the README's, word for word
    ci_commands = [
        line.strip().replace(" -q ", " ")
        for line in ci.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert tests in ci_commands, f"README's test command {tests!r} is not what .ci/run runs"
    for step in setup.split(" && "):
        if step.startswith("verl-credit demo"):
            continue  # the main job; CI runs the tests instead
        assert any(step in line or line in step for line in ci_commands), f".ci/run lacks README's {step!r}"


def test_the_readme_estimator_example_routes_a_rollouts_file(tmp_path: Path) -> None:
    """The code block under "Adding an estimator", saved as a module of its own and named in
    VERL_CREDIT_ESTIMATORS, is selectable by ``verl-credit route --estimator`` and gives later actions
    more of the advantage while conserving the token mass (sum_i L_i w_i = L)."""
    section = README.read_text().split("## Adding an estimator", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(code) == 1
    name = re.search(r'name = "(\w+)"', code[0])
    assert name is not None
    (tmp_path / "readme_estimator.py").write_text(code[0])
    out = tmp_path / "credit.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "VERL_CREDIT_ESTIMATORS": "readme_estimator",
    }
    command = [sys.executable, "-m", "verl_credit.cli.main", "route", "--input", "examples/rollouts.jsonl"]

    def route(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, "--out", str(out), "--estimator", name.group(1), *flags],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    ratios = []
    for flags in ([], ["--recency-decay", "0.5"]):  # its default, then its own flag
        done = route(*flags)
        assert done.returncode == 0, done.stderr
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert lines and all(line["estimator"] == name.group(1) for line in lines)
        for line in lines:
            weights = [action["weight"] for action in line["actions"]]
            lengths = [action["length"] for action in line["actions"]]
            assert weights == sorted(weights) and weights[0] < weights[-1], line["id"]
            assert sum(w * length for w, length in zip(weights, lengths, strict=True)) == pytest.approx(sum(lengths))
            ratios.append(weights[-2] / weights[-1])
    assert min(ratios) == pytest.approx(0.5) and max(ratios) == pytest.approx(0.8)  # the setting reached the math
    refused = route("--recency-decay", "2")
    assert refused.returncode == 2 and "credit.recency.decay must be" in refused.stderr
