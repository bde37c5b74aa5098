"""Shared fixtures: a clean environment for HTTP tests and the local OpenAI-compatible stub server.

Layout: the test folders mirror the package (``tests/credit_math``, ``tests/estimators``,
``tests/annotate``, ``tests/envs``, ``tests/ingest``, ``tests/report``, ``tests/cli``,
``tests/verl``; ``tests/core`` for the top-level modules, ``tests/bench`` for ``verl_credit/bench``
and ``scripts/``, ``tests/e2e`` for the end-to-end runs). No folder is a package (no
``__init__.py``): pytest imports each test file by its basename, so **basenames are unique across
the whole tree** (pytest stops at collection with "import file mismatch" otherwise). This file's
folder, ``tests/``, is on ``sys.path`` (pytest puts a rootdir conftest's folder there), so the
helpers beside it import from any sub-folder as ``from openai_stub_server import ...``
(also ``strategies``, ``local_ray_cluster``); data lives in ``tests/data``
(``Path(__file__).parents[1] / "data"`` from a sub-folder).

Fast loop: ``python -m pytest -q -m "not slow"``. A module whose every test is slow says so with a
module-level ``pytestmark = pytest.mark.slow``; when the ``-m`` expression leaves out slow tests
whatever the other markers, such a module is not even imported (:func:`pytest_ignore_collect`),
which saves its imports (tau2, Ray, verl's trainer) at collection. ``python -m pytest -q`` (CI)
collects and runs everything.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from openai_stub_server import OpenAIStubServer

_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strip proxy settings so a developer's shell cannot reroute loopback requests."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def stub_server() -> Iterator[OpenAIStubServer]:
    """A fresh scripted server on 127.0.0.1 (see tests/openai_stub_server.py)."""
    with OpenAIStubServer() as server:
        yield server


_MARK_WORDS = {"and", "or", "not"}


def _matcher(marked: frozenset[str]):
    return lambda name, /, **kwargs: not kwargs and name in marked


@cache
def _deselects_every_slow_test(markexpr: str) -> bool:
    """Whether ``-m markexpr`` is false for a test marked slow, whatever its other markers.

    Uses pytest's own expression evaluator; on anything it cannot decide (a pytest without it, the
    ``name(arg=...)`` form, many names) it answers False, so the module is collected as usual.
    """
    try:
        from _pytest.mark.expression import Expression

        expression = Expression.compile(markexpr)
        others = sorted(set(re.findall(r"[A-Za-z_][\w.:-]*", markexpr)) - _MARK_WORDS - {"slow"})
        called = set(re.findall(r"([A-Za-z_][\w.:-]*)\s*\(", markexpr)) - _MARK_WORDS
        if called or len(others) > 6:
            return False
        for values in itertools.product((False, True), repeat=len(others)):
            marked = frozenset({"slow", *(name for name, on in zip(others, values, strict=True) if on)})
            if expression.evaluate(_matcher(marked)):
                return False
        return True
    except Exception:
        return False


def _module_is_all_slow(path: Path) -> bool:
    """Whether the module sets ``pytestmark`` to ``pytest.mark.slow`` (or a list holding it) at top level."""
    text = path.read_text(encoding="utf-8")
    if "pytestmark" not in text or "mark.slow" not in text:
        return False
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            marks = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            return any(ast.unparse(mark) == "pytest.mark.slow" for mark in marks)
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under a ``-m`` that leaves out slow tests, skip importing the modules whose every test is slow."""
    markexpr = config.option.markexpr
    if not markexpr or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if _deselects_every_slow_test(markexpr) and _module_is_all_slow(collection_path):
        return True
    return None
