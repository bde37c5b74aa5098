"""The rule annotator (docs/design.md section 5 ``rules``): provenance tracing of concrete values.

No model, pure Python, deterministic. For one trajectory it produces the section 2.1 graph
``G = (V, E+, E-, e, u)`` and passes it through :func:`verl_credit.graph.validate_graph` (the single
source of truth for what a valid graph is).

What the rules detect, in order:

1. **Errors** ``e_i``:
   ``schema_error`` -- a tool call whose arguments are not a JSON object, or (when the tool list is
   known: the ``tools`` option or a record's ``tools`` field) an unknown tool name or a missing
   required argument; ``tool_error`` -- a tool result that reports an error
   (:func:`~verl_credit.annotate.rules_dialog.error_evidence`); ``user_rejection`` -- a user turn
   that explicitly refuses the preceding action's proposal or result
   (:func:`~verl_credit.annotate.rules_dialog.is_rejection`; a goal revision, an agreement, a
   partial decline that accepts the offer, a report that a check found nothing, and anything
   after a greeting or closing are not).
2. **Units**: every information unit bound to a tool-call argument of action ``j``
   (:mod:`~verl_credit.annotate.rules_values`). Only tool-call actions consume units: questions,
   proposals, reports, greetings and closings bind nothing, so they get no incoming edge (except
   the branch and recovery edges of rules 7 and 8). A free-text argument (``summary``,
   ``reason``, ``note``, ... that the tool schema gives no enum or format) is a report: no units.
   A message's text also holds its dates in words as ISO dates (``"May 26"`` -> ``2024-05-26``
   when the conversation fixes the year) and its spelled numbers; the day of a date in prose is
   not a number of its own.
3. **Resolution** of each unit ``v`` of ``j`` to exactly one of:

   * *failed* -- ``v`` is invalid output of an error-bearing action ``i < j`` (an argument of
     the failing call that the error message names; the only argument of a failing call whose
     message names none, unless the failure is a schema failure -- then the form was wrong, not
     the value; a value the erring or rejected action introduced itself) and nothing clean (a
     successful tool result, a user turn) re-supplied ``v`` after the error: ``-`` edge
     ``i -> j`` (``failed_utilization``; the latest such ``i``);
   * *sourced* -- candidate source actions ``k < j``: ``k``'s successful tool result contains
     ``v``; a user reply elicited by ``k`` contains ``v``; or ``k`` introduced ``v`` (its text
     or arguments are the first place ``v`` appears). Sources are chosen by greedy set cover
     over ``j``'s units -- the source covering most of the remaining units first ("most
     comprehensive"), ties to the earliest; each unit is covered once ("several sources only for
     non-overlapping units"). A reply naming a value an earlier tool result (or the agent's own
     text) supplied is the user's choice or approval of it: the tool call stays the value's
     source, and the reply's eliciting action gets ``+`` ``P -> j`` (``input``, unit
     ``choice=...``). A later reply that only restates what an unelicited user turn (the opening
     request) already gave is not a source: the value stays a direct input (earliest wins). A
     value the agent itself introduced that the proposal the user confirmed for ``j`` restates
     is sourced to that proposal. Edge
     type ``input`` when a covered unit came through a user reply elicited by ``k``, else
     ``success_utilization``. The earliest :data:`MAX_SOURCE_OCCURRENCES` occurrences of a unit
     are looked at;
   * *coincidental* -- a low-entropy value (one word or code without a digit -- ``one_way``,
     ``economy``, ``JFK`` -- or a date) is not supplied by a tool result that holds it only as a
     field name (``"economy": 15`` under ``available_seats``), nor by a *foreign record*: the
     result of a look-up by an identifier argument (``reservation_id``, ``order_id``, ``id``) whose
     values nothing else names (no user turn, no system prompt, no text of the agent's other
     actions, no argument of another call), that supplies no identifier (``HAT271``) a call
     later takes, and that holds fewer than two of the consumer's values the user's own words gave
     (not counting values a record looked up by a named id -- the user's profile -- explains: a
     record the user *described*). Such sources are dropped when the value has another supply (a
     user turn, the agent, another tool result, the tool list); when foreign records are all that
     hold it, the rules keep them and flag U8;
   * *direct* -- only an unelicited user turn (the opening request, or a reply to a greeting or
     closing) holds ``v``: counted once in ``u_j`` (per distinct unit of ``j``; another action
     consuming the same value counts it again in its own ``u``);
   * *constant* -- only the system prompt or the tool list holds ``v``: nothing;
   * *untraced* -- ``v`` appears nowhere before ``j``: nothing, and the trajectory is uncertain.

4. **Retries**: a tool call with the same tool and the same arguments up to spelling
   (:func:`~verl_credit.annotate.rules_values.canonical_call_signature`) as the latest earlier
   identical call, when that call failed: ``-`` edge from the failing action (unit
   ``retry <tool>``). A *corrected* retry -- the next call of the failed tool, its arguments
   changed -- falls back because of the failure: ``-`` edge too (unit ``corrected retry <tool>``).
5. **Confirmations**: a user affirmation ("yes, go ahead") of a proposal made by action ``P``
   (the closest action that asked): every write call (a tool whose name does not start with a
   read verb such as ``get``/``find``/``list``/``search``, nor ``think``/``calculate``) before
   the next user turn gets ``+`` ``P -> j`` (``input``, unit ``confirmation``); when the turn
   makes no write (an agreed extra step done after more questions: "Yes, I'd like to return that
   item as well"), the first later write using a value ``P`` named gets it.
6. **Choices**: a user reply to an action ``P`` that listed options (enumerated lines or
   ``A or B?``) that picks one by ordinal ("the second one", "number 2") or by a word only that
   option has (name, colour, time, ...; a tie between options is U5). The first later call that
   acts on the chosen option gets ``+`` ``P -> j`` (``input``, unit ``choice=...``): one of its
   argument atoms or tool-name parts is a *distinctive* atom of the option (one no other option
   has), or an ``_``-joined argument such as ``credit_card_9922`` has all its alphabetic parts in
   the option and one of them distinctive. When no call does, the option is a description
   ("Green, size M", "the Visa ending in 7447"): the ids of the single smallest tool-result
   record holding all its distinctive atoms that tool results hold (the variant ``"2003"``) are
   looked up instead. A "yes" that also names one option is a choice of it. The chosen entry's ids
   still trace to their tool source by rule 3. A list inside a report (no question, no "which"
   / "choose" / "let me know") and an open question ("..., or something else?", "for example
   ...", examples in parentheses) offer nothing to choose from.
7. **Branches**: a user reply that triggers a transfer (a ``transfer``/``escalate``/``handoff``
   tool called first in the agent's answer, or anywhere in it when the reply asks for a human)
   or a refusal (the answer's first action is text whose main act is a decline -- in its opening
   sentences, "I'm sorry, but I can't ...", "basic fares cannot be modified" -- answering a reply
   that asked for something) gives the branching action ``+`` from the reply's eliciting action (``input``, unit
   ``branch=transfer`` / ``branch=refusal``), or a direct user input when the reply was
   unelicited.
8. **Recoveries**: an action whose text reports an observed mismatch ("this doesn't match the
   line I retrieved") gets ``+`` from the action whose successful tool result showed it (the
   latest one holding an entity the report names, else the latest result before it;
   ``success_utilization``, unit ``mismatch=...``).

Edges with the same ``(src, dst, sign)`` are merged (units joined with ``"; "``; ``input`` wins
over ``success_utilization``).

``uncertain`` (the hybrid annotator escalates these to the LLM) is set when, and only when:

* U1 ``untraced`` -- a tool-call argument unit appears nowhere before its action (computed,
  paraphrased or hallucinated value);
* U2 ``tie`` -- set cover picked a source while another action with the same coverage supplies
  the same unit in a different way (one through a user reply, the other through a tool result
  or by introducing it; a tool result that echoes its own call's argument does not count);
  ties between two tool results or two replies are resolved by "earliest" without doubt;
* U3 ``unparseable`` -- a tool call's arguments are not a JSON object;
* U4 ``unconsumed reply`` -- a user reply elicited by a question, with substantive content
  (not an affirmation, rejection, polite decline or resolved choice) that holds an entity value
  (id, number, date, email) or answers a proposal, none of whose units any later tool call
  uses, while a later tool call exists (a report in words -- "Data Saver is off" -- is not);
* U5 ``choice`` -- a reply picks among listed options but the option is ambiguous (and the reply
  uses choice words: "I'll take", "option", "go with", ...), or no later call uses the chosen
  option;
* U6 ``ambiguous failure`` -- a later call reuses an argument of a failing multi-argument call
  whose error message names none of its arguments (which value was wrong is unknown);
* U7 ``exception`` -- the rules themselves failed on odd content; the graph is then the
  uniform fallback (``validation.fallback = True``, the exception noted and counted);
* U8 ``coincidental source`` -- a low-entropy argument value is held before its action only by
  foreign records (rule 3, *coincidental*): the agent may have read it there, or got it from the
  user's words in a form the rules do not match ("the 10th", "New York") -- they cannot tell.

Cost: one pass builds an inverted index (atom -> messages) and every look-up goes through it, so
annotation time is linear in the number of actions and messages (long texts every trajectory of
a task repeats -- the system prompt, the tool list -- are tokenised once per process).

Known limits: values are matched literally up to the normalisation above (no paraphrase, no
arithmetic); a date in words needs the year fixed by the conversation; a text-only action
consumes nothing but its branch or recovery edge; a rejection marks the action right before the
user turn (not an earlier write it reports); the dialogue-act patterns are English.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import heapq
import itertools
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_credit.annotate.base import AnnotationResult, Annotator, register_annotator
from verl_credit.annotate.rules_dialog import (
    asks_for_input,
    error_evidence,
    is_affirmation,
    is_generic_offer,
    is_mismatch_report,
    is_polite_decline,
    is_proposal,
    is_refusal,
    is_rejection,
    is_request,
    is_transfer_request,
    is_transfer_tool,
    ordinal_choice,
    parse_options,
)
from verl_credit.annotate.rules_values import (
    STOPWORDS,
    TRIVIAL_VALUES,
    ArgUnit,
    DateContext,
    IndexedText,
    OccurrenceIndex,
    atomize,
    canonical_call_signature,
    extract_units,
    extract_units_from_raw,
    is_entity_atom,
)
from verl_credit.graph import GraphValidation, InfluenceGraph, validate_graph
from verl_credit.trajectory import Action, Observation, ToolCall, Trajectory

__all__ = ["RULES_VERSION", "RuleAnnotator", "RuleTrace", "annotate_rules", "trace_rules", "uncertainty_reasons"]

logger = logging.getLogger(__name__)

#: bump when the rules change what they output (part of cache keys)
RULES_VERSION = "rules-5"

READ_VERBS = frozenset(
    "get find list search lookup look check view read fetch query show calculate compute verify think describe "
    "count retrieve browse".split()
)
MAX_UNIT_CHARS = 200
#: earliest occurrences of a unit looked at for its sources (keeps a value that every message repeats
#: -- a customer id in each of thousands of results -- from making annotation quadratic)
MAX_SOURCE_OCCURRENCES = 64
#: candidate calls tried for a choice, and latest tool-result records searched for a described option
MAX_SCANNED_CANDIDATES = 64

# candidate kinds: how an action k supplies a unit to a later action
_TOOL, _ECHO, _REPLY, _ORIGIN = "tool", "tool_echo", "reply", "origin"


@dataclass
class RuleTrace:
    """What the rules found for one trajectory, before validation.

    ``raw_graph`` is the section 2.1 JSON; ``uncertain_reasons`` lists why the trajectory is
    uncertain (empty when it is not), each reason prefixed with its criterion (``U1`` .. ``U8``).
    """

    raw_graph: dict[str, Any]
    uncertain_reasons: list[str] = field(default_factory=list)

    @property
    def uncertain(self) -> bool:
        return bool(self.uncertain_reasons)


@dataclass
class _Taint:
    action: int
    key: str
    evidence_message: int


@dataclass
class _Found:
    """The candidate sources of one unit of a consumer (rule 3), before set cover."""

    unit: ArgUnit
    sources: dict[int, set[str]]
    direct: bool
    constant: bool
    tool_messages: dict[int, list[int]]


class _Tracer:
    """One pass of the rules over one trajectory (state shared by the steps)."""

    def __init__(self, trajectory: Trajectory, tools: Sequence[Mapping[str, Any]] | None):
        self.trajectory = trajectory
        self.actions: list[Action] = trajectory.actions
        self.n = trajectory.num_actions
        self.reasons: list[str] = []
        self.errors: dict[int, tuple[str, str]] = {}
        self.edges: dict[tuple[int, int, str], tuple[str, list[str]]] = {}
        self.direct: dict[int, int] = {}
        self.tool_schemas = _tool_schemas(tools if tools is not None else trajectory.extra.get("tools"))

        messages = trajectory.messages
        self.texts: list[IndexedText] = []
        self.roles: list[str] = []
        self.action_at: dict[int, int] = {a.message_index: a.index for a in self.actions}
        self.observation_at: dict[int, Observation] = {o.message_index: o for o in trajectory.observations}
        dates = DateContext()  # the year / month the conversation so far fixes for dates in words
        for position, message in enumerate(messages):
            role = message.get("role", "") if isinstance(message, dict) else ""
            self.roles.append(str(role))
            if position in self.action_at:
                action = self.actions[self.action_at[position]]
                parts = [action.content, *(call.raw_arguments for call in action.tool_calls)]
                self.texts.append(IndexedText("\n".join(parts), dates))
            elif position in self.observation_at:
                self.texts.append(IndexedText(self.observation_at[position].content, dates))
            else:
                self.texts.append(IndexedText(""))
        self.index = OccurrenceIndex(self.texts, frozenset(m for m, role in enumerate(self.roles) if role == "system"))
        self.constants = IndexedText(json.dumps(self.tool_schemas.get("__raw__", []), default=str))
        self.action_messages = [a.message_index for a in self.actions]
        self.signature_cache: dict[tuple[int, int], str] = {}
        self.confirmed_by: dict[int, int] = {}  # write action -> the action whose proposal the user confirmed
        self.records_cache: dict[int, list[tuple[int, frozenset[str], frozenset[str]]]] = {}
        self.proposal_cache: dict[int, bool] = {}
        self.offer_cache: dict[int, bool] = {}
        self.record_index: dict[str, list[tuple[int, int, frozenset[str], frozenset[str]]]] | None = None
        self.acting_index: dict[str, list[int]] | None = None
        self.foreign_cache: dict[tuple[int, int], bool] = {}  # lookup call -> its record is foreign
        self.content_cache: dict[int, IndexedText] = {}  # action -> its text alone (no arguments)
        self.first_suppliers: set[tuple[int, int]] | None = None  # calls whose result first shows an identifier
        self.values_cache: dict[int, IndexedText | None] = {}  # tool result -> its JSON values alone

        # call_of_result[message_index] = (action, call position) for tool results
        self.call_of_result: dict[int, tuple[int, int]] = {}
        self.failing_calls: dict[tuple[int, int], int] = {}  # (action, call) -> evidence message index
        self.call_units: dict[tuple[int, int], list[ArgUnit]] = {}
        self.action_units: list[list[ArgUnit]] = []
        self.effective_source: dict[int, int | None] = {}
        self.taints: dict[str, list[_Taint]] = {}
        self.ambiguous_taints: dict[str, list[_Taint]] = {}
        self.next_user_message: list[int] = []
        self.resolved_choices: set[int] = set()
        self.schema_failed: set[tuple[int, int]] = set()
        self.corrected_retries: set[tuple[int, int]] = set()  # (failing action, its retry)

    # ------------------------------------------------------------------ helpers
    def proposal(self, action: int) -> bool:
        """``is_proposal`` of an action's text (computed once per action)."""
        cached = self.proposal_cache.get(action)
        if cached is None:
            cached = self.proposal_cache[action] = is_proposal(self.actions[action].content)
        return cached

    def generic_offer(self, action: int) -> bool:
        """``is_generic_offer`` of an action's text (computed once per action)."""
        cached = self.offer_cache.get(action)
        if cached is None:
            content = self.actions[action].content
            # a refusal that closes with "anything else?" is no closing: the reply answers the refusal
            cached = self.offer_cache[action] = is_generic_offer(content) and not is_refusal(content)
        return cached

    def act_text(self, action: int) -> str:
        """An action's text and tool names as ``name(`` (what a user's "don't <verb>" can be about; a
        called tool is something the action did)."""
        item = self.actions[action]
        return " ".join([item.content, *(call.name.replace("_", " ") + "(" for call in item.tool_calls)])

    def occurrences(self, unit: ArgUnit) -> list[int]:
        """Message indices whose text contains ``unit`` (inverted index, cached per unit key), ascending."""
        return self.index.find(unit)

    def origin_action(self, unit: ArgUnit) -> int | None:
        """The action whose message is the first place ``unit`` appears (None if a non-action is)."""
        found = self.occurrences(unit)
        if not found or self.constants.contains(unit):
            return None
        return self.action_at.get(found[0])

    def add_error(self, action: int, kind: str, evidence: str) -> None:
        if action not in self.errors:
            self.errors[action] = (kind, evidence[:MAX_UNIT_CHARS])

    def add_edge(self, src: int, dst: int, sign: str, edge_type: str, unit: str) -> None:
        key = (src, dst, sign)
        if key in self.edges:
            old_type, units = self.edges[key]
            if unit not in units:
                units.append(unit)
            if edge_type == "input":
                old_type = "input"
            self.edges[key] = (old_type, units)
        else:
            self.edges[key] = (edge_type, [unit])

    def is_clean_message(self, message_index: int) -> bool:
        """A successful tool result or a user turn (evidence that a value is fine)."""
        role = self.roles[message_index]
        if role == "user":
            return True
        if role == "tool":
            call = self.call_of_result.get(message_index)
            return call is None or self.failing_calls.get(call) != message_index
        return False

    # ------------------------------------------------------------------ steps
    def run(self) -> RuleTrace:
        self.map_tool_results()
        self.resolve_user_provenance()
        self.extract_units()
        self.find_errors()
        self.find_taints()
        self.find_confirmations()
        self.find_retries()
        for j, action in enumerate(self.actions):
            if action.tool_calls:
                self.resolve_consumer(j)
        self.find_choices()
        self.find_branches()
        self.find_mismatch_recoveries()
        self.find_unconsumed_replies()
        raw = {
            "num_actions": self.n,
            "errors": [{"action": a, "kind": k, "evidence": e} for a, (k, e) in sorted(self.errors.items())],
            "direct_user_inputs": {str(a): c for a, c in sorted(self.direct.items())},
            "edges": [
                {"src": s, "dst": d, "sign": sign, "type": t, "unit": "; ".join(units)[:MAX_UNIT_CHARS]}
                for (s, d, sign), (t, units) in sorted(self.edges.items())
            ],
        }
        return RuleTrace(raw, _dedupe_reasons(self.reasons))

    def map_tool_results(self) -> None:
        """Pair each tool result with the call that produced it: the trajectory model's pairing
        (the nearest preceding unanswered call of its id, so that a provider reusing ids within
        one conversation does not move an error onto an earlier action)."""
        for observation in self.trajectory.observations:
            if observation.role != "tool" or observation.source_action is None:
                continue
            calls = self.actions[observation.source_action].tool_calls
            position = observation.call_position if observation.call_position is not None else 0
            self.call_of_result[observation.message_index] = (
                observation.source_action,
                position if 0 <= position < max(1, len(calls)) else 0,
            )

    def resolve_user_provenance(self) -> None:
        """``Observation.source_action``, except that a greeting or closing elicits nothing, and that
        a request for input worded without a question ("I'll need your user ID ...", "Please enter
        the code here.") elicits the user turn right after it (:func:`asks_for_input`)."""
        next_user = len(self.roles)
        self.next_user_message = [len(self.roles)] * (len(self.roles) + 1)
        for position in range(len(self.roles) - 1, -1, -1):
            self.next_user_message[position] = next_user
            if self.roles[position] == "user":
                next_user = position
        for observation in self.trajectory.observations:
            if observation.role != "user":
                continue
            source = observation.source_action
            if source is None and observation.after_action > 0:
                asking = self.actions[observation.after_action - 1]
                if self.next_user_message[asking.message_index] == observation.message_index and asks_for_input(
                    asking.content
                ):
                    source = asking.index
            if source is not None and self.generic_offer(source):
                source = None
            self.effective_source[observation.message_index] = source

    def extract_units(self) -> None:
        for action in self.actions:
            units: list[ArgUnit] = []
            seen: set[str] = set()
            for position, call in enumerate(action.tool_calls):
                schema = self.tool_schemas.get(call.name)
                properties = schema.get("properties") if isinstance(schema, Mapping) else None
                found = (
                    extract_units(call.arguments, position, properties if isinstance(properties, dict) else None)
                    if call.arguments_valid
                    else extract_units_from_raw(call.raw_arguments, position)
                )
                self.call_units[(action.index, position)] = found
                for unit in found:
                    if unit.key not in seen:
                        seen.add(unit.key)
                        units.append(unit)
            self.action_units.append(units)

    def find_errors(self) -> None:
        for action in self.actions:
            for position, call in enumerate(action.tool_calls):
                problem = self.schema_problem(call)
                if problem:
                    self.add_error(action.index, "schema_error", problem)
                    self.failing_calls.setdefault((action.index, position), action.message_index)
                    self.schema_failed.add((action.index, position))
                if not call.arguments_valid:
                    self.reasons.append(f"U3 unparseable: action {action.index} call {call.name!r} arguments")
        for message_index, (action, position) in sorted(self.call_of_result.items()):
            message = self.trajectory.messages[message_index]
            flagged = bool(message.get("is_error")) if isinstance(message, dict) else False
            evidence = error_evidence(self.observation_at[message_index].content, flagged)
            if evidence is not None:
                self.add_error(action, "tool_error", evidence)
                self.failing_calls[(action, position)] = message_index
        for observation in self.trajectory.observations:
            if observation.role != "user" or observation.after_action < 1:
                continue
            preceding = self.actions[observation.after_action - 1]
            if not preceding.tool_calls and self.generic_offer(preceding.index):
                continue  # a greeting or closing proposed nothing and did nothing: nothing to reject
            if is_rejection(observation.content, self.proposal(preceding.index), self.act_text(preceding.index)):
                self.add_error(preceding.index, "user_rejection", observation.content)

    def schema_problem(self, call: ToolCall) -> str | None:
        if not call.arguments_valid:
            return f"{call.name}: arguments are not a JSON object: {call.raw_arguments[:60]}"
        if not self.tool_schemas:
            return None
        schema = self.tool_schemas.get(call.name)
        if schema is None:
            return f"unknown tool {call.name!r}"
        required = schema.get("required") or []
        missing = [name for name in required if isinstance(name, str) and name not in call.arguments]
        if missing:
            return f"{call.name}: missing required argument(s) {', '.join(missing)}"
        return None

    def find_taints(self) -> None:
        """Invalid output of error-bearing actions (see the module docstring, rule 3 *failed*)."""
        for (action, position), evidence_message in sorted(self.failing_calls.items()):
            units = self.call_units.get((action, position), [])
            if evidence_message != self.actions[action].message_index:  # a tool error message
                error_text = self.texts[evidence_message]
                named = [u for u in units if error_text.contains(u)]
                if named:
                    for u in named:
                        self.taints.setdefault(u.key, []).append(_Taint(action, u.key, evidence_message))
                elif (action, position) in self.schema_failed:
                    continue  # the call's form was wrong, not (necessarily) its values
                elif len(units) == 1:
                    self.taints.setdefault(units[0].key, []).append(_Taint(action, units[0].key, evidence_message))
                else:
                    for u in units:
                        self.ambiguous_taints.setdefault(u.key, []).append(_Taint(action, u.key, evidence_message))
        for action in sorted(self.errors):
            message_index = self.actions[action].message_index
            for unit in self.introduced_units(action):
                self.taints.setdefault(unit.key, []).append(_Taint(action, unit.key, message_index))

    def introduced_units(self, action: int) -> list[ArgUnit]:
        """Units that first appear in ``action``'s own message (its arguments and entity words of its text)."""
        candidates = list(self.action_units[action])
        content = self.actions[action].content
        # each entity word once (a taint is per unit key; a huge text repeats its words)
        for atom in dict.fromkeys(atom for atom in atomize(content) if is_entity_atom(atom)):
            candidates.append(ArgUnit(atom, ((atom,),), f"text={atom}", -1))
        return [u for u in candidates if self.origin_action(u) == action]

    def failed_source(self, unit: ArgUnit, consumer_message: int, taints: dict[str, list[_Taint]]) -> int | None:
        """Latest error-bearing action whose invalid output ``unit`` is, unless cleanly re-supplied."""
        found = None
        keyed = taints.get(unit.key)
        if not keyed:
            return None
        occurrences = self.occurrences(unit)
        for taint in keyed:
            if taint.evidence_message >= consumer_message:
                continue
            start = bisect.bisect_right(occurrences, taint.evidence_message)
            stop = bisect.bisect_left(occurrences, consumer_message)
            resupplied = any(self.is_clean_message(m) for m in occurrences[start:stop])
            if not resupplied and (found is None or taint.action > found):
                found = taint.action
        return found

    def call_signature(self, action: int, position: int) -> str:
        key = (action, position)
        cached = self.signature_cache.get(key)
        if cached is None:
            call = self.actions[action].tool_calls[position]
            cached = canonical_call_signature(call.name, call.arguments, call.raw_arguments, call.arguments_valid)
            self.signature_cache[key] = cached
        return cached

    def candidates(
        self,
        unit: ArgUnit,
        consumer: int,
        own_signatures: set[str] | None = None,
        tool_messages: dict[int, list[int]] | None = None,
    ) -> tuple[dict[int, set[str]], bool, bool]:
        """``({k: kinds}, direct, constant)`` for ``unit`` consumed by action ``consumer``.

        The result of an earlier call identical to one of the consumer's own calls is not a source:
        a repeated call learns nothing from its twin (otherwise redundant repeats look causal). A
        user reply that only restates a value an earlier unelicited user turn (the opening request)
        already gave is not its source either: the earliest supply wins (docs/design.md 2.1), so the
        value stays a direct input. ``tool_messages``, when given, collects the tool results through
        which each source supplies the unit.
        """
        consumer_message = self.actions[consumer].message_index
        if own_signatures is None:
            own_signatures = {self.call_signature(consumer, p) for p in range(len(self.actions[consumer].tool_calls))}
        sources: dict[int, set[str]] = {}
        direct = False
        first_direct: int | None = None
        first_reply: dict[int, int] = {}  # source action -> its first reply holding the unit
        occurrences = self.occurrences(unit)
        origin = self.origin_action(unit)
        constant = self.constants.contains(unit)
        for considered, m in enumerate(occurrences):
            if m >= consumer_message or considered >= MAX_SOURCE_OCCURRENCES:
                break
            role = self.roles[m]
            if role == "system":
                constant = True
            elif role == "assistant":
                if origin is not None and self.action_at[m] == origin and origin < consumer:
                    sources.setdefault(origin, set()).add(_ORIGIN)
            elif role == "tool":
                call = self.call_of_result.get(m)
                if call is None or call[0] >= consumer or self.failing_calls.get(call) == m:
                    continue
                if self.call_signature(*call) in own_signatures:
                    continue
                k = call[0]
                echo = self.texts[self.actions[k].message_index].contains(unit)
                sources.setdefault(k, set()).add(_ECHO if echo else _TOOL)
                if tool_messages is not None:
                    tool_messages.setdefault(k, []).append(m)
            elif role == "user":
                source = self.effective_source.get(m)
                if source is not None and source < consumer:
                    sources.setdefault(source, set()).add(_REPLY)
                    first_reply.setdefault(source, m)
                else:
                    direct = True
                    if first_direct is None:
                        first_direct = m
        if first_direct is not None:
            for k in [k for k, kinds in sources.items() if kinds == {_REPLY} and first_reply[k] > first_direct]:
                del sources[k]  # a later reply restating what the opening request gave
        return sources, direct, constant

    def resolve_consumer(self, j: int) -> None:
        """Rule 3 for every unit of action ``j``."""
        consumer_message = self.actions[j].message_index
        own_signatures = {self.call_signature(j, p) for p in range(len(self.actions[j].tool_calls))}
        proposer = self.confirmed_by.get(j)
        proposal_text = self.texts[self.actions[proposer].message_index] if proposer is not None else None
        pool: dict[str, dict[int, set[str]]] = {}
        labels: dict[str, str] = {}
        direct_keys: set[str] = set()
        found: list[_Found] = []
        for unit in self.action_units[j]:
            labels[unit.key] = unit.label
            failed = self.failed_source(unit, consumer_message, self.taints)
            if failed is not None and failed < j:
                self.add_edge(failed, j, "-", "failed_utilization", unit.label)
                continue
            ambiguous = self.failed_source(unit, consumer_message, self.ambiguous_taints)
            if ambiguous is not None and ambiguous < j and (ambiguous, j) not in self.corrected_retries:
                self.reasons.append(
                    f"U6 ambiguous failure: action {j} reuses {unit.label!r} from failing call of action {ambiguous}"
                )
            tool_messages: dict[int, list[int]] = {}
            sources, direct, constant = self.candidates(unit, j, own_signatures, tool_messages)
            found.append(_Found(unit, sources, direct, constant, tool_messages))
        self.drop_coincidental_records(j, found)
        for item in found:
            unit, sources, direct, constant = item.unit, item.sources, item.direct, item.constant
            if (
                proposer is not None
                and sources
                and all(kinds <= {_ORIGIN} for kinds in sources.values())
                and proposal_text is not None
                and proposal_text.contains(unit)
            ):
                # a value the agent itself put forward, restated in the proposal the user confirmed:
                # the proposal of exactly this write is its source, not an earlier mention
                sources = {proposer: {_ORIGIN}}
            if sources:
                pool[unit.key] = sources
            elif direct:
                direct_keys.add(unit.key)
            elif not constant:
                self.reasons.append(f"U1 untraced: action {j} argument {unit.label!r} appears nowhere before it")
        if direct_keys:
            self.direct[j] = self.direct.get(j, 0) + len(direct_keys)
        # a reply naming a value an earlier tool result (or the agent's own text) had supplied is the
        # user's choice or approval of it: the tool call that produced the value stays its source
        # (the more comprehensive one), and the choice supports j through the action that elicited
        # the reply (docs/design.md 5: "the chosen entry's ids still trace to their tool source")
        choices: dict[int, list[str]] = {}
        for key, sources in pool.items():
            suppliers = [k for k, kinds in sources.items() if kinds & {_TOOL, _ECHO, _ORIGIN}]
            for k in [k for k, kinds in sources.items() if _REPLY in kinds]:
                if any(other < k for other in suppliers) and not sources[k] & {_TOOL, _ECHO, _ORIGIN}:
                    del sources[k]
                    choices.setdefault(k, []).append(labels[key])
        for chooser, chosen_labels in sorted(choices.items()):
            if chooser < j:
                self.add_edge(chooser, j, "+", "input", "choice=" + ", ".join(chosen_labels)[:80])
        remaining = set(pool)
        while remaining:
            coverage: dict[int, set[str]] = {}
            for key in remaining:
                for k in pool[key]:
                    coverage.setdefault(k, set()).add(key)
            best = max(len(keys) for keys in coverage.values())
            tied = sorted(k for k, keys in coverage.items() if len(keys) == best)
            chosen = tied[0]
            covered = coverage[chosen]
            for other in tied[1:]:
                for key in sorted(covered & coverage[other]):
                    mine, theirs = _kind_class(pool[key][chosen]), _kind_class(pool[key][other])
                    if mine and theirs and not mine & theirs:
                        self.reasons.append(
                            f"U2 tie: action {j} unit {labels[key]!r} has equally good sources {chosen} and {other}"
                            " of different kinds (user reply vs tool result)"
                        )
            edge_type = "input" if any(_REPLY in pool[key][chosen] for key in covered) else "success_utilization"
            order = {key: position for position, key in enumerate(labels)}
            for key in sorted(covered, key=order.__getitem__):
                self.add_edge(chosen, j, "+", edge_type, labels[key])
            remaining -= covered

    def drop_coincidental_records(self, j: int, found: list[_Found]) -> None:
        """Rule 3's exception for coincidental records (see the module docstring, *coincidental*).

        A tool result supplies a low-entropy value of ``j`` (:func:`_is_low_entropy`: an enum or
        code word, a date) only by coincidence when it is a *foreign record*: the result of a look-up
        by an identifier (:meth:`foreign_lookup`) that nothing else in the conversation names, and
        that the user did not describe either (it holds fewer than two of ``j``'s values the user's
        own words gave, not counting values a named record -- the user's profile -- explains). Such
        a source is dropped when the value has another supply (a user turn, the agent, a tool result
        that is no foreign record, the tool list); when foreign records are all that hold it, the
        rules cannot tell a coincidence from a use: U8.
        """
        low = [item for item in found if item.tool_messages and _is_low_entropy(item.unit)]
        if not low:
            return
        foreign: dict[int, bool | None] = {}  # tool message -> foreign record (None: no look-up by id)
        key_only: set[tuple[str, int]] = set()  # (unit, tool message) holding the unit as a field name only
        for item in low:
            for messages in item.tool_messages.values():
                for m in messages:
                    if m not in foreign:
                        foreign[m] = self.foreign_lookup(*self.call_of_result[m])
                    if not self.holds_as_value(m, item.unit):
                        key_only.add((item.unit.key, m))
        if not key_only and not any(foreign.values()):
            return
        consumer_message = self.actions[j].message_index
        described: dict[int, int] = {}  # foreign record -> values of j the user gave that it holds
        for item in low:
            holders = [m for messages in item.tool_messages.values() for m in messages]
            if any(foreign[m] is False for m in holders):
                continue  # a named record (the user's profile) explains the value
            if not any(self.roles[m] == "user" for m in self.occurrences(item.unit) if m < consumer_message):
                continue
            for m in dict.fromkeys(holders):
                if foreign[m]:
                    described[m] = described.get(m, 0) + 1
        for item in low:
            key = item.unit.key
            weak = [
                k
                for k, messages in item.tool_messages.items()
                if item.sources[k] <= {_TOOL, _ECHO}
                and all((key, m) in key_only or (foreign[m] and described.get(m, 0) < 2) for m in messages)
            ]
            if not weak:
                continue
            if len(weak) < len(item.sources) or item.direct or item.constant:
                for k in weak:
                    del item.sources[k]
            elif any(foreign[m] and (key, m) not in key_only for k in weak for m in item.tool_messages[k]):
                self.reasons.append(
                    f"U8 coincidental source: action {j} argument {item.unit.label!r} is held only by records of"
                    f" look-ups the conversation is not about (action {min(weak)})"
                )

    def foreign_lookup(self, action: int, position: int) -> bool | None:
        """Whether a call looked up a record the conversation is not about: it has identifier
        arguments (``reservation_id``, ``order_id``, ``id``) and none of their values appears in a user
        turn, the system prompt, the agent's own words (other than the look-up's own message) or the
        arguments of another call (a repeat of the same look-up does not count). ``None`` when the
        call has no identifier argument (a search, a list: nothing to judge by)."""
        key = (action, position)
        if key in self.foreign_cache:
            return self.foreign_cache[key]
        ids = [u for u in self.call_units.get(key, []) if _ID_ARGUMENT.search(u.label.split("=", 1)[0])]
        result: bool | None = None
        if ids:
            result = not self.supplies_identifier(action, position)
            signature = self.call_signature(action, position)
            for unit in ids:
                if not result:
                    break
                for m in self.occurrences(unit):
                    role = self.roles[m]
                    if role in ("user", "system"):
                        result = False
                    elif role == "assistant":
                        other = self.action_at[m]
                        result = not self.names_in_action(other, unit, signature, other == action)
                    if not result:
                        break
        self.foreign_cache[key] = result
        return result

    def holds_as_value(self, message_index: int, unit: ArgUnit) -> bool:
        """Whether a tool result that contains ``unit`` holds it as a value, not only as a field name
        (a result that is not JSON has no field names; a field is found as ``json.dumps`` writes it,
        ``"name":``, in the value's canonical spelling -- a field spelled otherwise counts as a value)."""
        content = self.observation_at[message_index].content
        if content[:1] not in "{[" or not any(
            '"' + atom + '":' in content for variant in unit.variants for atom in variant
        ):
            return True  # no field is named by it: the occurrence is a value (the cheap, common case)
        values = self.result_values(message_index)
        return values is None or values.contains(unit)

    def result_values(self, message_index: int) -> IndexedText | None:
        """The values of a JSON tool result without its field names (``None``: not JSON, so no field
        names to leave out). A result with ``"economy": 15`` under ``available_seats`` names the
        cabin as a field; it does not supply the value ``economy``."""
        if message_index in self.values_cache:
            return self.values_cache[message_index]
        values: IndexedText | None = None
        content = self.observation_at[message_index].content
        if content[:1] in "{[":
            try:
                data = json.loads(content)
            except (json.JSONDecodeError, ValueError, RecursionError):
                data = None
            if isinstance(data, dict | list):
                leaves: list[str] = []
                _leaf_strings(data, leaves)
                values = IndexedText("\n".join(leaves))
        self.values_cache[message_index] = values
        return values

    def supplies_identifier(self, action: int, position: int) -> bool:
        """Whether a result of call ``position`` of ``action`` is the first place an identifier some
        call takes appears (``HAT271``, ``credit_card_7``: :func:`_is_identifier_value`) -- the agent
        went on to use that record."""
        if self.first_suppliers is None:
            firsts: set[tuple[int, int]] = set()
            for units in self.action_units:
                for unit in units:
                    if _is_identifier_value(unit):
                        where = self.occurrences(unit)
                        call = self.call_of_result.get(where[0]) if where else None
                        if call is not None and self.failing_calls.get(call) != where[0]:
                            firsts.add(call)
            self.first_suppliers = firsts
        return (action, position) in self.first_suppliers

    def names_in_action(self, action: int, unit: ArgUnit, signature: str, own: bool) -> bool:
        """Whether ``action`` names ``unit`` in its text (unless ``own``: the look-up itself) or in the
        arguments of a call other than a repeat of the look-up ``signature``."""
        for position, _call in enumerate(self.actions[action].tool_calls):
            if self.call_signature(action, position) == signature:
                continue
            if any(u.key == unit.key for u in self.call_units.get((action, position), [])):
                return True
        if own:
            return False
        text = self.content_cache.get(action)
        if text is None:
            text = self.content_cache[action] = IndexedText(self.actions[action].content)
        return text.contains(unit)

    def find_retries(self) -> None:
        """Rule 4: a retry of a failed call -- the same call again (identical up to spelling, as the
        latest such call) or a corrected one (the next call of the same tool after the failure) --
        gets ``-`` from the failing action: it repeats the error or falls back because of it."""
        latest: dict[str, tuple[int, int]] = {}
        failed_tool: dict[str, int] = {}  # tool name -> the latest failing action not yet retried
        for action in self.actions:
            signatures = []
            retried: list[str] = []
            for position, call in enumerate(action.tool_calls):
                signature = canonical_call_signature(
                    call.name, call.arguments, call.raw_arguments, call.arguments_valid
                )
                previous = latest.get(signature)
                failing = failed_tool.get(call.name)
                if previous is not None and previous[0] < action.index and previous in self.failing_calls:
                    self.add_edge(previous[0], action.index, "-", "failed_utilization", f"retry {call.name}")
                    if failing is not None:
                        retried.append(call.name)
                elif failing is not None and failing < action.index:
                    self.add_edge(failing, action.index, "-", "failed_utilization", f"corrected retry {call.name}")
                    self.corrected_retries.add((failing, action.index))
                    retried.append(call.name)
                signatures.append((signature, (action.index, position)))
            for signature, call_key in signatures:
                latest[signature] = call_key
            for name in retried:
                failed_tool.pop(name, None)
            for position, call in enumerate(action.tool_calls):
                if (action.index, position) in self.failing_calls:
                    failed_tool[call.name] = action.index

    def following_actions(self, message_index: int, same_turn: bool) -> list[Action]:
        """Actions after ``message_index`` (only up to the next user turn when ``same_turn``)."""
        stop = self.next_user_message[message_index] if same_turn else len(self.roles)
        start = bisect.bisect_right(self.action_messages, message_index)
        end = bisect.bisect_left(self.action_messages, stop)
        return self.actions[start:end]

    def find_confirmations(self) -> None:
        """Rule 5: affirmation of a proposal -> the write calls that execute it (same agent turn)."""
        for observation in self.trajectory.observations:
            if observation.role != "user":
                continue
            proposer = self.effective_source.get(observation.message_index)
            if proposer is None or not self.proposal(proposer):
                continue
            if not is_affirmation(observation.content):
                continue
            found = False
            for action in self.following_actions(observation.message_index, same_turn=True):
                if any(_is_write_tool(call.name) for call in action.tool_calls):
                    self.add_edge(proposer, action.index, "+", "input", "confirmation")
                    self.confirmed_by.setdefault(action.index, proposer)
                    found = True
            if not found:
                # an agreed extra step ("Yes, I'd like to return that item as well") is executed
                # later, after more questions: the first later write using a value the offer named
                writer = self.first_write_using_text_of(proposer, observation.message_index)
                if writer is not None:
                    self.add_edge(proposer, writer, "+", "input", "confirmation")
                    self.confirmed_by.setdefault(writer, proposer)

    def first_write_using_text_of(self, proposer: int, after_message: int) -> int | None:
        """The first write call after ``after_message`` one of whose units ``proposer``'s text holds."""
        text = IndexedText(self.actions[proposer].content)
        for action in self.following_actions(after_message, same_turn=False)[:MAX_SCANNED_CANDIDATES]:
            if not any(_is_write_tool(call.name) for call in action.tool_calls):
                continue
            if any(text.contains(unit) for unit in self.action_units[action.index]):
                return action.index
        return None

    def find_branches(self) -> None:
        """A user reply that triggers a branch: a transfer or a refusal in the agent's answer to it.

        The branching action gets ``+`` from the reply's eliciting action (unit ``branch=transfer``
        / ``branch=refusal``), or a direct user input when the reply was unelicited. A transfer
        counts when it is the first action after the reply or the reply asks for a human; a
        refusal when it is the first action after the reply (text only), its main act is the
        decline (:func:`~verl_credit.annotate.rules_dialog.is_refusal`) and the reply asked for
        something (:func:`~verl_credit.annotate.rules_dialog.is_request`): a decline on grounds
        the agent found itself is not triggered by a reply that asked nothing.
        """
        for observation in self.trajectory.observations:
            if observation.role != "user" or not observation.content.strip():
                continue
            turn = self.following_actions(observation.message_index, same_turn=True)
            if not turn:
                continue
            asks_for_human = is_transfer_request(observation.content)
            target, unit = None, ""
            for position, action in enumerate(turn):
                if any(is_transfer_tool(call.name) for call in action.tool_calls) and (position == 0 or asks_for_human):
                    target, unit = action.index, "branch=transfer"
                    break
            if (
                target is None
                and not turn[0].tool_calls
                and is_refusal(turn[0].content)
                and is_request(observation.content)
            ):
                # a decline answering what the reply asked for; a decline on grounds the agent
                # found itself (a policy, a tool result) while the reply asked nothing is no branch
                target, unit = turn[0].index, "branch=refusal"
            if target is None:
                continue
            source = self.effective_source.get(observation.message_index)
            if source is not None and source < target:
                self.add_edge(source, target, "+", "input", unit)
            elif source is None:
                self.direct[target] = self.direct.get(target, 0) + 1

    def find_mismatch_recoveries(self) -> None:
        """An action that reports an observed mismatch is an error-recovery action: ``+`` from the
        action whose tool result showed it (the latest one holding an entity the report names, else
        the latest successful result before it), unit ``mismatch=...``."""
        latest_result: int | None = None
        results_by_action: dict[int, list[int]] = {}
        for message_index, (action, position) in self.call_of_result.items():
            if self.failing_calls.get((action, position)) != message_index:
                results_by_action.setdefault(action, []).append(message_index)
        for action in self.actions:
            if latest_result is not None and is_mismatch_report(action.content):
                named = dict.fromkeys(a for a in atomize(action.content) if is_entity_atom(a))  # in order, once
                source, unit = latest_result, "mismatch"
                for atom in named:
                    probe = ArgUnit(atom, ((atom,),), "", -1)
                    holders = [
                        self.action_at_result(m)
                        for m in self.occurrences(probe)
                        if m < action.message_index and self.roles[m] == "tool" and self.is_clean_message(m)
                    ]
                    holders = [h for h in holders if h is not None and h < action.index]
                    if holders:
                        source, unit = max(holders), f"mismatch={atom}"
                        break
                self.add_edge(source, action.index, "+", "success_utilization", unit)
            if action.index in results_by_action:
                latest_result = action.index

    def action_at_result(self, message_index: int) -> int | None:
        call = self.call_of_result.get(message_index)
        return call[0] if call is not None else None

    def find_choices(self) -> None:
        """Rule 6: a reply that picks one of the options its eliciting action listed."""
        for observation in self.trajectory.observations:
            if observation.role != "user":
                continue
            chooser = self.effective_source.get(observation.message_index)
            if chooser is None:
                continue
            options = parse_options(self.actions[chooser].content)
            if len(options) < 2:
                continue
            affirmed = is_affirmation(observation.content)  # "Yes, the second one": a choice all the same
            if not _ASKS_TO_CHOOSE.search(self.actions[chooser].content):
                continue  # a list inside a report or a summary offers nothing to choose from
            if any(_OPEN_OPTION.search(option) for option in options) or _EXAMPLE_LEAD.search(
                self.actions[chooser].content
            ):
                continue  # an open question ("... or something else?", "for example ...") takes a free answer
            option_atoms = [_content_atoms(option) for option in options]
            index = ordinal_choice(observation.content, len(options))
            if index is None:
                reply = set(_content_atoms(observation.content))
                scores = [len(reply & _distinctive(option_atoms, k)) for k in range(len(options))]
                best = max(scores)
                if best == 0:
                    continue
                if scores.count(best) > 1:
                    if affirmed:
                        continue  # a "yes" that names nothing only one option has: an approval
                    if _CHOICE_WORDS.search(observation.content):
                        self.reasons.append(
                            f"U5 choice: reply at message {observation.message_index} matches several options"
                        )
                    continue
                index = scores.index(best)
            self.resolved_choices.add(observation.message_index)
            chosen = _distinctive(option_atoms, index)
            consumer = self.first_call_using(chosen, set(option_atoms[index]), observation.message_index)
            if consumer is None:  # a description ("Green, size M"): find the entry it names, use its ids
                record_ids = self.record_ids(chosen, self.actions[chooser].message_index)
                consumer = self.first_call_using(record_ids, record_ids, observation.message_index)
            label = f"choice={options[index]}"
            if consumer is None and affirmed:
                continue  # an approval that also repeats part of an option: the confirmation rule covers it
            if consumer is None:
                self.reasons.append(
                    f"U5 choice: no call uses option {index + 1} chosen at message {observation.message_index}"
                )
                continue
            self.add_edge(chooser, consumer, "+", "input", label[:80])

    def first_call_using(self, distinctive: set[str], option: set[str], after_message: int) -> int | None:
        """The first tool-call action after ``after_message`` that acts on an option.

        A call acts on it when a unit atom or a tool-name part (``exchange_items`` -> ``exchange``)
        is one of the option's ``distinctive`` atoms, or when an ``_``-joined unit atom's alphabetic
        parts all occur in the ``option``'s atoms and one of them is distinctive
        (``credit_card_9922`` acts on "credit card ending in 4481" but not on "gift card").
        """
        if not distinctive:
            return None
        index = self.acting_atoms()
        start = bisect.bisect_right(self.action_messages, after_message)
        lists = [index.get(atom, []) for atom in sorted(distinctive)]
        tails = [iter(found[bisect.bisect_left(found, start) :]) for found in lists if found]
        merged = heapq.merge(*tails)  # ascending: the first later call that acts on it
        for candidate in itertools.islice(merged, MAX_SCANNED_CANDIDATES):
            action = self.actions[candidate]
            if action.tool_calls and self.acts_on(action, distinctive, option):
                return action.index
        return None

    def acting_atoms(self) -> dict[str, list[int]]:
        """Atom -> tool-call actions with a unit atom, an ``_``-part of one, or a tool-name part equal
        to it (the actions :meth:`acts_on` can accept for an option holding that atom)."""
        if self.acting_index is None:
            index: dict[str, list[int]] = {}
            for action in self.actions:
                if not action.tool_calls:
                    continue
                atoms: set[str] = set()
                for unit in self.action_units[action.index]:
                    for atom in unit.key.split():
                        atoms.add(atom)
                        if "_" in atom:
                            atoms.update(part for part in atom.split("_") if part.isalpha())
                for call in action.tool_calls:
                    atoms.update(part for part in call.name.lower().split("_") if part)
                for atom in atoms:
                    index.setdefault(atom, []).append(action.index)
            self.acting_index = index
        return self.acting_index

    def acts_on(self, action: Action, distinctive: set[str], option: set[str]) -> bool:
        for unit in self.action_units[action.index]:
            for atom in unit.key.split():
                if atom in distinctive:
                    return True
                parts = {part for part in atom.split("_") if part.isalpha()}
                if "_" in atom and parts and parts <= option and parts & distinctive:
                    return True
        for call in action.tool_calls:
            if {part for part in call.name.lower().split("_") if part} & distinctive:
                return True
        return False

    def record_ids(self, words: set[str], before_message: int) -> set[str]:
        """Ids of the single smallest tool-result record (JSON object) holding all ``words`` that
        tool results hold at all (an option's "Visa ending in 7447" names the card record by
        ``visa`` and ``7447``; "ending" is nobody's field)."""
        index = self.records_by_token()
        words = {w for w in words if w in index}
        if not words:
            return set()
        rarest = min((index.get(word, []) for word in words), key=len)
        end = bisect.bisect_left(rarest, (before_message,))  # entries are in message order
        matches: list[tuple[int, frozenset[str]]] = [
            (size, ids)
            for _message, size, tokens, ids in rarest[max(0, end - MAX_SCANNED_CANDIDATES) : end]
            if ids and words <= tokens
        ]
        if not matches:
            return set()
        smallest = min(size for size, _ in matches)
        best = {ids for size, ids in matches if size == smallest}
        return set(next(iter(best))) if len(best) == 1 else set()

    def records_by_token(self) -> dict[str, list[tuple[int, int, frozenset[str], frozenset[str]]]]:
        """Token -> ``(message, size, tokens, ids)`` of every record of a successful tool result."""
        if self.record_index is None:
            index: dict[str, list[tuple[int, int, frozenset[str], frozenset[str]]]] = {}
            for message_index in sorted(self.call_of_result):
                if self.failing_calls.get(self.call_of_result[message_index]) == message_index:
                    continue
                for size, tokens, ids in self.result_records(message_index):
                    entry = (message_index, size, tokens, ids)
                    for token in tokens:
                        index.setdefault(token, []).append(entry)
            self.record_index = index
        return self.record_index

    def result_records(self, message_index: int) -> list[tuple[int, frozenset[str], frozenset[str]]]:
        """``_records`` of a tool result's JSON (parsed once per message)."""
        cached = self.records_cache.get(message_index)
        if cached is None:
            try:
                cached = _records(json.loads(self.observation_at[message_index].content), None)
            except (json.JSONDecodeError, ValueError, RecursionError):
                cached = []
            self.records_cache[message_index] = cached
        return cached

    def find_unconsumed_replies(self) -> None:
        """U4: an elicited user reply that no later tool call uses, when it carries entity values (ids,
        numbers, dates, emails) or answers a proposal with something other than yes/no (a revision
        of what is to be done). A reply of words only to a question (a report of what the user saw
        or did: "Data Saver is off") binds nothing a call could take, so it is not a doubt."""
        last_call_message = max((a.message_index for a in self.actions if a.tool_calls), default=-1)
        last_use: dict[str, tuple[int, ArgUnit]] = {}  # unit key -> the latest consuming message
        for action in self.actions:
            for unit in self.action_units[action.index]:
                last_use[unit.key] = (action.message_index, unit)
        consumed: set[int] = set()
        for consumer_message, unit in last_use.values():
            for m in self.occurrences(unit):
                if m >= consumer_message:
                    break
                if self.roles[m] == "user":
                    consumed.add(m)
        for observation in self.trajectory.observations:
            if observation.role != "user" or self.effective_source.get(observation.message_index) is None:
                continue
            if observation.message_index > last_call_message or observation.message_index in consumed:
                continue
            text = observation.content
            if observation.message_index in self.resolved_choices or is_affirmation(text) or is_polite_decline(text):
                continue
            preceding = self.actions[observation.after_action - 1] if observation.after_action else None
            if preceding is not None and is_rejection(
                text, self.proposal(preceding.index), self.act_text(preceding.index)
            ):
                continue
            atoms = [a for a in _content_atoms(text) if a not in TRIVIAL_VALUES]
            if not atoms:
                continue
            source = self.effective_source[observation.message_index]
            if not self.proposal(source) and not any(is_entity_atom(a) for a in atoms):
                continue  # words only, answering a question (a report of a check): nothing a call takes
            self.reasons.append(
                f"U4 unconsumed reply: user message {observation.message_index} elicited by action "
                f"{self.effective_source[observation.message_index]} is used by no later call"
            )


