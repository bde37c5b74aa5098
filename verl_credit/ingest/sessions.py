"""Model calls -> sessions -> trajectories (docs/design.md section 8) with per-call token accounting.

1. **Failed attempts** (error status, error inside the stream or body, no or unparseable
   response) are dropped and counted; flagged calls (e.g. tool arguments cut off by
   ``max_tokens``, kept raw) stay.
2. **Partition** by session id; calls without one share one partition.
3. **Duplicates**: the same request and reply logged twice with the same identity (model,
   response id, timestamp) is one call. Equal content with another identity is a separate
   generation (identical GRPO rollouts), never merged.
4. **Chains by prefix continuity**: a call's parent is a call whose request + response is the
   longest prefix of its request (assistant messages compared without reasoning text). When the
   client re-sent the reply in another shape, the parent is found by the reply's tool-call ids,
   which reappear in the later request. Of several equal candidate parents (identical rollouts)
   the one with the fewest children so far is taken, so each rollout keeps its own chain.
5. **Retries**: sibling calls (same parent, same request) are one request sent again. The ones
   *continued* by a later call are kept -- several continued ones are genuine branches (e.g. the
   N rollouts of a GRPO group logged without session ids); when none is continued, the last one
   is kept (what the client used after retrying), preferring one that is not flagged. A flagged
   leaf whose parent was continued along another child (the client moved on from a cut-off
   reply) is dropped too, counted. Every leaf of the resulting forest is one
   trajectory: the leaf's request + response, with each call's generated response at its position.
6. **Tokens**: ``action_token_lengths`` = each call's completion tokens (0 for assistant messages
   no logged call generated, e.g. injected history); ``token_accounting.per_request`` = sum over
   calls of prompt + completion tokens (one training row per request), ``prefix_merged`` = the
   leaf's prompt + completion tokens (one merged row).

Memory: a session of n calls re-sends O(n^2) messages. The reader holds each distinct message
once (:mod:`verl_credit.ingest.interning`), each message is hashed once (:class:`_Digests`: by
object), the prefix hashes of a request are computed when its parent is looked up and dropped
after, and :func:`iter_trajectories` builds one trajectory record at a time, in output order --
so what is held grows with the distinct content plus one pointer per logged message, never with
the re-sent text.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from verl_credit.ingest.log_lines import RewardRecord
from verl_credit.ingest.model_call import ModelCall, canonical_message, loose_canonical_message

__all__ = ["IngestStats", "build_trajectories", "iter_trajectories"]


@dataclass
class IngestStats:
    """Counts of one ingestion (printed by ``verl-credit ingest``).

    ``failed_attempts`` = ``http_failures`` (error status or error field on the log line, no
    response logged) + ``api_errors`` (an error inside an HTTP-200 body or stream) +
    ``unparseable_calls``. ``issues`` holds one ``"LINE: field '...': why"`` per API error,
    unparseable or flagged call.
    """

    records: int = 0
    calls: int = 0
    reward_records: int = 0
    parsed_calls: int = 0
    flagged_calls: int = 0
    failed_attempts: int = 0
    http_failures: int = 0
    api_errors: int = 0
    unparseable_calls: int = 0
    retries_dropped: int = 0
    duplicates_dropped: int = 0
    abandoned_flagged_dropped: int = 0
    streamed_calls: int = 0
    usage_token_calls: int = 0
    whitespace_token_calls: int = 0
    server_tool_calls: int = 0
    tool_id_links: int = 0
    sessions: int = 0
    trajectories: int = 0
    branched_sessions: int = 0
    missing_rewards: int = 0
    orphan_rewards: int = 0
    unlogged_assistant_messages: int = 0
    per_request_tokens: int = 0
    prefix_merged_tokens: int = 0
    issues: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def summary_line(self, log: str) -> str:
        """The one line per log: calls parsed, failed attempts, flagged calls, sessions."""
        return (
            f"{log}: {self.parsed_calls} calls parsed, {self.failed_attempts} failed attempts "
            f"({self.api_errors} API errors, {self.unparseable_calls} unparseable), {self.flagged_calls} flagged "
            f"calls, {self.sessions} sessions -> {self.trajectories} trajectories"
        )

    def summary(self) -> str:
        return (
            f"{self.records} records: {self.calls} calls ({self.streamed_calls} streamed), "
            f"{self.failed_attempts} failed attempts, {self.retries_dropped} retries and "
            f"{self.duplicates_dropped} duplicates dropped, {self.abandoned_flagged_dropped} abandoned flagged "
            f"calls dropped; {self.sessions} sessions -> {self.trajectories} "
            f"trajectories ({self.branched_sessions} branched, {self.missing_rewards} without reward); tokens: "
            f"per_request {self.per_request_tokens}, prefix_merged {self.prefix_merged_tokens} "
            f"({self.usage_token_calls} calls counted from usage, {self.whitespace_token_calls} by whitespace)"
        )


class _Digests:
    """``sha256`` of :func:`canonical_message` (``strict``) and :func:`loose_canonical_message`
    (``loose``) of each message object, computed once: the reader hands the same (interned)
    objects back with every call that re-sends them. Each digested message is kept referenced
    here, so its ``id`` is never reused while the cache lives."""

    def __init__(self) -> None:
        self._strict: dict[int, tuple[Any, bytes]] = {}
        self._loose: dict[int, tuple[Any, bytes]] = {}

    def strict(self, message: dict[str, Any] | None) -> bytes:
        return self._digest(message, self._strict, canonical_message)

    def loose(self, message: dict[str, Any] | None) -> bytes:
        return self._digest(message, self._loose, loose_canonical_message)

    @staticmethod
    def _digest(
        message: dict[str, Any] | None,
        cache: dict[int, tuple[Any, bytes]],
        canonical: Callable[[dict[str, Any] | None], str],
    ) -> bytes:
        known = cache.get(id(message))
        if known is not None and known[0] is message:
            return known[1]
        digest = _digest_of(canonical(message))
        cache[id(message)] = (message, digest)
        return digest


_EMPTY_CHAIN = hashlib.sha256(b"").digest()


@dataclass(eq=False)  # nodes are compared by identity: equal content may be distinct calls
class _Node:
    call: ModelCall
    request_hash: bytes  # hash of the request messages (the end of its strict prefix chain)
    continuation: bytes  # hash of request + response
    loose_continuation: bytes  # the same with id-carrying tool-call messages keyed by their ids
    attempts: int = 1
    parent: _Node | None = None
    children: list[_Node] = field(default_factory=list)

    def sort_key(self) -> tuple[float, int]:
        return self.call.order, self.call.line


def _chain(messages: list[dict[str, Any]], digest: Callable[[dict[str, Any] | None], bytes]) -> list[bytes]:
    """Hash of the first k messages, k = 0..len (computed when needed, not kept)."""
    hashes = [_EMPTY_CHAIN]
    for message in messages:
        hashes.append(_step(hashes[-1], digest(message)))
    return hashes


def _chain_end(messages: list[dict[str, Any]], digest: Callable[[dict[str, Any] | None], bytes]) -> bytes:
    value = _EMPTY_CHAIN
    for message in messages:
        value = _step(value, digest(message))
    return value


def _step(previous: bytes, digest: bytes) -> bytes:
    return hashlib.sha256(previous + digest).digest()


def _node(call: ModelCall, digests: _Digests, request_hash: bytes) -> _Node:
    loose = _chain_end(call.request_messages, digests.loose)
    # a response object is hashed once (a later request re-sends an equal copy, not it): not cached
    return _Node(
        call,
        request_hash,
        _step(request_hash, _digest_of(canonical_message(call.response))),
        _step(loose, _digest_of(loose_canonical_message(call.response))),
    )


def _digest_of(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


def _drop_duplicates(nodes: list[_Node], stats: IngestStats) -> list[_Node]:
    """Step 3: one node per (request + reply, identity); the last copy in the log wins."""
    distinct: dict[tuple[str, tuple[Any, ...]], _Node] = {}
    for node in nodes:
        key = (node.continuation, node.call.identity())
        if key in distinct:
            stats.duplicates_dropped += 1
        distinct[key] = node
    return sorted(distinct.values(), key=_Node.sort_key)


def _pick(candidates: list[_Node] | None, child: _Node) -> _Node | None:
    """Of equal-content candidate parents, one that precedes the child and has the fewest
    children so far (identical rollouts: one child each), earliest first."""
    pool = [c for c in candidates or [] if c is not child]
    before = [c for c in pool if c.sort_key() < child.sort_key()]
    pool = before or pool
    return min(pool, key=lambda c: (len(c.children), c.sort_key())) if pool else None


def _link(nodes: list[_Node], stats: IngestStats, digests: _Digests) -> None:
    """Step 4: parent = a node whose request + response is the longest prefix of this request,
    compared by content, else by the tool-call ids of the re-sent reply (unless a provider reused
    those ids for different replies: then they identify none of them)."""
    strict: dict[bytes, list[_Node]] = defaultdict(list)
    loose: dict[bytes, list[_Node]] = defaultdict(list)
    for node in nodes:
        strict[node.continuation].append(node)
        loose[node.loose_continuation].append(node)
    for node in nodes:  # in log order, so that equal candidates are shared out in turn
        prefix_hashes = _chain(node.call.request_messages, digests.strict)
        loose_hashes = _chain(node.call.request_messages, digests.loose)
        for k in range(len(prefix_hashes) - 1, 0, -1):
            parent = _pick(strict.get(prefix_hashes[k]), node)
            by_ids = parent is None
            if by_ids:
                candidates = loose.get(loose_hashes[k])
                if candidates and len({c.continuation for c in candidates if c is not node}) > 1:
                    candidates = None  # a reused tool_call id names several different replies: it links nothing
                parent = _pick(candidates, node)
            if parent is not None:
                node.parent = parent
                parent.children.append(node)
                stats.tool_id_links += int(by_ids)
                break


def _drop_retries(nodes: list[_Node], stats: IngestStats) -> list[_Node]:
    """Step 5: of sibling calls with the same request keep the continued ones, else the last
    (preferring one that is not flagged); then drop flagged leaves whose parent went on elsewhere."""
    siblings: dict[tuple[int, bytes], list[_Node]] = defaultdict(list)
    for node in nodes:
        siblings[(id(node.parent) if node.parent is not None else 0, node.request_hash)].append(node)
    dropped: set[int] = set()
    for group in siblings.values():
        continued = [n for n in group if n.children]
        clean = [n for n in group if not n.call.flags] or group  # a retry that parsed beats a flagged one
        survivors = continued or [max(clean, key=_Node.sort_key)]
        for node in group:
            if node not in survivors:  # childless: removing it orphans nothing
                dropped.add(id(node))
                if node.parent is not None:
                    node.parent.children.remove(node)
        stats.retries_dropped += len(group) - len(survivors)
    for node in nodes:  # a flagged dead end the client moved on from is an attempt, not a branch
        parent = node.parent
        if node.call.flags and not node.children and parent is not None and len(parent.children) > 1:
            dropped.add(id(node))
            parent.children.remove(node)
            stats.abandoned_flagged_dropped += 1
    return [n for n in nodes if id(n) not in dropped]


def _count_call(call: ModelCall, stats: IngestStats) -> None:
    """Step 1 counts; every API error, unparseable or flagged call is also listed in ``issues``."""
    if not call.ok:
        stats.failed_attempts += 1
        if call.failure_kind == "api_error":
            stats.api_errors += 1
        elif call.failure_kind == "unparseable":
            stats.unparseable_calls += 1
        else:
            stats.http_failures += 1
        if call.failure_kind in ("api_error", "unparseable"):
            stats.issues.append(f"{call.line}: {call.failure} (failed attempt)")
        return
    stats.parsed_calls += 1
    stats.server_tool_calls += len((call.response or {}).get("server_tool_calls") or [])
    if call.flags:
        stats.flagged_calls += 1
        stats.issues.extend(f"{call.line}: {flag} (flagged call, kept)" for flag in call.flags)


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
                "flags": list(call.flags),
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
    records, stats = iter_trajectories(calls, rewards, stats)
    return list(records), stats


def iter_trajectories(
    calls: Sequence[ModelCall], rewards: Sequence[RewardRecord], stats: IngestStats | None = None
) -> tuple[Iterator[dict[str, Any]], IngestStats]:
    """Like :func:`build_trajectories`, but the records come one at a time, in output order (each
    is built when it is asked for). ``stats.trajectories`` and every count of steps 1-5 are set
    at once; the token accounting, ``missing_rewards`` and ``unlogged_assistant_messages`` are
    complete once the records are exhausted."""
    stats = stats or IngestStats()
    digests = _Digests()
    reward_of = {r.session_id: r for r in rewards}
    partitions: dict[str | None, list[_Node]] = defaultdict(list)
    sent: dict[tuple[str | None, bytes], int] = defaultdict(int)  # times each request was sent
    for call in calls:
        request_hash = _chain_end(call.request_messages, digests.strict)
        sent[(call.session_id, request_hash)] += 1
        _count_call(call, stats)
        if call.ok:
            partitions[call.session_id].append(_node(call, digests, request_hash))
    seen_sessions = set()
    # (sort key, leaf, trajectory id, session id): each record is built from these when written
    planned: list[tuple[tuple[float, int], _Node, str, str | None]] = []
    anonymous = 0
    for session_id, nodes in partitions.items():
        kept = _drop_duplicates(nodes, stats)
        _link(kept, stats, digests)
        kept = _drop_retries(kept, stats)
        _set_attempts(kept, session_id, sent)
        roots = [n for n in kept if n.parent is None]
        if session_id is not None:
            seen_sessions.add(session_id)
            leaves = [n for n in kept if not n.children]
            stats.sessions += 1
            stats.branched_sessions += int(len(leaves) > 1)
            for k, leaf in enumerate(leaves, start=1):
                first = _root(leaf).call
                trajectory_id = session_id if len(leaves) == 1 else f"{session_id}#{k}"
                planned.append(((first.order, first.line), leaf, trajectory_id, session_id))
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
                planned.append(((root.call.order, root.call.line), leaf, trajectory_id, None))
    stats.orphan_rewards = len(set(reward_of) - seen_sessions)
    planned.sort(key=lambda item: item[0])  # stable: the order the sessions and leaves were found in
    stats.trajectories = len(planned)

    def records() -> Iterator[dict[str, Any]]:
        for _, leaf, trajectory_id, session_id in planned:
            reward = reward_of.get(session_id) if session_id is not None else None
            yield _trajectory(_path(leaf), trajectory_id, session_id, reward, stats)

    return records(), stats


def _root(node: _Node) -> _Node:
    while node.parent is not None:
        node = node.parent
    return node


def _set_attempts(kept: list[_Node], session_id: str | None, sent: dict[tuple[str | None, bytes], int]) -> None:
    """Attempts of a kept call: the times its request was sent, less the other kept calls with
    the same request (branches or identical rollouts are not attempts of each other)."""
    kept_with: dict[bytes, int] = defaultdict(int)
    for node in kept:
        kept_with[node.request_hash] += 1
    for node in kept:
        key = node.request_hash
        node.attempts = max(1, sent[(session_id, key)] - (kept_with[key] - 1))
