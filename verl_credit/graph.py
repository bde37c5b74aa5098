"""The typed influence-dependency graph (docs/design.md section 2.1): schema, validation, repair, degrees.

``G = (V, E+, E-, e, u)`` over the actions of one trajectory. Every edge ``(src, dst)`` has
``src < dst``. ``+`` edges are support-use (types ``input`` and ``success_utilization``); ``-``
edges are failed-use (type ``failed_utilization``). ``e_i`` marks errors and ``u_i`` counts
direct user inputs.

One validator serves every producer (rule annotator, LLM annotator, a rollouts file's ``graph``
field) and every consumer (estimators, CLI, audit, benchmarks). It never raises on bad content:

* an offending edge (index out of range, ``src >= dst``, unknown type, sign/type mismatch,
  not an object, duplicate) is dropped and counted in ``repaired_edges``;
* an offending error mark or direct-input entry is dropped and counted likewise;
* a failed-use source without an error mark gets ``e_i = 1`` (the invariant ``d-_i > 0 =>
  e_i = 1``), counted in ``errors_added``;
* an index given as a decimal string (``"src": "1"``) is used and counted in ``repaired_edges``;
  so are a missing ``edges`` list and a duplicate error mark (dropped);
* anything that is not repairable without guessing (not a JSON object, unparseable text,
  ``num_actions`` missing or different from the trajectory's, ``edges`` not a list) makes the
  trajectory fall back to the uniform graph (``fallback = True``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

__all__ = [
    "EDGE_TYPES",
    "Edge",
    "ErrorMark",
    "GraphValidation",
    "InfluenceGraph",
    "graph_json_schema",
    "validate_graph",
]

# type -> sign it must carry
EDGE_TYPES: dict[str, str] = {"input": "+", "success_utilization": "+", "failed_utilization": "-"}
SIGNS = ("+", "-")
MAX_UNIT_CHARS = 200
#: largest accepted direct-user-input count of one action (larger ones are dropped and counted)
MAX_DIRECT_COUNT = 2**31 - 1
_DECIMAL = re.compile(r"\s*(-?[0-9]+)\s*")  # ASCII digits only (int() also takes "²"-like digits)
_CANONICAL_INDEX = re.compile(r"0|[1-9][0-9]*")


@dataclass(frozen=True)
class Edge:
    src: int
    dst: int
    sign: str
    type: str
    unit: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "sign": self.sign, "type": self.type, "unit": self.unit}


@dataclass(frozen=True)
class ErrorMark:
    action: int
    kind: str
    evidence: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "kind": self.kind, "evidence": self.evidence}


@dataclass(frozen=True)
class InfluenceGraph:
    """A validated graph. Construct through :func:`validate_graph` or :meth:`uniform`."""

    num_actions: int
    edges: tuple[Edge, ...] = ()
    errors: tuple[ErrorMark, ...] = ()
    direct_user_inputs: tuple[tuple[int, int], ...] = ()  # (action, count), sorted, count > 0

    @classmethod
    def uniform(cls, num_actions: int) -> InfluenceGraph:
        """The uninformative graph: no edges, no errors, no direct inputs (gives GRPO exactly)."""
        return cls(num_actions=num_actions)

    @property
    def is_uniform(self) -> bool:
        return not self.edges and not self.errors and not self.direct_user_inputs

    def to_json(self) -> dict[str, Any]:
        return {
            "num_actions": self.num_actions,
            "errors": [mark.to_json() for mark in self.errors],
            "direct_user_inputs": {str(action): count for action, count in self.direct_user_inputs},
            "edges": [edge.to_json() for edge in self.edges],
        }

    def error_indicator(self) -> np.ndarray:
        """``e`` as a float array of shape ``(num_actions,)``."""
        indicator = np.zeros(self.num_actions, dtype=np.float64)
        for mark in self.errors:
            indicator[mark.action] = 1.0
        return indicator

    @cached_property
    def degree_table(self) -> np.ndarray:
        """``(4, num_actions)`` float64 rows ``d_plus, d_minus, d_in, e``, computed once per graph.

        Graphs are immutable, so the table is cached (and travels with the pickled graph, e.g.
        from the agent loop to the trainer): batching many graphs is then one copy per graph.
        """
        d_plus, d_minus, d_in = self.degrees()
        table = np.stack([d_plus, d_minus, d_in, self.error_indicator()])
        table.setflags(write=False)
        return table

    def degrees(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(d_plus, d_minus, d_in)`` of shape ``(num_actions,)`` each (docs/design.md section 3).

        ``d_plus[i]`` = number of ``+`` edges out of ``i``, ``d_minus[i]`` = number of ``-``
        edges out of ``i``, ``d_in[i]`` = ``u_i`` + number of ``+`` edges into ``i``.
        """
        d_plus = np.zeros(self.num_actions, dtype=np.float64)
        d_minus = np.zeros(self.num_actions, dtype=np.float64)
        d_in = np.zeros(self.num_actions, dtype=np.float64)
        for action, count in self.direct_user_inputs:
            d_in[action] += count
        for edge in self.edges:
            if edge.sign == "+":
                d_plus[edge.src] += 1
                d_in[edge.dst] += 1
            else:
                d_minus[edge.src] += 1
        return d_plus, d_minus, d_in


