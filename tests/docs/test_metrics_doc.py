"""docs/metrics.md and its registry (``verl_credit.metrics.METRIC_DOCS``) against the source.

The source is scanned with ``ast`` (``scripts/docs_metrics.py``): every ``credit/...`` and
``credit_viz/...`` literal or f-string must be documented, and every entry must still be used.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from verl_credit.annotate.base import AnnotationResult, AnnotationStats
from verl_credit.batch_credit import compute_batch_credit
from verl_credit.call_graph import ROLES, CallGraph
from verl_credit.config import CreditConfig
from verl_credit.credit_math.call_adjustments import AdaptiveRoleWeights
from verl_credit.graph import GraphValidation, InfluenceGraph, validate_graph
from verl_credit.metrics import METRIC_DOCS, METRIC_GROUPS, VERL_METRIC_DOCS, MetricDoc, compute_credit_metrics
from verl_credit.trajectory import Trajectory
from verl_credit.verl.info_gain_step import InformationGains
from verl_credit.verl.session_failures import FAILURE_KINDS, FailedSessions

ROOT = Path(__file__).resolve().parents[2]


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_metrics", ROOT / "scripts" / "docs_metrics.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_metrics"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


docs_metrics = _load_script()


@pytest.fixture(scope="module")
def source_uses() -> list:
    """Every metric name written in ``verl_credit/`` (one scan for the module)."""
    return docs_metrics.scan_package()


def test_the_scan_finds_the_names_of_every_part_of_the_trainer(source_uses: list) -> None:
    where = {use.pattern: use.path for use in source_uses}
    # a plain literal, a name built in an f-string, a .format template, a guard's own metric
    assert where["credit/fallback_rate"].startswith("verl_credit/")
    assert where["credit/failed_sessions_{}"] == "verl_credit/verl/session_failures.py"
    assert where["credit_viz/rollout_{}"] == "verl_credit/verl/viz_sinks.py"
    assert where["credit/fallback_rate_window"] == "verl_credit/verl/run_guards.py"
    # a prefix that code matches names against is not a name
    assert not any(use.name.endswith("_") for use in source_uses)


def test_every_metric_name_in_the_source_is_documented(source_uses: list) -> None:
    missing = docs_metrics.undocumented(source_uses)
    assert not missing, "metric names missing from METRIC_DOCS (verl_credit/metrics.py):\n" + "\n".join(
        f"  {use.where}: {use.name}" for use in missing
    )


def test_no_documented_metric_is_unused(source_uses: list) -> None:
    stale = docs_metrics.unused(source_uses)
    assert not stale, "METRIC_DOCS entries no source file logs: " + ", ".join(doc.name for doc in stale)


def test_the_registry_has_one_complete_entry_per_name() -> None:
    patterns = [docs_metrics.metric_pattern(doc.name) for doc in METRIC_DOCS]
    assert len(patterns) == len(set(patterns))
    assert all(doc.meaning.strip() and doc.healthy.strip() for doc in (*METRIC_DOCS, *VERL_METRIC_DOCS))
    assert [doc for group in METRIC_GROUPS for doc in group.metrics] == list(METRIC_DOCS)
    assert not {doc.name for doc in VERL_METRIC_DOCS} & {doc.name for doc in METRIC_DOCS}


def test_pattern_meanings_list_their_values() -> None:
    by_name = {doc.name: doc for doc in METRIC_DOCS}
    assert all(kind in by_name["credit/failed_sessions_{kind}"].meaning for kind in FAILURE_KINDS)
    for name in ("credit/omega_{role}", "credit/role_share_{role}", "credit/role_delta_{role}"):
        assert all(role in by_name[name].meaning for role in ROLES), name


def test_docs_file_is_current() -> None:
    assert (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8") == docs_metrics.render(), (
        "docs/metrics.md is stale: run python scripts/docs_metrics.py"
    )


def test_the_docs_name_every_metric_and_mark_verls() -> None:
    text = docs_metrics.render()
    assert all(f"| `{doc.name}` |" in text for doc in METRIC_DOCS)
    assert all(f"| `{doc.name}` (verl's) |" in text for doc in VERL_METRIC_DOCS)
    assert "(`\\|w - 1\\| > 0.1`)" in text  # a pipe in a table cell is escaped


def test_check_fails_on_a_stale_file_and_writing_fixes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "metrics.md"
    output.write_text("# Metrics\n\nold\n", encoding="utf-8")
    assert docs_metrics.main(["--check"], output=output) == 1
    assert str(output) in capsys.readouterr().err
    assert docs_metrics.main([], output=output) == 0
    assert docs_metrics.main(["--check"], output=output) == 0
    output.unlink()
    assert docs_metrics.main(["--check"], output=output) == 1  # a missing file is stale too


SYNTHETIC_SOURCE = '''
"""A module that logs ``credit/in_a_docstring`` (text, not a name)."""

def step_metrics(metrics, kinds, name):
    metrics["credit/fallback_rate"] = 0.0
    metrics["credit/not_documented_anywhere"] = 1.0
    metrics.update({f"credit/undocumented_{kind}": 1.0 for kind in kinds})
    if name.startswith("credit/failed_sessions_"):
        pass
    return MetricDoc("credit/only_in_a_registry", "meaning", "healthy")
'''


def test_the_scanner_reports_an_undocumented_name_by_line() -> None:
    uses = docs_metrics.find_metric_names(SYNTHETIC_SOURCE, "synthetic.py")
    assert [(use.name, use.line) for use in uses] == [
        ("credit/fallback_rate", 5),
        ("credit/not_documented_anywhere", 6),
        ("credit/undocumented_{kind}", 7),
    ]
    missing = docs_metrics.undocumented(uses)
    assert [use.where for use in missing] == ["synthetic.py:6", "synthetic.py:7"]
    docs = (MetricDoc("credit/fallback_rate", "m", "h"), MetricDoc("credit/no_longer_logged", "m", "h"))
    assert docs_metrics.unused(uses, docs) == [docs[1]]


def _tool_action(name: str, args: dict) -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "x", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}],
    }


def _undocumented_keys(metrics: dict[str, float]) -> list[str]:
    return sorted(key for key in metrics if docs_metrics.find_doc(key) is None)


def test_keys_of_a_real_compute_credit_metrics_call_are_documented() -> None:
    graph, _ = validate_graph(
        {
            "num_actions": 3,
            "edges": [{"src": 0, "dst": 2, "sign": "+", "type": "input"}],
            "errors": [{"action": 1, "kind": "tool_error"}],
        },
        3,
    )
    graphs = [graph, InfluenceGraph.uniform(2), InfluenceGraph.uniform(2)]
    rewards = torch.tensor([1.0, 0.0, 0.0])
    groups = ["g", "g", "h"]
    credit = compute_batch_credit(rewards, groups, [[1, 1, 2], [3, 3], [2, 2]], CreditConfig(), graphs=graphs)
    stats = AnnotationStats()
    stats.add(AnnotationResult(graph, GraphValidation(repaired_edges=1), "llm", cached=True, prompt_truncated=True))
    stats.add(AnnotationResult(InfluenceGraph.uniform(2), GraphValidation(fallback=True), "fallback:uniform"))
    trajectories = [Trajectory.from_messages([_tool_action("get_order", {"id": "#1"})] * 2)]
    roles = [("IG", "AE", "RV"), ("IG", "AE"), ("AE", "RV")]
    call_graphs = [CallGraph(calls, (False,) * len(calls)) for calls in roles]
    metrics = compute_credit_metrics(
        credit, stats, trajectories, graphs=graphs, call_graphs=call_graphs, rewards=rewards, groups=groups
    )
    assert {"credit/truncated_prompts", "credit/reward_hacking_rate", "credit/zero_adv_groups"} <= set(metrics)
    assert _undocumented_keys(metrics) == []

    gigpo = compute_batch_credit(
        torch.tensor([1.0, 0.0]),
        ["g", "g"],
        [[1, 1], [1, 1]],
        CreditConfig.from_mapping({"estimator": "gigpo"}),
        anchor_states=[["start", "a"], ["start", "b"]],
    )
    gigpo_metrics = compute_credit_metrics(gigpo)
    assert "credit/anchor_match_rate" in gigpo_metrics
    assert _undocumented_keys(gigpo_metrics) == []


def test_keys_of_the_trainer_side_metric_dicts_are_documented() -> None:
    failed = FailedSessions(sessions=4, failed=1, dropped_groups=1, dropped_sessions=2)
    failed.kinds["user"] += 1
    weights = AdaptiveRoleWeights({"IG": 0.6, "AE": 1.0, "RV": 0.4})
    masks = {role: torch.tensor([[float(role == "IG"), float(role == "AE"), float(role == "RV")]]) for role in ROLES}
    omega = weights.update(
        torch.tensor([[0.5, 1.0, 0.2]]), masks, torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([[0.0, 1.0, 0.0]])
    )
    assert "credit/role_delta_AE" in omega and "credit/omega_RV" in omega
    for metrics in (failed.metrics(), InformationGains(pairs=2).metrics(), omega):
        assert _undocumented_keys(metrics) == []
