"""The package's shape: import cycles, layers, pure math, and estimator names only in the registry.

Read from the source with ``ast`` (nothing is imported), so a new cycle or a new branch on an
estimator's name fails here before review.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "verl_credit"

#: lazy (function-level) import cycles that exist today, to be removed; a new one fails the test
KNOWN_LAZY_CYCLES: set[frozenset[str]] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path, names: set[str], lazy: bool) -> set[str]:
    """Project modules ``path`` imports: at module level, or also inside functions (``lazy``);
    imports under ``if TYPE_CHECKING:`` never run and are left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    found: set[str] = set()
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if not lazy and id(node) not in top:
            continue
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            module = node.module or ""
            candidates = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        found.update(name for name in candidates if name in names)
    return found


def _cycles(lazy: bool) -> list[frozenset[str]]:
    modules = _modules()
    graph = {name: _imports(path, set(modules), lazy) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[frozenset[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(frozenset(component))

    for node in graph:
        if node not in index:
            visit(node)
    return components


@pytest.mark.slow
def test_no_import_cycles_at_module_level() -> None:
    assert _cycles(lazy=False) == []


@pytest.mark.slow
def test_no_new_lazy_import_cycles() -> None:
    assert set(_cycles(lazy=True)) <= KNOWN_LAZY_CYCLES


def test_the_credit_math_imports_no_io_no_verl_and_no_annotator() -> None:
    modules = _modules()
    allowed = ("verl_credit.credit_math", "verl_credit.config", "verl_credit.call_graph", "verl_credit.graph")
    for name, path in modules.items():
        if not (name == "verl_credit.credit_math" or name.startswith("verl_credit.credit_math.")):
            continue
        source = path.read_text(encoding="utf-8")
        assert not re.search(r"^\s*(import|from) verl\b", source, re.M), name
        for imported in _imports(path, set(modules), lazy=True):
            assert imported.startswith(allowed), f"{name} imports {imported}"


def test_no_branch_on_an_estimator_name_outside_the_registry() -> None:
    """``if estimator == "iapo"`` belongs in one place: the estimator modules. Benchmarks that
    compare named arms and the offline check's GRPO reference (verl's own function) are exempt."""
    pattern = re.compile(r"""estimator\s*(==|!=)\s*["'](iapo|call_credit|gigpo|turn_reward|grpo)["']""")
    exempt = {"verl_credit.verl.cpu.check"}
    offenders = [
        f"{name}: {match.group(0)}"
        for name, path in _modules().items()
        if not name.startswith(("verl_credit.estimators", "verl_credit.bench")) and name not in exempt
        for match in pattern.finditer(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


#: what the annotators and the task worlds may not import: they produce graphs and transcripts,
#: and must not depend on how credit is computed or drawn
CREDIT_SIDE = ("verl_credit.credit_math", "verl_credit.estimators", "verl_credit.batch_credit", "verl_credit.report")


def test_no_consumer_tests_an_estimators_needs_or_flags_outside_the_registry() -> None:
    """What an estimator needs becomes its inputs in one place (``estimators.needs.gather_needs``),
    and CALL-CREDIT's extra parts go through its own hooks: no ``"call_graphs" in needs`` and no
    flag true for one estimator only (a name branch in disguise) outside ``verl_credit.estimators``."""
    need = r"(influence_graphs|call_graphs|rv_statuses|anchor_states|turn_rewards|information_gains)"
    pattern = re.compile(rf"""["']{need}["']\s+(not\s+)?in\b|\bin\s+\w*needs\b|call_credit_parts""")
    offenders = [
        f"{name}: {match.group(0)}"
        for name, path in _modules().items()
        if not name.startswith("verl_credit.estimators")
        for match in pattern.finditer(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_annotators_and_environments_import_nothing_of_the_credit_side() -> None:
    modules = _modules()
    offenders = [
        f"{name} imports {imported}"
        for name, path in sorted(modules.items())
        if name.startswith(("verl_credit.annotate", "verl_credit.envs"))
        for imported in sorted(_imports(path, set(modules), lazy=True))
        if imported.startswith(CREDIT_SIDE)
    ]
    assert offenders == []


def test_only_the_verl_package_imports_verl() -> None:
    pattern = re.compile(r"^\s*(import|from) verl(\.|\s|$)", re.M)
    offenders = [
        name
        for name, path in sorted(_modules().items())
        if not (name == "verl_credit.verl" or name.startswith("verl_credit.verl."))
        and pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