@dataclass
class GraphValidation:
    """What validation did to one graph; summed into the ``credit/*`` metrics."""

    fallback: bool = False
    repaired_edges: int = 0
    errors_added: int = 0
    problems: list[str] = field(default_factory=list)

    def note(self, problem: str) -> None:
        # Keep the list short: it is for humans reading a report, the counts are for metrics.
        if len(self.problems) < 20:
            self.problems.append(problem)


def validate_graph(raw: Any, num_actions: int) -> tuple[InfluenceGraph, GraphValidation]:
    """Validate (and repair) a serialized graph for a trajectory with ``num_actions`` actions.

    ``raw`` may be a dict (the section 2.1 JSON), a JSON string, or an :class:`InfluenceGraph`.
    Returns the graph to use and a report; never raises on bad content.
    """
    report = GraphValidation()
    try:
        return _validate(raw, num_actions, report)
    except (RecursionError, TypeError, ValueError, OverflowError, AttributeError, KeyError) as exc:
        # Safety net: content the checks below did not foresee falls back instead of raising.
        return _fallback(report, num_actions, f"graph could not be validated ({type(exc).__name__})")


def _validate(raw: Any, num_actions: int, report: GraphValidation) -> tuple[InfluenceGraph, GraphValidation]:
    if isinstance(raw, InfluenceGraph):
        raw = raw.to_json()
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _fallback(report, num_actions, f"unparseable graph JSON: {exc}")
        except (RecursionError, ValueError) as exc:  # too deep, or Python's int-string limit
            return _fallback(report, num_actions, f"unparseable graph JSON ({type(exc).__name__})")
    if not isinstance(raw, dict):
        return _fallback(report, num_actions, f"graph is not a JSON object ({type(raw).__name__})")
    declared = raw.get("num_actions")
    if isinstance(declared, bool) or not isinstance(declared, int):
        return _fallback(report, num_actions, "graph.num_actions missing or not an integer")
    if declared != num_actions:
        return _fallback(report, num_actions, f"graph.num_actions={declared} but the trajectory has {num_actions}")
    if "edges" not in raw:
        report.repaired_edges += 1
        report.note("graph.edges missing; no edges")
    raw_edges = raw.get("edges", [])
    if not isinstance(raw_edges, list):
        return _fallback(report, num_actions, "graph.edges is not a list")

    edges: list[Edge] = []
    seen: set[tuple[int, int, str]] = set()
    for position, raw_edge in enumerate(raw_edges):
        parsed = _parse_edge(raw_edge, num_actions, position, report)
        if parsed is None:
            report.repaired_edges += 1
            continue
        edge, coerced = parsed
        key = (edge.src, edge.dst, edge.sign)
        if key in seen:
            report.repaired_edges += 1
            report.note(f"edges[{position}]: duplicate of an earlier edge {key}")
            continue
        if coerced:  # kept, but counted: the schema asks for integers
            report.repaired_edges += 1
            report.note(f"edges[{position}]: src/dst given as strings; read as integers")
        seen.add(key)
        edges.append(edge)

    errors: dict[int, ErrorMark] = {}
    raw_errors = raw.get("errors", [])
    if not isinstance(raw_errors, list):
        report.repaired_edges += 1
        report.note("graph.errors is not a list; ignored")
        raw_errors = []
    for position, raw_mark in enumerate(raw_errors):
        marked = _parse_error(raw_mark, num_actions, position, report)
        if marked is None:
            report.repaired_edges += 1
            continue
        mark, coerced = marked
        if mark.action in errors:
            report.repaired_edges += 1
            report.note(f"errors[{position}]: duplicate error mark for action {mark.action}; dropped")
            continue
        if coerced:
            report.repaired_edges += 1
            report.note(f"errors[{position}]: action given as a string; read as an integer")
        errors[mark.action] = mark

    # Invariant d-_i > 0 => e_i = 1: a failed-use edge starts at an action that erred.
    for edge in edges:
        if edge.sign == "-" and edge.src not in errors:
            errors[edge.src] = ErrorMark(edge.src, "inferred", f"source of failed-use edge to {edge.dst}")
            report.errors_added += 1
            report.note(f"action {edge.src}: error mark added (it is the source of a failed-use edge)")

    direct: dict[int, int] = {}
    raw_direct = raw.get("direct_user_inputs", {})
    entries: list[tuple[str, Any, Any]] = []  # (where, key, count)
    if isinstance(raw_direct, list):  # tolerate [[action, count], ...]
        listed: dict[str, tuple[str, Any, Any]] = {}
        for position, item in enumerate(raw_direct):
            where = f"direct_user_inputs[{position}]"
            if not (isinstance(item, list | tuple) and len(item) == 2):
                report.repaired_edges += 1
                report.note(f"{where}: not an [action, count] pair; dropped")
                continue
            key = item[0] if isinstance(item[0], str) else json.dumps(item[0])
            if key in listed:  # the later pair wins
                report.repaired_edges += 1
                report.note(f"{where}: repeats action {key}; the earlier pair is dropped")
            listed[key] = (where, item[0], item[1])
        entries = list(listed.values())
    elif isinstance(raw_direct, dict):
        entries = [(f"direct_user_inputs[{key!r}]", key, count) for key, count in raw_direct.items()]
    else:
        report.repaired_edges += 1
        report.note("graph.direct_user_inputs is not an object; ignored")
    for where, key, count in entries:
        action, coerced = _as_index(key)
        if isinstance(key, str) and action is not None and _CANONICAL_INDEX.fullmatch(key):
            coerced = False  # object keys are strings by necessity
        if (
            action is None
            or not 0 <= action < num_actions
            or isinstance(count, bool)
            or not isinstance(count, int)
            or not 0 <= count <= MAX_DIRECT_COUNT
        ):
            report.repaired_edges += 1
            report.note(f"{where}={_brief(count)} dropped")
            continue
        if coerced:
            report.repaired_edges += 1
            report.note(f"{where}: action {_brief(key)} read as {action}")
        if count:
            direct[action] = direct.get(action, 0) + count

    graph = InfluenceGraph(
        num_actions=num_actions,
        edges=tuple(sorted(edges, key=lambda e: (e.src, e.dst, e.sign))),
        errors=tuple(errors[a] for a in sorted(errors)),
        direct_user_inputs=tuple(sorted(direct.items())),
    )
    return graph, report


