"""The causal call graph of CALL-CREDIT (docs/design.md section 2.2): roles plus read -> edit -> verify edges.

``roles`` always holds a usable role per call (rules, then the position prior as a tie-break);
``ambiguous[i]`` is True when the rules alone could not decide call ``i`` -- the credit JSONL then
reports ``role: null, ambiguous: true`` while the math uses the tie-broken role.
Edge kinds: ``IG->AE`` (edit of a path the read saw), ``AE->RV`` (tests run after the edit),
``RV->AE`` (self-correction: an edit of a path named in a failing test output).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

__all__ = ["ROLES", "CallEdge", "CallGraph"]

#: CALL-CREDIT's call roles: information gathering, action execution, result verification
ROLES: tuple[str, ...] = ("IG", "AE", "RV")


@dataclass(frozen=True)
class CallEdge:
    src: int
    dst: int
    kind: str  # "IG->AE" | "AE->RV" | "RV->AE"
    unit: str = ""  # the path or symbol that justifies the edge

    def to_json(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "kind": self.kind, "unit": self.unit}


@dataclass(frozen=True)
class CallGraph:
    roles: tuple[str, ...]
    ambiguous: tuple[bool, ...]
    edges: tuple[CallEdge, ...] = ()

    def __post_init__(self) -> None:
        if len(self.roles) != len(self.ambiguous):
            raise ValueError("roles and ambiguous must have one entry per call")
        for role in self.roles:
            if role not in ROLES:
                raise ValueError(f"unknown call role {role!r} (roles: {ROLES})")
        for edge in self.edges:
            if not 0 <= edge.src < len(self.roles) or not 0 <= edge.dst < len(self.roles) or edge.src == edge.dst:
                raise ValueError(f"call edge {edge.src}->{edge.dst} out of range for {len(self.roles)} calls")

    @property
    def num_calls(self) -> int:
        return len(self.roles)

    @cached_property
    def role_table(self) -> np.ndarray:
        """``(1 + len(ROLES), num_calls)`` float64: ``deg_i`` then one-hot rows for IG, AE, RV.

        Cached (graphs are immutable), so batching many call graphs is one copy per graph.
        """
        table = np.zeros((1 + len(ROLES), self.num_calls), dtype=np.float64)
        table[0] = self.out_degree()
        for position, role in enumerate(self.roles):
            table[1 + ROLES.index(role), position] = 1.0
        table.setflags(write=False)
        return table

    def out_degree(self) -> np.ndarray:
        """``deg_i``: outgoing causal edges per call, shape ``(num_calls,)``."""
        degree = np.zeros(self.num_calls, dtype=np.float64)
        for edge in self.edges:
            degree[edge.src] += 1
        return degree

    def reported_roles(self) -> list[str | None]:
        """Roles as the credit JSONL reports them (``None`` for ambiguous calls)."""
        return [None if amb else role for role, amb in zip(self.roles, self.ambiguous, strict=True)]

    def to_json(self) -> dict[str, Any]:
        return {
            "roles": list(self.roles),
            "ambiguous": list(self.ambiguous),
            "edges": [edge.to_json() for edge in self.edges],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> CallGraph:
        return cls(
            roles=tuple(raw["roles"]),
            ambiguous=tuple(bool(a) for a in raw.get("ambiguous", [False] * len(raw["roles"]))),
            edges=tuple(
                CallEdge(int(e["src"]), int(e["dst"]), str(e["kind"]), str(e.get("unit", "")))
                for e in raw.get("edges", [])
            ),
        )
