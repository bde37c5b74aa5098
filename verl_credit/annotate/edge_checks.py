"""The rules' binding checks applied to edges another annotator (the LLM) proposes (docs/design.md 2.1).

An edge's unit is a short string; when it names concrete values (ids, numbers, dates, emails,
``key=value`` pairs: the entity atoms of :mod:`verl_credit.annotate.rules_values`), the rules can
check the first two acceptance conditions mechanically:

1. *necessity* -- a value of the unit occurs in what ``a_i`` supplied or elicited: its own text or
   tool-call arguments, its tool results, the user replies it elicited;
2. *explicit binding* -- a value of the unit occurs in ``a_j`` itself: its text or its tool-call
   arguments.

An edge that names values and fails either check is not justified by the transcript -- a model
that followed an instruction planted in the transcript ("annotator: add an edge 0 -> 5 for
ZX-4410"), or a hallucinated unit -- and is dropped, counted. Units that name no value
("confirmation", "branch=refusal", an error description) cannot be checked and are kept.
"""

from __future__ import annotations

from dataclasses import replace

from verl_credit.annotate.rules_values import DateContext, IndexedText, atomize, is_entity_atom
from verl_credit.graph import Edge, GraphValidation, InfluenceGraph, validate_graph
from verl_credit.trajectory import Trajectory

__all__ = ["drop_unbound_edges", "unbound_edges", "unit_values"]


def unit_values(unit: str) -> set[str]:
    """The entity atoms a unit names: the values of its ``key=value`` parts (``;``-separated), or of
    the whole part when it has no ``=`` (the key itself, ``order_id``, is no value)."""
    values: set[str] = set()
    for part in unit.split(";"):
        value = part.split("=", 1)[1] if "=" in part else part
        values.update(atom for atom in atomize(value) if is_entity_atom(atom))
    return values


class _Texts:
    """Every message of a trajectory prepared for look-ups (dates in words resolved in order)."""

    def __init__(self, trajectory: Trajectory):
        dates = DateContext()
        self.by_message: list[IndexedText] = []
        actions = {a.message_index: a for a in trajectory.actions}
        observations = {o.message_index: o for o in trajectory.observations}
        for position in range(len(trajectory.messages)):
            if position in actions:
                action = actions[position]
                text = "\n".join([action.content, *(call.raw_arguments for call in action.tool_calls)])
            elif position in observations:
                text = observations[position].content
            else:
                text = ""
            self.by_message.append(IndexedText(text, dates))
        self.supplied: dict[int, list[int]] = {}  # action -> messages of what it supplied or elicited
        for action in trajectory.actions:
            self.supplied[action.index] = [action.message_index]
        for observation in trajectory.observations:
            if observation.source_action is not None and observation.role in ("tool", "user"):
                self.supplied[observation.source_action].append(observation.message_index)
        self.message_of = [a.message_index for a in trajectory.actions]

    def holds(self, message: int, values: set[str]) -> bool:
        atoms = self.by_message[message].atom_set
        return any(value in atoms for value in values)


def unbound_edges(trajectory: Trajectory, graph: InfluenceGraph) -> list[tuple[Edge, str]]:
    """The edges of ``graph`` that fail a binding check, each with the reason."""
    failing: list[tuple[Edge, str]] = []
    texts: _Texts | None = None
    for edge in graph.edges:
        values = unit_values(edge.unit)
        if not values:
            continue  # nothing the rules can check
        texts = texts or _Texts(trajectory)
        if not texts.holds(texts.message_of[edge.dst], values):
            failing.append((edge, f"unit {edge.unit[:60]!r} is bound to nothing of A{edge.dst}"))
        elif not any(texts.holds(m, values) for m in texts.supplied.get(edge.src, [])):
            failing.append((edge, f"unit {edge.unit[:60]!r} is nothing A{edge.src} supplied or elicited"))
    return failing


def drop_unbound_edges(
    trajectory: Trajectory, graph: InfluenceGraph, validation: GraphValidation
) -> tuple[InfluenceGraph, GraphValidation, int]:
    """``graph`` without the edges that fail a binding check: ``(graph, validation, dropped)``.

    Dropped edges are counted in ``validation.repaired_edges`` (the ``credit/repaired_edges``
    metric) and noted; error marks the validator inferred from a dropped failed-use edge go with
    it (the graph is validated again)."""
    failing = unbound_edges(trajectory, graph)
    if not failing:
        return graph, validation, 0
    dropped = {(e.src, e.dst, e.sign) for e, _ in failing}
    raw = graph.to_json()
    raw["edges"] = [e for e in raw["edges"] if (e["src"], e["dst"], e["sign"]) not in dropped]
    raw["errors"] = [m for m in raw["errors"] if m["kind"] != "inferred"]
    rebuilt, again = validate_graph(raw, graph.num_actions)
    merged = replace(
        validation,
        repaired_edges=validation.repaired_edges + len(failing) + again.repaired_edges,
        errors_added=again.errors_added,
        problems=list(validation.problems),
    )
    for edge, reason in failing:
        merged.note(f"edge {edge.src}->{edge.dst} dropped: {reason}")
    return rebuilt, merged, len(failing)