def _fallback(report: GraphValidation, num_actions: int, problem: str) -> tuple[InfluenceGraph, GraphValidation]:
    report.fallback = True
    report.note(problem)
    return InfluenceGraph.uniform(num_actions), report


def _brief(value: Any, limit: int = 40) -> str:
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "a list"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**limit:
        return "a huge integer"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _as_index(value: Any) -> tuple[int | None, bool]:
    """``(index, coerced)``: an integer as is, a decimal string (ASCII digits) converted with
    ``coerced = True``, anything else ``(None, False)``."""
    if isinstance(value, bool):
        return None, False
    if isinstance(value, int):
        return value, False
    if isinstance(value, str) and len(value) <= 40:
        match = _DECIMAL.fullmatch(value)
        if match:
            return int(match.group(1)), True
    return None, False


def _parse_edge(raw: Any, num_actions: int, position: int, report: GraphValidation) -> tuple[Edge, bool] | None:
    where = f"edges[{position}]"
    if not isinstance(raw, dict):
        report.note(f"{where}: not an object")
        return None
    (src, src_coerced), (dst, dst_coerced) = _as_index(raw.get("src")), _as_index(raw.get("dst"))
    if src is None or dst is None:
        report.note(f"{where}: src/dst missing or not integers")
        return None
    if not (0 <= src < num_actions and 0 <= dst < num_actions):
        report.note(f"{where}: index out of range ({_brief(src)}->{_brief(dst)}, {num_actions} actions)")
        return None
    if src >= dst:
        report.note(f"{where}: src >= dst ({src}->{dst})")
        return None
    edge_type = raw.get("type")
    if not isinstance(edge_type, str) or edge_type not in EDGE_TYPES:
        report.note(f"{where}: unknown type {_brief(edge_type)}")
        return None
    sign = raw.get("sign")
    if not isinstance(sign, str) or EDGE_TYPES[edge_type] != sign:
        report.note(f"{where}: sign {_brief(sign)} does not match type {edge_type!r}")
        return None
    unit = raw.get("unit", "")
    unit = unit if isinstance(unit, str) else json.dumps(unit)
    return Edge(src, dst, sign, edge_type, unit[:MAX_UNIT_CHARS]), src_coerced or dst_coerced