#: an identifier argument: ``reservation_id``, ``order_id``, ``id``, ``userId``, ``item_ids``
_ID_ARGUMENT = re.compile(r"(?:^|[._\-])[iI][dD]s?$|[a-z]Ids?$")
_ISO_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def _is_identifier_value(unit: ArgUnit) -> bool:
    """A value that names one thing: one atom with a letter and a digit (``HAT271``, ``credit_card_7``)
    or an e-mail address; not a date, not a plain number."""
    key = unit.key
    if " " in key or _ISO_DAY.fullmatch(key):
        return False
    return "@" in key or (any(ch.isdigit() for ch in key) and any(ch.isalpha() for ch in key))


def _is_low_entropy(unit: ArgUnit) -> bool:
    """A value many records share by chance: one word or code without a digit (``one_way``,
    ``economy``, ``JFK``) or a calendar date."""
    key = unit.key
    if " " in key:
        return False
    return not any(ch.isdigit() for ch in key) or _ISO_DAY.fullmatch(key) is not None


_REPLY_CLASS = frozenset({"user"})


def _kind_class(kinds: set[str]) -> frozenset[str]:
    """How a source supplies a unit, coarsely: ``user`` (elicited reply) and/or ``tool`` (a result that
    is not an echo of the source's own argument, or the source introduced the value). Echoes count
    as neither: a tool that returns its own argument is not an independent source."""
    out = set()
    if _REPLY in kinds:
        out.add("user")
    if kinds & {_TOOL, _ORIGIN}:
        out.add("tool")
    return frozenset(out)


