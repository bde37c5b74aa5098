#!/usr/bin/env python
"""Rule annotator and coding-role classifier on real transcripts from sources they were not developed on.

Reads the public transcripts listed in ``scripts/generalization_sources.py`` from git mirrors (bring
each with the search tool's ``fetch``; ``--mirrors`` is where they are), converts them in memory and
measures, per source and split (development / held-out):

* service agents: trajectories, actions, uncertain share, edges, error flags; on the hand-checked
  trajectories of ``scripts/generalization_labels.json``: edge precision / recall (micro, over
  ``(src, dst, sign)``), also on the trajectories the rules mark certain; error-flag precision /
  recall by kind against the gold ``errors`` of those trajectories; user_rejection and tool_error
  flag precision over every judged flag of every trajectory; median annotation milliseconds per
  trajectory;
* coding agents: calls, share the rules decide, roles; role accuracy on the labelled calls;
  call-graph edge precision / recall on the labelled trajectories.

    taskset -c 0 python scripts/bench_generalization.py --mirrors /work/.mirror
    python scripts/bench_generalization.py --json out.json      # the figures as JSON too

Nothing third-party is written anywhere; the labels file holds only ids, edges and roles.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from generalization_sources import SOURCES, Source, load_source  # noqa: E402

from verl_credit.annotate.roles import analyze_calls, call_graph_from_facts  # noqa: E402
from verl_credit.annotate.rules import annotate_rules  # noqa: E402
from verl_credit.trajectory import Trajectory  # noqa: E402

LABELS = Path(__file__).resolve().parent / "generalization_labels.json"


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 3) if b else None


def service_figures(source: Source, trajectories: list[Trajectory], labels: dict[str, Any]) -> dict[str, Any]:
    gold = labels["service_edges"]
    judged = {"user_rejection": labels["user_rejection_flags"], "tool_error": labels.get("tool_error_flags", {})}
    out: dict[str, Any] = {"trajectories": len(trajectories), "actions": sum(t.num_actions for t in trajectories)}
    uncertain = 0
    signs: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    counts = {"all": [0, 0, 0], "certain": [0, 0, 0]}  # tp, fp, fn
    checked = certain_checked = 0
    flags: Counter[str] = Counter()
    correct_flags: Counter[str] = Counter()
    error_counts: dict[str, list[int]] = {}  # kind -> [tp, fp, fn] on the hand-checked trajectories
    times: list[float] = []
    for trajectory in trajectories:
        started = time.process_time()
        graph, _, flag = annotate_rules(trajectory)
        times.append((time.process_time() - started) * 1000)
        uncertain += flag
        signs.update(edge.sign for edge in graph.edges)
        kinds.update(mark.kind for mark in graph.errors)
        for mark in graph.errors:
            key = f"{trajectory.id}#{mark.action}"
            if key in judged.get(mark.kind, {}):
                flags[mark.kind] += 1
                correct_flags[mark.kind] += bool(judged[mark.kind][key])
        if trajectory.id not in gold:
            continue
        checked += 1
        predicted = {(e.src, e.dst, e.sign) for e in graph.edges}
        truth = {tuple(edge) for edge in gold[trajectory.id]["edges"]}
        flagged = {(mark.action, mark.kind) for mark in graph.errors}
        gold_errors = {(action, kind) for action, kind in gold[trajectory.id].get("errors", [])}
        for kind in {k for _, k in flagged | gold_errors}:
            mine = {e for e in flagged if e[1] == kind}
            theirs = {e for e in gold_errors if e[1] == kind}
            row = error_counts.setdefault(kind, [0, 0, 0])
            row[0] += len(mine & theirs)
            row[1] += len(mine - theirs)
            row[2] += len(theirs - mine)
        groups = ["all"] + (["certain"] if not flag else [])
        certain_checked += not flag
        for group in groups:
            counts[group][0] += len(predicted & truth)
            counts[group][1] += len(predicted - truth)
            counts[group][2] += len(truth - predicted)
    out.update(
        uncertain_share=_ratio(uncertain, len(trajectories)),
        edges=dict(signs),
        error_flags=dict(kinds),
        hand_checked=checked,
        hand_checked_certain=certain_checked,
        user_rejection_flags_judged=flags["user_rejection"],
        user_rejection_flags_right=correct_flags["user_rejection"],
        tool_error_flags_judged=flags["tool_error"],
        tool_error_flags_right=correct_flags["tool_error"],
        error_flags_hand_checked={
            kind: {
                "right": tp,
                "wrong": fp,
                "missed": fn,
                "precision": _ratio(tp, tp + fp),
                "recall": _ratio(tp, tp + fn),
            }
            for kind, (tp, fp, fn) in sorted(error_counts.items())
        },
        ms_median=round(statistics.median(times), 2) if times else None,
    )
    for group, (tp, fp, fn) in counts.items():
        out[f"edge_precision_{group}"] = _ratio(tp, tp + fp)
        out[f"edge_recall_{group}"] = _ratio(tp, tp + fn)
        out[f"edges_{group}"] = {"right": tp, "wrong": fp, "missed": fn}
    return out


def coding_figures(source: Source, trajectories: list[Trajectory], labels: dict[str, Any]) -> dict[str, Any]:
    role_labels = labels["roles"]
    graph_labels = labels["call_graph"]
    calls = decided = 0
    roles: Counter[str] = Counter()
    labelled = right = 0
    wrong: list[str] = []
    tp = fp = fn = 0
    for trajectory in trajectories:
        facts = analyze_calls(trajectory)
        calls += len(facts)
        decided += sum(not f.ambiguous for f in facts)
        roles.update(f.role for f in facts)
        for index, role in role_labels.get(trajectory.id, {}).items():
            if role == "not-a-call":
                continue
            labelled += 1
            if facts[int(index)].role == role:
                right += 1
            else:
                wrong.append(f"{trajectory.id}#{index}: {facts[int(index)].role} (label {role})")
        if trajectory.id in graph_labels:
            predicted = {(e.src, e.dst, e.kind) for e in call_graph_from_facts(facts).edges}
            truth = {tuple(edge) for edge in graph_labels[trajectory.id]}
            tp, fp, fn = tp + len(predicted & truth), fp + len(predicted - truth), fn + len(truth - predicted)
    return {
        "trajectories": len(trajectories),
        "calls": calls,
        "rules_decide": _ratio(decided, calls),
        "roles": dict(roles),
        "roles_labelled": labelled,
        "role_accuracy": _ratio(right, labelled),
        "role_errors": wrong,
        "call_graph_edges": {"right": tp, "wrong": fp, "missed": fn},
        "call_graph_precision": _ratio(tp, tp + fp),
        "call_graph_recall": _ratio(tp, tp + fn),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"), help="where the fetched mirrors are")
    parser.add_argument("--sources", nargs="*", default=None, help="only these source names")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    labels = json.loads(LABELS.read_text())
    figures: dict[str, Any] = {}
    for source in SOURCES:
        if args.sources and source.name not in args.sources:
            continue
        records = load_source(source, args.mirrors)
        trajectories = [Trajectory.from_record(record) for record in records]
        compute = service_figures if source.kind == "service" else coding_figures
        figures[source.name] = {"split": source.split, "kind": source.kind, **compute(source, trajectories, labels)}
        print(f"{source.name} ({source.kind}, {source.split}): {json.dumps(figures[source.name], sort_keys=True)}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
