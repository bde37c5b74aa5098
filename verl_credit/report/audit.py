"""Annotator audit: agreement of graph files of the same trajectories (docs/design.md sections 5 and 8).

Each annotator is compared with the *reference* (the first file). Definitions:

* ``parse_rate``: share of the reference's trajectories for which the file has a graph (a line
  whose ``graph`` is not ``null`` and validates without falling back). Every other metric is
  computed over the trajectories where *both* files have a graph.
* ``edge_f1`` / ``jaccard``: an edge's identity is ``(trajectory, src, dst, sign)``; with the
  pooled edge sets ``R`` (reference) and ``O`` (other) of all those trajectories,
  ``edge_f1 = 2 |R & O| / (|R| + |O|)`` (micro F1) and ``jaccard = |R & O| / |R | O|``; both are 1
  when both sets are empty.
* ``kappa``: Cohen's kappa over every candidate pair ``i < j`` of every trajectory, labelled
  ``none``, ``+`` or ``-`` (``+-`` if a graph has both signs on the pair);
  ``kappa = (p_o - p_e) / (1 - p_e)``; 1 when ``p_e = 1`` (both used one and the same label
  everywhere), undefined (``nan``) without pairs.
* ``spearman_m_pos`` / ``spearman_m_neg``: Spearman's rho (average ranks for ties) of the
  per-action ``m+`` / ``m-`` (docs/design.md section 3, eq. 3-5) pooled over all actions; ``nan``
  when either side is constant (rho is undefined).
* ``sign_agreement``: share of actions whose positive-branch routed weight ``w+`` (the weight an
  action gets when ``A > 0``, eq. 7) lies on the same side of 1 in both (above, below, or equal
  within ``1e-9``).

Weights need per-action token lengths ``L_i``. Graph files carry none: pass the rollouts file
(``action_token_lengths``, or the whitespace count) to use the real ones; without it every action
has length 1. ``m`` and ``w`` come from :func:`verl_credit.credit_math.iapo.compute_iapo_weights` with
the given :class:`~verl_credit.config.IAPOConfig` (defaults: ``beta_plus = 0.05``, ``c = 0.25``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_credit.batch_credit import pad_lengths
from verl_credit.config import IAPOConfig
from verl_credit.estimators.iapo import route_influence_graphs
from verl_credit.graph import InfluenceGraph, validate_graph
from verl_credit.io import InputError, iter_jsonl, load_trajectories

__all__ = [
    "AUDIT_KEYS",
    "AuditRow",
    "GraphSet",
    "audit_graph_sets",
    "audit_to_json",
    "candidate_pair_labels",
    "compare_graphs",
    "compute_cohen_kappa",
    "compute_edge_f1",
    "compute_jaccard",
    "compute_route_weights",
    "compute_sign_agreement",
    "compute_spearman",
    "format_audit_table",
    "load_graph_set",
    "load_rollout_lengths",
    "typed_edge_set",
]

AUDIT_KEYS: tuple[str, ...] = (
    "edge_f1",
    "jaccard",
    "kappa",
    "spearman_m_pos",
    "spearman_m_neg",
    "sign_agreement",
    "parse_rate",
)
SIDE_TOLERANCE = 1e-9


@dataclass
class GraphSet:
    """One graphs JSONL file: ``graphs[id]`` is the validated graph, or ``None`` (no graph)."""

    path: str
    annotator: str
    graphs: dict[str, InfluenceGraph | None]
    lines: dict[str, int] = field(default_factory=dict)

    @property
    def parsed_ids(self) -> list[str]:
        return [i for i, g in self.graphs.items() if g is not None]


def load_graph_set(path: str | Path, lengths: Mapping[str, Sequence[int]] | None = None) -> GraphSet:
    """Read a graphs JSONL file (``{"id", "annotator", "graph"}`` per line).

    A ``null`` graph, or one that fails validation beyond repair, counts as not parsed. With
    ``lengths`` (from the rollouts) a graph's ``num_actions`` must match the trajectory's.
    Raises :class:`InputError` naming the file and line for a missing id, a duplicate id, or a
    graph whose size does not match the rollouts (ids absent from ``lengths`` are not checked
    here; :func:`audit_graph_sets` requires the reference's).
    """
    graphs: dict[str, InfluenceGraph | None] = {}
    lines: dict[str, int] = {}
    names: Counter[str] = Counter()
    for number, record in iter_jsonl(path):
        if not isinstance(record, dict) or "id" not in record:
            raise InputError(path, number, 'field \'id\': missing (expected {"id", "annotator", "graph"})')
        trajectory_id = str(record["id"])
        if trajectory_id in graphs:
            raise InputError(
                path, number, f"field 'id': duplicate id {trajectory_id!r} (first on line {lines[trajectory_id]})"
            )
        if isinstance(record.get("annotator"), str):
            names[record["annotator"]] += 1
        raw = record.get("graph")
        graph: InfluenceGraph | None = None
        if raw is not None:
            declared = raw.get("num_actions") if isinstance(raw, dict) else None
            if lengths is not None and trajectory_id in lengths:  # missing ids: see audit_graph_sets
                expected = len(lengths[trajectory_id])
                if declared != expected:
                    raise InputError(
                        path,
                        number,
                        f"field 'graph.num_actions': {declared!r} but trajectory "
                        f"{trajectory_id!r} has {expected} actions in the rollouts",
                    )
            if isinstance(declared, int) and not isinstance(declared, bool) and declared >= 0:
                validated, report = validate_graph(raw, declared)
                graph = None if report.fallback else validated
        graphs[trajectory_id] = graph
        lines[trajectory_id] = number
    annotator = names.most_common(1)[0][0] if names else Path(path).stem
    return GraphSet(str(path), annotator, graphs, lines)


def load_rollout_lengths(path: str | Path) -> dict[str, list[int]]:
    """``id -> [L_i]`` from a rollouts JSONL file (``action_token_lengths`` or whitespace counts)."""
    return {t.id: t.action_lengths for _, t in load_trajectories(path)}


# -- edge agreement ---------------------------------------------------------------------------
def typed_edge_set(graphs: Mapping[str, InfluenceGraph], ids: Sequence[str]) -> set[tuple[str, int, int, str]]:
    """Pooled edge identities ``(trajectory id, src, dst, sign)`` of the given trajectories."""
    return {(i, e.src, e.dst, e.sign) for i in ids for e in graphs[i].edges}


def compute_edge_f1(reference: set[Any], other: set[Any]) -> float:
    """Micro F1 ``2 |R & O| / (|R| + |O|)``; 1 when both are empty."""
    total = len(reference) + len(other)
    return 1.0 if total == 0 else 2.0 * len(reference & other) / total


def compute_jaccard(reference: set[Any], other: set[Any]) -> float:
    """``|R & O| / |R | O|``; 1 when both are empty."""
    union = len(reference | other)
    return 1.0 if union == 0 else len(reference & other) / union


def candidate_pair_labels(graph: InfluenceGraph) -> list[str]:
    """Labels of the ``T (T - 1) / 2`` candidate pairs ``i < j`` in row-major order:
    ``none``, ``+``, ``-``, or ``+-`` when both signs connect the pair."""
    signs: dict[tuple[int, int], set[str]] = {}
    for edge in graph.edges:
        signs.setdefault((edge.src, edge.dst), set()).add(edge.sign)
    labels = []
    for i in range(graph.num_actions):
        for j in range(i + 1, graph.num_actions):
            found = signs.get((i, j))
            labels.append("none" if not found else "".join(sorted(found, key="+-".index)))
    return labels


def compute_cohen_kappa(labels_a: Sequence[str], labels_b: Sequence[str]) -> float:
    """Cohen's kappa of two labelings of the same items (see the module docstring for edge cases)."""
    if len(labels_a) != len(labels_b):
        raise ValueError(f"kappa needs labelings of equal length, got {len(labels_a)} and {len(labels_b)}")
    count = len(labels_a)
    if count == 0:
        return math.nan
    observed = sum(a == b for a, b in zip(labels_a, labels_b, strict=True)) / count
    freq_a, freq_b = Counter(labels_a), Counter(labels_b)
    expected = sum(freq_a[label] * freq_b[label] for label in freq_a) / count**2
    if expected >= 1.0:
        return 1.0
    return (observed - expected) / (1.0 - expected)


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks with ties sharing their average rank."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    sorted_values = values[order]
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    return ranks


def compute_spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho: Pearson correlation of average ranks; ``nan`` if either side is constant."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"spearman needs equal lengths, got {a.shape} and {b.shape}")
    if a.size < 2:
        return math.nan
    rank_a, rank_b = _average_ranks(a), _average_ranks(b)
    rank_a -= rank_a.mean()
    rank_b -= rank_b.mean()
    norm = math.sqrt(float((rank_a**2).sum()) * float((rank_b**2).sum()))
    if norm == 0.0:
        return math.nan
    return float((rank_a * rank_b).sum()) / norm


# -- weight agreement -------------------------------------------------------------------------
def compute_route_weights(
    graphs: Sequence[InfluenceGraph], lengths: Sequence[Sequence[int]], config: IAPOConfig
) -> dict[str, list[list[float]]]:
    """Per-trajectory ``m_plus``, ``m_minus`` and ``w_plus`` (eq. 3-7) for a list of graphs.

    Args:
        graphs: B validated graphs.
        lengths: B lists of ``L_i``, each as long as its graph's ``num_actions``.
        config: IAPO parameters (``clip_c``, ``beta_plus``, ``eps``).

    Returns:
        ``{"m_plus", "m_minus", "w_plus"}`` -> B ragged lists of per-action floats.
    """
    for graph, row in zip(graphs, lengths, strict=True):
        if graph.num_actions != len(row):
            raise ValueError(f"graph has {graph.num_actions} actions but {len(row)} lengths were given")
    if not graphs:
        return {"m_plus": [], "m_minus": [], "w_plus": []}
    padded, counts = pad_lengths(lengths)
    positive = torch.ones(len(graphs), dtype=torch.float64)  # route every trajectory through A > 0
    routed = route_influence_graphs(positive, graphs, padded, config)
    return {
        name: [routed[name][row, : int(counts[row])].tolist() for row in range(len(graphs))]
        for name in ("m_plus", "m_minus", "w_plus")
    }


def _side(weight: float) -> int:
    return 0 if abs(weight - 1.0) <= SIDE_TOLERANCE else (1 if weight > 1.0 else -1)


def compute_sign_agreement(weights_a: Sequence[float], weights_b: Sequence[float]) -> float:
    """Share of actions whose weights lie on the same side of 1 (above / below / equal)."""
    if len(weights_a) != len(weights_b):
        raise ValueError(f"sign agreement needs equal lengths, got {len(weights_a)} and {len(weights_b)}")
    if not weights_a:
        return math.nan
    return sum(_side(a) == _side(b) for a, b in zip(weights_a, weights_b, strict=True)) / len(weights_a)


# -- the audit --------------------------------------------------------------------------------
@dataclass
class AuditRow:
    """One annotator against the reference."""

    label: str
    path: str
    trajectories: int  # reference trajectories
    compared: int  # trajectories with a graph in both files
    metrics: dict[str, float]
    ignored_ids: int = 0  # ids of this file absent from the reference


def _labels(sets: Sequence[GraphSet]) -> list[str]:
    names = [s.annotator for s in sets]
    counts = Counter(names)
    return [s.annotator if counts[s.annotator] == 1 else f"{s.annotator} ({s.path})" for s in sets]


def audit_graph_sets(
    sets: Sequence[GraphSet],
    lengths: Mapping[str, Sequence[int]] | None = None,
    config: IAPOConfig | None = None,
) -> list[AuditRow]:
    """Compare every set with ``sets[0]`` (the reference); the first row is the reference itself.

    ``lengths`` maps trajectory ids to ``L_i`` (default: 1 per action); every reference id must be
    in it. Two graphs of the same trajectory must have the same number of actions (else
    :class:`InputError`).
    """
    if len(sets) < 2:
        raise ValueError(f"the audit needs at least two graph files (a reference and one other), got {len(sets)}")
    config = config or IAPOConfig()
    reference = sets[0]
    ids = list(reference.graphs)
    if lengths is not None:
        for trajectory_id in ids:
            if trajectory_id not in lengths:
                raise InputError(
                    reference.path,
                    reference.lines[trajectory_id],
                    f"field 'id': trajectory {trajectory_id!r} is not in the rollouts file",
                )
    labels = _labels(sets)
    rows = []
    for position, other in enumerate(sets):
        common = []
        for trajectory_id in ids:
            ref_graph, other_graph = reference.graphs[trajectory_id], other.graphs.get(trajectory_id)
            if ref_graph is None or other_graph is None:
                continue
            if ref_graph.num_actions != other_graph.num_actions:
                raise InputError(
                    other.path,
                    other.lines.get(trajectory_id),
                    f"field 'graph.num_actions': trajectory {trajectory_id!r} has "
                    f"{other_graph.num_actions} actions here but {ref_graph.num_actions} in the "
                    f"reference {reference.path}",
                )
            common.append(trajectory_id)
        parsed = sum(other.graphs.get(i) is not None for i in ids)
        metrics = compare_graphs(
            {i: reference.graphs[i] for i in common},  # type: ignore[misc]
            {i: other.graphs[i] for i in common},  # type: ignore[misc]
            common,
            lengths,
            config,
        )
        metrics["parse_rate"] = parsed / len(ids) if ids else math.nan
        ignored = sum(1 for i in other.graphs if i not in reference.graphs)
        rows.append(AuditRow(labels[position], other.path, len(ids), len(common), metrics, ignored))
    return rows


def compare_graphs(
    reference: Mapping[str, InfluenceGraph],
    other: Mapping[str, InfluenceGraph],
    ids: Sequence[str],
    lengths: Mapping[str, Sequence[int]] | None,
    config: IAPOConfig,
) -> dict[str, float]:
    """Every pairwise metric (all of :data:`AUDIT_KEYS` but ``parse_rate``) over ``ids``."""
    ref_edges, other_edges = typed_edge_set(reference, ids), typed_edge_set(other, ids)
    labels_ref = [label for i in ids for label in candidate_pair_labels(reference[i])]
    labels_other = [label for i in ids for label in candidate_pair_labels(other[i])]
    row_lengths = [list(lengths[i]) if lengths is not None else [1] * reference[i].num_actions for i in ids]
    weights_ref = compute_route_weights([reference[i] for i in ids], row_lengths, config)
    weights_other = compute_route_weights([other[i] for i in ids], row_lengths, config)

    def flat(weights: dict[str, list[list[float]]], name: str) -> list[float]:
        return [value for row in weights[name] for value in row]

    return {
        "edge_f1": compute_edge_f1(ref_edges, other_edges),
        "jaccard": compute_jaccard(ref_edges, other_edges),
        "kappa": compute_cohen_kappa(labels_ref, labels_other),
        "spearman_m_pos": compute_spearman(flat(weights_ref, "m_plus"), flat(weights_other, "m_plus")),
        "spearman_m_neg": compute_spearman(flat(weights_ref, "m_minus"), flat(weights_other, "m_minus")),
        "sign_agreement": compute_sign_agreement(flat(weights_ref, "w_plus"), flat(weights_other, "w_plus")),
    }


def _json_number(value: float) -> float | None:
    return None if value is None or math.isnan(value) else round(float(value), 6)


def audit_to_json(rows: Sequence[AuditRow]) -> dict[str, dict[str, float | None]]:
    """``{metric: {annotator label: value}}`` with exactly the keys of :data:`AUDIT_KEYS`.

    Pairwise metrics list the annotators other than the reference; ``parse_rate`` lists all,
    the reference first. Undefined values (``nan``) are ``null``.
    """
    out: dict[str, dict[str, float | None]] = {key: {} for key in AUDIT_KEYS}
    for position, row in enumerate(rows):
        for key in AUDIT_KEYS:
            if key != "parse_rate" and position == 0:
                continue
            out[key][row.label] = _json_number(row.metrics[key])
    return out


def format_audit_table(rows: Sequence[AuditRow]) -> str:
    """A plain-text table, one line per annotator, the reference first."""
    header = ["annotator", "parsed", "compared", *AUDIT_KEYS[:-1]]
    body = []
    for position, row in enumerate(rows):
        cells = [
            row.label + (" (ref)" if position == 0 else ""),
            f"{row.metrics['parse_rate']:.1%}" if not math.isnan(row.metrics["parse_rate"]) else "n/a",
            f"{row.compared}/{row.trajectories}",
        ]
        for key in AUDIT_KEYS[:-1]:
            value = row.metrics[key]
            cells.append("n/a" if math.isnan(value) else f"{value:.3f}")
        body.append(cells)
    widths = [max(len(r[c]) for r in [header, *body]) for c in range(len(header))]
    lines = [
        "  ".join(cell.ljust(widths[c]) if c == 0 else cell.rjust(widths[c]) for c, cell in enumerate(r))
        for r in [header, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [
        f"{row.label}: {row.ignored_ids} id(s) not in the reference were ignored" for row in rows if row.ignored_ids
    ]
    return "\n".join(lines + notes)