def _is_read_tool(name: str) -> bool:
    head = name.lower().replace("-", "_").split("_", 1)[0]
    return head in READ_VERBS


def _is_write_tool(name: str) -> bool:
    """A call that changes something for the user (not a read, not the agent's own scratch tools)."""
    return not _is_read_tool(name) and name.lower() not in _SCRATCH_TOOLS


_SCRATCH_TOOLS = frozenset({"think", "calculate", "calculator", "compute"})
_ASKS_TO_CHOOSE = re.compile(
    r"\?|\b(which|choose|select|pick|prefer|let me know|would you like|do you want|please (tell|confirm|specify))\b",
    re.IGNORECASE,
)
_OPEN_OPTION = re.compile(r"^\W*(something|anything) else\b|^\W*(an)?other\b|^\W*else\b|^\W*etc\b", re.IGNORECASE)
_EXAMPLE_LEAD = re.compile(r"\b(for example|for instance|e\.g\.|such as)[^.?!]*\bor\b[^.?!]*\?", re.IGNORECASE)
_CHOICE_WORDS = re.compile(
    r"\b(i'?ll (take|go with)|i'?d (prefer|go with)|i (choose|pick|prefer) |let'?s go with|"
    r"option|the one (with|for|that)|go with)\b",
    re.IGNORECASE,
)


