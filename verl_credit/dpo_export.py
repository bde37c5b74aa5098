"""DPO pairs from counterfactual replays (docs/design.md section 4, "Curation exports").

One JSONL line per replayed AE call with ``|Delta| > theta_ae``::

    {"id": "t17", "uid": "task-3", "call_index": 4, "delta": 1.0,
     "context": [...messages before the call...],
     "original": {...the assistant message as generated...},
     "counterfactual": {...the same message with the alternative tool-call arguments...},
     "chosen": "original" | "counterfactual", "reward": 1.0, "counterfactual_reward": 0.0,
     "source": "remove", "step": 12}

(``step``: the training step, when the trainer exports; ``source``: the proposer of the alternative.)
The trainer appends each step's pairs (``credit.call_credit.dpo_export.path``) with
:func:`append_dpo_pairs`; :func:`write_dpo_pairs` writes a whole file.

``Delta = R(tau) - R(tau')``: a positive Delta means the original edit was better (chosen =
original); a negative one that the alternative was (chosen = counterfactual). A dropped call
(alternative ``arguments is None``) becomes an assistant message without that tool call.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_credit.counterfactual_replay import CounterfactualResult
from verl_credit.io import write_jsonl
from verl_credit.trajectory import Trajectory

__all__ = ["append_dpo_pairs", "build_dpo_pairs", "counterfactual_message", "write_dpo_pairs"]


def counterfactual_message(message: dict[str, Any], arguments: Any, tool_call_index: int = 0) -> dict[str, Any]:
    """``message`` with tool call ``tool_call_index``'s arguments replaced (``None``: call removed)."""
    changed = copy.deepcopy(message)
    calls = list(changed.get("tool_calls") or [])
    if not 0 <= tool_call_index < len(calls):
        raise ValueError(f"message has no tool call #{tool_call_index}")
    if arguments is None:
        del calls[tool_call_index]
    else:
        function = calls[tool_call_index].setdefault("function", {})
        function["arguments"] = json.dumps(dict(arguments), ensure_ascii=False)
    changed["tool_calls"] = calls or None
    return changed


def build_dpo_pairs(
    trajectories: Sequence[Trajectory | None],
    results: Sequence[CounterfactualResult],
    theta_ae: float = 0.0,
    step: int | None = None,
) -> list[dict[str, Any]]:
    """DPO records for the replay ``results`` (``result.row`` indexes ``trajectories``); ``step``
    (the training step) is added to every record when given."""
    if theta_ae < 0:
        raise ValueError(f"theta_ae must be >= 0, got {theta_ae}")
    pairs = []
    for result in results:
        if abs(result.delta) <= theta_ae:
            continue
        trajectory = trajectories[result.row]
        if trajectory is None or trajectory.id != result.trajectory_id:
            found = None if trajectory is None else trajectory.id
            raise ValueError(f"result for {result.trajectory_id!r} points at row {result.row} ({found!r})")
        action = trajectory.actions[result.call_index]
        original = trajectory.messages[action.message_index]
        record = {
            "id": trajectory.id,
            "uid": trajectory.uid,
            "call_index": result.call_index,
            "delta": result.delta,
            "context": copy.deepcopy(trajectory.messages[: action.message_index]),
            "original": copy.deepcopy(original),
            "counterfactual": counterfactual_message(original, result.alternative.arguments),
            "chosen": "original" if result.delta > 0 else "counterfactual",
            "reward": result.reward,
            "counterfactual_reward": result.counterfactual_reward,
            "source": result.alternative.source,
        }
        if step is not None:
            record["step"] = step
        pairs.append(record)
    return pairs


def write_dpo_pairs(path: str | Path, pairs: Sequence[dict[str, Any]]) -> int:
    """Write the pairs as JSONL; returns the number written."""
    return write_jsonl(path, pairs)


def append_dpo_pairs(path: str | Path, pairs: Sequence[dict[str, Any]]) -> int:
    """Append the pairs to a JSONL file (created with its folder if missing); returns the number
    appended. One ``write`` of whole lines, flushed and fsynced, so a crash leaves whole lines."""
    if not pairs:
        return 0
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(pair, ensure_ascii=False) + "\n" for pair in pairs)
    with open(target, "a", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    return len(pairs)