def _parse_error(raw: Any, num_actions: int, position: int, report: GraphValidation) -> tuple[ErrorMark, bool] | None:
    where = f"errors[{position}]"
    if isinstance(raw, int) and not isinstance(raw, bool):  # tolerate a bare index
        raw = {"action": raw, "kind": "error"}
    if not isinstance(raw, dict):
        report.note(f"{where}: not an object")
        return None
    action, coerced = _as_index(raw.get("action"))
    if action is None or not 0 <= action < num_actions:
        report.note(f"{where}: action index missing or out of range")
        return None
    kind = raw.get("kind", "error")
    evidence = raw.get("evidence", "")
    return ErrorMark(action, _text(kind), _text(evidence)), coerced


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value) if isinstance(value, dict | list) else str(value)
    return text[:MAX_UNIT_CHARS]


def graph_json_schema(num_actions: int | None = None) -> dict[str, Any]:
    """JSON schema of the serialized graph (the LLM annotator's constrained-output schema).

    With ``num_actions`` the indices are bounded, so a constrained decoder cannot emit an
    out-of-range action (the validator still checks ``src < dst``).
    """
    index: dict[str, Any] = {"type": "integer", "minimum": 0}
    if num_actions is not None:
        index["maximum"] = max(num_actions - 1, 0)
    num: dict[str, Any] = {"type": "integer", "minimum": 0}
    if num_actions is not None:
        num = {"type": "integer", "enum": [num_actions]}
    return {
        "type": "object",
        "properties": {
            "num_actions": num,
            "errors": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "action": index,
                        "kind": {"type": "string"},
                        "evidence": {"type": "string"},
                    },
                    "required": ["action", "kind", "evidence"],
                    "additionalProperties": False,
                },
            },
            "direct_user_inputs": {
                "type": "object",
                "additionalProperties": {"type": "integer", "minimum": 0},
            },
            "edges": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "src": index,
                        "dst": index,
                        "sign": {"type": "string", "enum": list(SIGNS)},
                        "type": {"type": "string", "enum": list(EDGE_TYPES)},
                        "unit": {"type": "string"},
                    },
                    "required": ["src", "dst", "sign", "type", "unit"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["num_actions", "errors", "direct_user_inputs", "edges"],
        "additionalProperties": False,
    }