def _content_atoms(text: str) -> list[str]:
    """Atoms that can tell options apart: no stopwords, no one-character atoms, no small integers."""
    out = []
    for atom in atomize(text):
        if atom in STOPWORDS or (len(atom) < 2 and not atom.isdigit()):
            continue
        if atom.isdigit() and len(atom) == 1:
            continue
        out.append(atom)
    return out


def _distinctive(option_atoms: list[list[str]], index: int) -> set[str]:
    """Atoms of option ``index`` that no other option has."""
    others: set[str] = set()
    for k, atoms in enumerate(option_atoms):
        if k != index:
            others.update(atoms)
    return set(option_atoms[index]) - others


def _records(value: Any, parent_key: str | None) -> list[tuple[int, frozenset[str], frozenset[str]]]:
    """``(size, tokens, ids)`` for every JSON object in ``value`` (tokens: atoms of its keys and leaves).

    ``ids``: the key it sits under when that key holds a digit, plus its ``*id`` fields' values.
    """
    out: list[tuple[int, frozenset[str], frozenset[str]]] = []
    _walk_records(value, parent_key, out)
    return out


def _walk_records(
    value: Any, parent_key: str | None, out: list[tuple[int, frozenset[str], frozenset[str]]]
) -> set[str]:
    """Append the records of ``value`` to ``out`` (children before their parent, in order); return the
    atoms of ``value``'s keys and leaves (one pass: a nested object's atoms are its record's tokens)."""
    if isinstance(value, dict):
        tokens: set[str] = set()
        ids: set[str] = set()
        if parent_key is not None and any(ch.isdigit() for ch in parent_key):
            ids.update(_key_atoms(parent_key))
        for key, item in value.items():
            name = str(key)
            tokens.update(_key_atoms(name))
            if isinstance(item, dict | list):
                tokens |= _walk_records(item, name, out)
            elif item is not None:
                leaf = atomize(str(item))
                tokens.update(leaf)
                if leaf and name.lower().endswith("id"):
                    ids.update(leaf)
        out.append((len(tokens), frozenset(tokens), frozenset(ids)))
        return tokens
    if isinstance(value, list):
        atoms: set[str] = set()
        for item in value:
            atoms |= _walk_records(item, None, out)
        return atoms
    return set(atomize(str(value))) if value is not None else set()


