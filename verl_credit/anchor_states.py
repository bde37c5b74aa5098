"""Anchor states of actions (GiGPO's ``state_i``) and the group ids the baselines reduce over.

``prefix``: the canonical JSON of the whole message prefix before the action (exact match),
``last_observation``: only the messages since the previous action (a coarser key). Equal states of
the same ``uid`` form one anchor group. A state is kept as a SHA-256 chain over the canonical JSON
of the messages (equal digests: equal prefixes), so a trajectory of ``n`` messages costs ``O(n)``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from verl_credit.trajectory import Trajectory

__all__ = ["ANCHOR_STATES", "anchor_group_ids", "anchor_states", "turn_group_ids"]

ANCHOR_STATES: tuple[str, ...] = ("prefix", "last_observation")


def _canonical(message: Any) -> bytes:
    return json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def anchor_states(trajectory: Trajectory, mode: str = "prefix") -> list[str]:
    """One state digest per action of ``trajectory``."""
    if mode not in ANCHOR_STATES:
        raise ValueError(f"anchor state must be one of {ANCHOR_STATES}, got {mode!r}")
    starts = {action.message_index: action.index for action in trajectory.actions}
    states: list[str] = []
    chain = hashlib.sha256()
    since_action = hashlib.sha256()
    for position, message in enumerate(trajectory.messages):
        if position in starts:
            states.append((chain if mode == "prefix" else since_action).copy().hexdigest())
            since_action = hashlib.sha256()
        line = _canonical(message) + b"\n"
        chain.update(line)
        if position not in starts:
            since_action.update(line)
    return states


def anchor_group_ids(uids: Sequence[Hashable], states: Sequence[Sequence[str]], width: int) -> torch.Tensor:
    """``(B, width)`` int64 ids, equal for actions of the same uid with the same state; -1 on padding.

    Uids are compared as GRPO's grouping compares them (as dictionary keys)."""
    ids = torch.full((len(states), width), -1, dtype=torch.long)
    numbers: dict[tuple[Hashable, str], int] = {}
    for row, (uid, row_states) in enumerate(zip(uids, states, strict=True)):
        for column, state in enumerate(row_states[:width]):
            ids[row, column] = numbers.setdefault((uid, state), len(numbers))
    return ids


def turn_group_ids(uids: Sequence[Hashable], num_actions: torch.Tensor, width: int) -> torch.Tensor:
    """``(B, width)`` int64 ids, equal for the i-th action of trajectories of the same uid."""
    numbers: dict[Hashable, int] = {}
    group = torch.tensor([numbers.setdefault(uid, len(numbers)) for uid in uids], dtype=torch.long)
    column = torch.arange(width).unsqueeze(0)
    ids = group.unsqueeze(1) * width + column
    return torch.where(column < num_actions.unsqueeze(1), ids, torch.full_like(ids, -1))
