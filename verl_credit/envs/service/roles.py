"""CALL-CREDIT call graphs for the demo service world (docs/design.md section 2.2, adapted to its tools).

The coding-agent classifier (``annotate.roles``) reads file paths and shell commands; this domain
has neither, so its calls would all look like reads. The service world declares which of its
tools read and which write, and that gives the roles directly:

* ``IG``: a read tool (``get_*``, ``search_help``) -- except the case below;
* ``AE``: a write tool (``return_item``, ``refund_order``, ``exchange_item``);
* ``RV``: a read of an order after a successful write to that order (checking the result);
* a message without tool calls (a question to the customer, a confirmation, a closing) inherits
  the role of the next call, else ``IG`` (as section 2.2 says for plain reasoning calls).

Causal edges by content reference (the unit is the shared value):

* ``IG -> AE``: a value in the AE call's arguments appears in the IG call's result;
* ``AE -> RV``: the RV call reads the order the AE call wrote, before the next write to it;
* ``RV -> AE``: not produced (no read here reports a failure that a later write repairs).
"""

from __future__ import annotations

from verl_credit.call_graph import ROLES, CallEdge, CallGraph
from verl_credit.envs.service.world import READ_TOOLS, WRITE_TOOLS
from verl_credit.trajectory import Trajectory

__all__ = ["build_service_call_graph"]

IG, AE, RV = ROLES[0], ROLES[1], ROLES[2]


def _argument_values(arguments: dict) -> list[str]:
    return [str(value) for value in arguments.values() if isinstance(value, str | int | float) and str(value)]


def build_service_call_graph(trajectory: Trajectory) -> CallGraph:
    """Roles and causal edges of every action of a service-world trajectory."""
    results: dict[int, list[tuple[str, bool]]] = {}
    for observation in trajectory.observations:
        if observation.role == "tool" and observation.source_action is not None:
            is_error = observation.content.startswith("Error")
            results.setdefault(observation.source_action, []).append((observation.content, is_error))

    roles: list[str | None] = []
    ambiguous: list[bool] = []
    written_orders: dict[str, int] = {}  # order id -> last action that wrote it successfully
    for action in trajectory.actions:
        if not action.tool_calls:
            roles.append(None)
            ambiguous.append(False)
            continue
        call = action.tool_calls[0]
        ok = not any(error for _, error in results.get(action.index, []))
        order_id = str(call.arguments.get("order_id", ""))
        if call.name in WRITE_TOOLS:
            roles.append(AE)
            if ok and order_id:
                written_orders[order_id] = action.index
        elif call.name in READ_TOOLS:
            roles.append(RV if order_id in written_orders else IG)
        else:
            roles.append(IG)  # a tool this world does not have: a read by default, flagged ambiguous
        ambiguous.append(call.name not in READ_TOOLS and call.name not in WRITE_TOOLS)
    # Text-only actions inherit the next call's role (else IG).
    next_role = IG
    for index in range(len(roles) - 1, -1, -1):
        if roles[index] is None:
            roles[index] = next_role
        else:
            next_role = roles[index]  # type: ignore[assignment]

    edges: list[CallEdge] = []
    for action in trajectory.actions:
        if roles[action.index] != AE or not action.tool_calls:
            continue
        values = _argument_values(action.tool_calls[0].arguments)
        for source in trajectory.actions[: action.index]:
            if roles[source.index] != IG or not source.tool_calls:
                continue
            text = " ".join(content for content, error in results.get(source.index, []) if not error)
            unit = next((value for value in values if value in text), None)
            if unit is not None:
                edges.append(CallEdge(source.index, action.index, "IG->AE", unit))
    last_write: dict[str, int] = {}
    for action in trajectory.actions:
        if not action.tool_calls:
            continue
        order_id = str(action.tool_calls[0].arguments.get("order_id", ""))
        if roles[action.index] == AE and order_id:
            last_write[order_id] = action.index
        elif roles[action.index] == RV and order_id in last_write:
            edges.append(CallEdge(last_write[order_id], action.index, "AE->RV", order_id))
    return CallGraph(roles=tuple(roles), ambiguous=tuple(ambiguous), edges=tuple(edges))  # type: ignore[arg-type]