@functools.lru_cache(maxsize=4096)
def _key_atoms(key: str) -> tuple[str, ...]:
    """``atomize`` of a JSON field name (the same few names repeat in every record of a result)."""
    return tuple(atomize(key))


def _leaf_strings(value: Any, out: list[str]) -> None:
    """The leaf values of a JSON value, as text, in order (no keys)."""
    if isinstance(value, dict):
        for item in value.values():
            _leaf_strings(item, out)
    elif isinstance(value, list):
        for item in value:
            _leaf_strings(item, out)
    elif value is not None:
        out.append(str(value))


def _tool_schemas(tools: Any) -> dict[str, Any]:
    """``{name: parameters schema}`` from OpenAI tool specs (``{"type": "function", "function": ...}``
    or bare function objects); ``"__raw__"`` keeps the list for constant look-ups. Malformed -> {}."""
    if not isinstance(tools, list | tuple) or not tools:
        return {}
    schemas: dict[str, Any] = {}
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters")
        schemas[function["name"]] = parameters if isinstance(parameters, Mapping) else {}
    if schemas:
        schemas["__raw__"] = list(tools)
    return schemas


def _dedupe_reasons(reasons: list[str]) -> list[str]:
    return list(dict.fromkeys(reasons))


def trace_rules(trajectory: Trajectory, *, tools: Sequence[Mapping[str, Any]] | None = None) -> RuleTrace:
    """Run the rules on one trajectory; the raw graph and the uncertainty reasons. May raise on
    content the rules do not handle -- :func:`annotate_rules` is the never-raising entry point."""
    return _Tracer(trajectory, tools).run()


