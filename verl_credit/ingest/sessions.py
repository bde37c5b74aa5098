"""Model calls -> sessions -> trajectories (DESIGN.md section 8) with per-call token accounting.

1. **Failed attempts** (error status, no response) are dropped.
2. **Partition** by session id; calls without one share one partition.
3. **Retries**: calls of a partition with the same request are one request. Identical responses are
   duplicates. Of different responses, the ones *continued* by a later request (whose messages
   start with this request + this response) are kept -- several continued ones are genuine
   branches (e.g. the N rollouts of a GRPO group logged without session ids); when none is
   continued, the last one is kept (what the client used after retrying).
4. **Chains by prefix continuity**: a call's parent is the kept call whose request + response is
   the longest prefix of its request. Every leaf of the resulting forest is one trajectory:
   the leaf's request + response, with each call's generated response at its position.
5. **Tokens**: ``action_token_lengths`` = each call's completion tokens (0 for assistant messages
   no logged call generated, e.g. injected history); ``token_accounting.per_request`` = sum over
   calls of prompt + completion tokens (one training row per request), ``prefix_merged`` = the
   leaf's prompt + completion tokens (one merged row).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from verl_credit.ingest.model_call import ModelCall, canonical_message
from verl_credit.ingest.records import RewardRecord

__all__ = ["IngestStats", "build_trajectories"]


@dataclass
class IngestStats:
    """Counts of one ingestion (printed by ``verl-credit ingest``)."""

    records: int = 0
    calls: int = 0
    reward_records: int = 0
    failed_attempts: int = 0
    retries_dropped: int = 0
    duplicates_dropped: int = 0
    streamed_calls: int = 0
    usage_token_calls: int = 0
    whitespace_token_calls: int = 0
    sessions: int = 0
    trajectories: int = 0
    branched_sessions: int = 0
    missing_rewards: int = 0
    orphan_rewards: int = 0
    unlogged_assistant_messages: int = 0
    per_request_tokens: int = 0
    prefix_merged_tokens: int = 0

    def to_json(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def summary(self) -> str:
        return (
            f"{self.records} records: {self.calls} calls ({self.streamed_calls} streamed), "
            f"{self.failed_attempts} failed attempts, {self.retries_dropped} retries and "
            f"{self.duplicates_dropped} duplicates dropped; {self.sessions} sessions -> {self.trajectories} "
            f"trajectories ({self.branched_sessions} branched, {self.missing_rewards} without reward); tokens: "
            f"per_request {self.per_request_tokens}, prefix_merged {self.prefix_merged_tokens} "
            f"({self.usage_token_calls} calls counted from usage, {self.whitespace_token_calls} by whitespace)"
        )


@dataclass
class _Node:
    call: ModelCall
    prefix_hashes: list[str]  # hash of the first k request messages, k = 0..len
    continuation: str  # hash of request + response
    attempts: int = 1
    parent: _Node | None = None
    children: list[_Node] = field(default_factory=list)


def _step(previous: str, message: dict[str, Any] | None) -> str:
    return hashlib.sha256((previous + "\x00" + canonical_message(message)).encode("utf-8")).hexdigest()


def _node(call: ModelCall) -> _Node:
    hashes = [hashlib.sha256(b"").hexdigest()]
    for message in call.request_messages:
        hashes.append(_step(hashes[-1], message))
    return _Node(call, hashes, _step(hashes[-1], call.response))


def _dedupe(nodes: list[_Node], stats: IngestStats) -> list[_Node]:
    """Step 3: one node per distinct request, except genuine continued branches."""
    prefixes = {h for node in nodes for h in node.prefix_hashes[1:]}
    by_request: dict[str, list[_Node]] = defaultdict(list)
    for node in nodes:
        by_request[node.prefix_hashes[-1]].append(node)
    kept = []
    for group in by_request.values():
        distinct: dict[str, _Node] = {}
        for node in group:  # in log order: the last copy of a response wins
            if node.continuation in distinct:
                stats.duplicates_dropped += 1
            distinct[node.continuation] = node
        continued = [n for n in distinct.values() if n.continuation in prefixes]
        survivors = continued or [max(distinct.values(), key=lambda n: (n.call.order, n.call.line))]
        stats.retries_dropped += len(distinct) - len(survivors)
        kept.extend(survivors)
    return sorted(kept, key=lambda n: (n.call.order, n.call.line))


def _link(nodes: list[_Node]) -> None:
    """Step 4: parent = the node whose request + response is the longest prefix of this request."""
    by_continuation = {node.continuation: node for node in nodes}
    for node in nodes:
        for k in range(len(node.prefix_hashes) - 1, 0, -1):
            parent = by_continuation.get(node.prefix_hashes[k])
            if parent is not None and parent is not node:
                node.parent = parent
                parent.children.append(node)
                break


def _path(leaf: _Node) -> list[_Node]:
    path = []
    node: _Node | None = leaf
    while node is not None:
        path.append(node)
        node = node.parent
    return path[::-1]


def _trajectory(
    path: list[_Node], trajectory_id: str, session_id: str | None, reward: RewardRecord | None, stats: IngestStats
) -> dict[str, Any]:
    leaf = path[-1].call
    assert leaf.response is not None
    messages = [dict(m) for m in leaf.request_messages] + [dict(leaf.response)]
    produced = {}
    for node in path:
        position = len(node.call.request_messages)
        messages[position] = dict(node.call.response or {})  # the generated version of the message
        produced[position] = node
    lengths, calls = [], []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        node = produced.get(index)
        if node is None:
            lengths.append(0)
            stats.unlogged_assistant_messages += 1
            continue
        call = node.call
        lengths.append(call.completion_tokens)
        calls.append(
            {
                "call": len(calls),
                "message_index": index,
                "line": call.line,
                "request_id": call.request_id,
                "prompt_tokens": call.prompt_tokens,
                "completion_tokens": call.completion_tokens,
                "token_source": call.token_source,
                "streamed": call.streamed,
                "attempts": node.attempts,
            }
        )
    per_request = sum(c["prompt_tokens"] + c["completion_tokens"] for c in calls)
    merged = leaf.prompt_tokens + leaf.completion_tokens
    stats.per_request_tokens += per_request
    stats.prefix_merged_tokens += merged
    rewards = [n.call.reward for n in path if n.call.reward is not None]
    value = reward.reward if reward is not None else (rewards[-1] if rewards else None)
    if value is None:
        stats.missing_rewards += 1
    uids = [n.call.uid for n in path if n.call.uid]
    uid = (reward.uid if reward is not None and reward.uid else None) or (uids[-1] if uids else None)
    return {
        "id": trajectory_id,
        "uid": uid or session_id or trajectory_id,
        "reward": 0.0 if value is None else value,
        "messages": messages,
        "action_token_lengths": lengths,
        "graph": None,
        "session_id": session_id,
        "reward_known": value is not None,
        "tools": leaf.tools,
        "calls": calls,
        "token_accounting": {
            "per_request": per_request,
            "prefix_merged": merged,
            "completion_tokens": sum(c["completion_tokens"] for c in calls),
            "prompt_tokens_per_request": sum(c["prompt_tokens"] for c in calls),
        },
    }


def build_trajectories(
    calls: Sequence[ModelCall], rewards: Sequence[RewardRecord], stats: IngestStats | None = None
) -> tuple[list[dict[str, Any]], IngestStats]:
    """Rollout records (section 8 plus ``session_id``/``calls``/``token_accounting``) and counts."""
    stats = stats or IngestStats()
    reward_of = {r.session_id: r for r in rewards}
    partitions: dict[str | None, list[_Node]] = defaultdict(list)
    attempts: dict[tuple[str | None, str], int] = defaultdict(int)  # times each request was sent
    for call in calls:
        attempts[(call.session_id, call.request_key())] += 1
        if not call.ok:
            stats.failed_attempts += 1
            continue
        partitions[call.session_id].append(_node(call))
    for session_id, nodes in partitions.items():
        for node in nodes:
            node.attempts = attempts[(session_id, node.call.request_key())]
    seen_sessions = set()
    out: list[tuple[tuple[float, int], dict[str, Any]]] = []
    anonymous = 0
    for session_id, nodes in partitions.items():
        kept = _dedupe(nodes, stats)
        _link(kept)
        roots = [n for n in kept if n.parent is None]
        if session_id is not None:
            seen_sessions.add(session_id)
            leaves = [n for n in kept if not n.children]
            stats.sessions += 1
            stats.branched_sessions += int(len(leaves) > 1)
            for k, leaf in enumerate(leaves, start=1):
                path = _path(leaf)
                trajectory_id = session_id if len(leaves) == 1 else f"{session_id}#{k}"
                record = _trajectory(path, trajectory_id, session_id, reward_of.get(session_id), stats)
                out.append(((path[0].call.order, path[0].call.line), record))
            continue
        for root in roots:  # without ids every tree is its own session
            anonymous += 1
            stats.sessions += 1
            stack, leaves = [root], []
            while stack:
                node = stack.pop()
                leaves.extend([node] if not node.children else [])
                stack.extend(reversed(node.children))
            stats.branched_sessions += int(len(leaves) > 1)
            for k, leaf in enumerate(leaves, start=1):
                base = f"session-{anonymous}"
                trajectory_id = base if len(leaves) == 1 else f"{base}#{k}"
                out.append(
                    ((root.call.order, root.call.line), _trajectory(_path(leaf), trajectory_id, None, None, stats))
                )
    stats.orphan_rewards = len(set(reward_of) - seen_sessions)
    out.sort(key=lambda item: item[0])
    records = [record for _, record in out]
    stats.trajectories = len(records)
    return records, stats
