"""Where the credit went in a real training run: per-step diagnostics from the trainer's dumps.

Reads the per-step dumps a run wrote (``credit.debug.dump_dir``; format in
:mod:`verl_credit.verl.credit_dump`) and, per step, sums each action's token advantages
(``A_i * L_i``, the advantage mass the actor's loss sees for that action) from the rows' exact spans:

* ``credit_precision``: over the step's successful service-world sessions, the share of positive
  advantage mass on ground-truth causal actions (:func:`verl_credit.envs.service.causal.causal_actions`);
  ``causal_token_share`` is the share of those sessions' action tokens that are causal -- what flat
  GRPO credit scores by construction, the baseline to read the precision against;
* ``tool_call_mass_share``: the share of absolute advantage mass on actions that call a tool (the
  rest is text to the customer);
* ``nonzero_token_share``: the share of trainable tokens with a non-zero advantage.

Only the dumps' plain values are read (transcripts, spans, tensors): no verl import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from verl_credit.envs.service.causal import causal_actions

__all__ = ["run_dump_diagnostics", "step_diagnostics"]


def _sessions(record: Mapping[str, Any]) -> dict[str, list[int]]:
    """Training rows by session (``{uid}_{session}`` of the ``{uid}_{session}_{index}`` key)."""
    sessions: dict[str, list[int]] = {}
    for row, (key, tag) in enumerate(zip(record["keys"], record["tags"], strict=True)):
        if tag.get("is_padding"):
            continue
        sessions.setdefault(str(key).rsplit("_", 1)[0], []).append(row)
    return sessions


def step_diagnostics(record: Mapping[str, Any]) -> dict[str, float]:
    """The diagnostics of one dumped step (see the module doc); ``nan`` where undefined."""
    advantages = record["trainer_advantages"].double()
    rewards = record["token_level_rewards"].double().sum(-1)
    mask = record["response_mask"].bool()
    positive_mass = causal_mass = causal_tokens = action_tokens = 0.0
    absolute_mass = tool_mass = 0.0
    for rows in _sessions(record).values():
        payloads = [record["payloads"][row] or {} for row in rows]
        final = next((p for p in payloads if p.get("final")), payloads[-1])
        messages = final.get("messages") or []
        assistant = [m for m in messages if m.get("role") == "assistant"]
        mass: dict[int, float] = {}
        length: dict[int, int] = {}
        for row, payload in zip(rows, payloads, strict=True):
            for action, start, end in payload.get("spans") or []:
                mass[int(action)] = mass.get(int(action), 0.0) + float(advantages[row, start:end].sum())
                length[int(action)] = length.get(int(action), 0) + int(end - start)
        for action, value in mass.items():
            absolute_mass += abs(value)
            if action < len(assistant) and assistant[action].get("tool_calls"):
                tool_mass += abs(value)
        reward = float(rewards[max(rows)])
        if reward <= 0 or final.get("env") != "service" or not assistant:
            continue
        flags = causal_actions(messages, reward)
        for action, value in mass.items():
            is_causal = action < len(flags) and flags[action]
            action_tokens += length[action]
            causal_tokens += length[action] if is_causal else 0
            if value > 0:
                positive_mass += value
                causal_mass += value if is_causal else 0.0
    trainable = float(mask.sum())
    return {
        "credit_precision": causal_mass / positive_mass if positive_mass > 0 else math.nan,
        "causal_token_share": causal_tokens / action_tokens if action_tokens > 0 else math.nan,
        "tool_call_mass_share": tool_mass / absolute_mass if absolute_mass > 0 else math.nan,
        "nonzero_token_share": float(((advantages != 0) & mask).sum()) / trainable if trainable else math.nan,
    }


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def run_dump_diagnostics(dump_dir: str | Path) -> dict[str, Any]:
    """Per-step diagnostics of every dump in ``dump_dir`` and their means over the run."""
    from verl_credit.verl.credit_dump import read_step_dumps

    per_step = {step: step_diagnostics(record) for step, record in read_step_dumps(str(dump_dir))}
    names = ("credit_precision", "causal_token_share", "tool_call_mass_share", "nonzero_token_share")
    out: dict[str, Any] = {name: _mean([values[name] for values in per_step.values()]) for name in names}
    out["per_step"] = {str(step): values for step, values in sorted(per_step.items())}
    return out