def uncertainty_reasons(trajectory: Trajectory, *, tools: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
    """Why the rules flag ``trajectory`` uncertain (``[]`` when they do not); never raises: should the
    rules fail on it, the one reason is ``U7 exception: ...``."""
    try:
        return trace_rules(trajectory, tools=tools).uncertain_reasons
    except Exception as exc:  # the contract is "never raise on odd content"
        return [f"U7 exception: rules failed: {type(exc).__name__}: {exc}"]


def reason_label(reason: str) -> str:
    """The criterion of an uncertainty reason: ``"U4 unconsumed reply: user message 3 ..."`` ->
    ``"U4 unconsumed reply"``."""
    return reason.split(":", 1)[0].strip()


def annotate_rules(
    trajectory: Trajectory, *, tools: Sequence[Mapping[str, Any]] | None = None
) -> tuple[InfluenceGraph, GraphValidation, bool]:
    """``(graph, validation, uncertain)`` for one trajectory; never raises.

    The rules' graph goes through :func:`validate_graph`. Should the rules fail on odd content,
    the result is the uniform graph with ``validation.fallback = True``, the exception in
    ``validation.problems`` and ``uncertain = True`` (U7).
    """
    num_actions = len(getattr(trajectory, "actions", []) or [])
    try:
        trace = trace_rules(trajectory, tools=tools)
    except Exception as exc:  # the contract is "never raise on odd content"
        logger.warning("rule annotator failed on trajectory %r: %r", getattr(trajectory, "id", "?"), exc)
        validation = GraphValidation(fallback=True)
        validation.note(f"U7 exception: rules failed: {type(exc).__name__}: {exc}")
        return InfluenceGraph.uniform(num_actions), validation, True
    graph, validation = validate_graph(trace.raw_graph, num_actions)
    return graph, validation, trace.uncertain or validation.fallback


@register_annotator("rules")
class RuleAnnotator(Annotator):
    """Deterministic rule annotator (no model). See the module docstring for the exact rules.

    Args:
        tools: OpenAI tool specs used for schema checks (unknown tool, missing required argument)
            and as constants (enum values); a record's own ``tools`` field is used when this is None.
        concurrency: limit for :meth:`annotate_batch` (the rules are CPU-bound and fast).
    """

    version = RULES_VERSION

    def __init__(self, *, tools: Sequence[Mapping[str, Any]] | None = None, concurrency: int = 16) -> None:
        self.tools = list(tools) if tools is not None else None
        self.concurrency = concurrency
        self.failures = 0  # trajectories on which the rules raised and fell back to uniform

    async def annotate_one(self, trajectory: Trajectory) -> AnnotationResult:
        # CPU-bound (tens of ms on a long transcript): a worker thread, so an event loop that
        # serves other sessions (verl's rollout worker) keeps serving them meanwhile.
        graph, validation, uncertain = await asyncio.to_thread(annotate_rules, trajectory, tools=self.tools)
        if validation.fallback and any(p.startswith("U7 exception") for p in validation.problems):
            self.failures += 1
            return AnnotationResult(graph, validation, "fallback:uniform", uncertain=True, error=validation.problems[0])
        return AnnotationResult(graph, validation, "rules", uncertain=uncertain)
